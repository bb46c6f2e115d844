package knowledge

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/keel-runtime/keel"
)

// Mode is how Search ranks.
type Mode string

// Search modes.
const (
	// ModeAuto (the zero value) is ModeHybrid when the index has an
	// Embedder, else ModeBM25.
	ModeAuto Mode = ""
	// ModeHybrid fuses the BM25 and the vector rankings by reciprocal
	// rank fusion. Without an Embedder it is ModeBM25.
	ModeHybrid Mode = "hybrid"
	// ModeBM25 ranks by FTS5's BM25 alone.
	ModeBM25 Mode = "bm25"
	// ModeVector ranks by vector similarity alone (cosine); it needs an
	// Embedder (keel.ErrInvalid without).
	ModeVector Mode = "vector"
)

// Limits of Query.Limit.
const (
	DefaultLimit = 8
	MaxLimit     = 100
)

// rrfK is reciprocal rank fusion's constant: a hit's fused score is the
// sum over the rankings of 1/(rrfK + rank).
const rrfK = 60

// Query is a search.
type Query struct {
	Text string
	// Scopes are the scopes the caller may read (policy decides them);
	// required: none is ErrScope.
	Scopes     []Scope
	PathPrefix string    // only sources starting with it
	Type       string    // only documents of this type ("" any)
	Since      time.Time // only documents modified at or after (zero: any)
	Until      time.Time // only documents modified before (zero: any)
	Limit      int       // default DefaultLimit, at most MaxLimit
	Mode       Mode
}

// Hit is a chunk found, with its provenance.
type Hit struct {
	ChunkID, DocID, Source, Type, Heading string
	Scope                                 Scope
	Labels                                []string // the scope's labels
	StartLine, EndLine                    int
	Text                                  string
	// Score is the fused score (RRF) in hybrid mode, the BM25 score
	// (higher is better) in BM25 mode, the cosine in vector mode.
	Score float64
	// BM25Rank and VectorRank are the hit's 1-based ranks in each
	// ranking; 0 when absent from it.
	BM25Rank, VectorRank int

	row  int64  // the chunk's row id
	hash string // of Text: hits are compared by it before their text is read
	// bare: only row and the ranking's fields are set (a vector hit not
	// yet read); finish reads the rest.
	bare bool
}

// Search finds the chunks that best match q within q.Scopes and the
// filters. Words of q.Text are matched as terms (any of them; FTS5
// syntax is not interpreted), stemmed, ranked by BM25 with headings
// weighing twice the text. Hits with the same text (a file copied) are
// returned once. Errors: ErrScope when q names no scope or a malformed
// one; keel.ErrInvalid for ModeVector without an Embedder; the
// Embedder's error in hybrid mode.
func (ix *Index) Search(ctx context.Context, q Query) ([]Hit, error) {
	if len(q.Scopes) == 0 {
		return nil, fmt.Errorf("%w: a search names the scopes it may read", ErrScope)
	}
	for _, s := range q.Scopes {
		if _, err := ParseScope(string(s)); err != nil {
			return nil, err
		}
	}
	limit := q.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	limit = min(limit, MaxLimit)
	mode := q.Mode
	switch mode {
	case ModeAuto, ModeHybrid:
		mode = ModeHybrid
		if ix.o.Embedder == nil {
			mode = ModeBM25
		}
	case ModeBM25:
	case ModeVector:
		if ix.o.Embedder == nil {
			return nil, fmt.Errorf("knowledge: search: vector mode without an embedding model: %w", keel.ErrInvalid)
		}
	default:
		return nil, fmt.Errorf("knowledge: search: mode %q: %w", q.Mode, keel.ErrInvalid)
	}
	f := newFilter(q)
	// The vector side (the query's embedding by the model, then the scan)
	// runs beside the BM25 side; it is always waited for.
	type vecResult struct {
		hits []Hit
		err  error
	}
	var vch chan vecResult
	if mode != ModeBM25 {
		vch = make(chan vecResult, 1)
		go func() {
			hs, err := ix.searchVector(ctx, q.Text, q.Scopes, f, limit*4)
			vch <- vecResult{hs, err}
		}()
	}
	var bm []Hit
	var err error
	if mode != ModeVector {
		n := limit * 4 // candidates for the fusion
		if mode == ModeBM25 {
			n = limit + 2 // room for duplicates
		}
		bm, err = ix.searchBM25(ctx, q.Text, f, n, limit, mode == ModeBM25)
	}
	if mode == ModeBM25 {
		if err != nil {
			return nil, err
		}
		bm = dedupe(bm)
		return bm[:min(len(bm), limit)], nil
	}
	v := <-vch
	if err != nil {
		return nil, err
	}
	if v.err != nil {
		return nil, v.err
	}
	if mode == ModeVector {
		return ix.finish(ctx, v.hits, limit, q.Scopes)
	}
	return ix.finish(ctx, fuse(bm, v.hits), limit, q.Scopes)
}

// fuse merges two rankings by reciprocal rank fusion (by chunk; hits
// with the same text are left for finish to drop).
func fuse(bm, vec []Hit) []Hit {
	byRow := make(map[int64]int, len(bm))
	out := make([]Hit, 0, len(bm)+len(vec))
	for i, h := range bm {
		h.BM25Rank = i + 1
		h.Score = 1.0 / float64(rrfK+i+1)
		byRow[h.row] = len(out)
		out = append(out, h)
	}
	for i, h := range vec {
		s := 1.0 / float64(rrfK+i+1)
		if j, ok := byRow[h.row]; ok {
			out[j].VectorRank = i + 1
			out[j].Score += s
			continue
		}
		h.VectorRank, h.Score = i+1, s
		out = append(out, h)
	}
	slices.SortStableFunc(out, func(a, b Hit) int {
		switch {
		case a.Score > b.Score:
			return -1
		case a.Score < b.Score:
			return 1
		}
		return 0
	})
	return out
}

// dedupe drops hits whose text (by its hash) an earlier hit has.
func dedupe(hs []Hit) []Hit {
	seen := make(map[string]bool, len(hs))
	out := hs[:0]
	for _, h := range hs {
		if seen[h.hash] {
			continue
		}
		seen[h.hash] = true
		out = append(out, h)
	}
	return out
}

// finish returns the best limit of the ranked hits hs, each text once,
// with their text and their scopes' labels: the rankings before carry
// neither (and a vector hit nothing but its chunk), so that only the text
// returned is read. It reads the hits in ranked order, a few more than
// are still wanted at a time (a hit whose text an earlier one has, or
// whose chunk was deleted since the ranking, is passed over), usually in
// one statement. A chunk found outside scopes is passed over too: a bare
// vector hit was filtered by no statement, and a vector set that lagged
// behind the table must not show another scope's text.
func (ix *Index) finish(ctx context.Context, hs []Hit, limit int, scopes []Scope) ([]Hit, error) {
	out := make([]Hit, 0, min(limit, len(hs)))
	seen := make(map[string]bool, limit)
	ids := make([]byte, 0, 16*(limit+finishSlack))
	at := make(map[int64]int, limit+finishSlack)
	found := make([]bool, 0, limit+finishSlack)
	for len(hs) > 0 && len(out) < limit {
		w := hs[:min(len(hs), limit-len(out)+finishSlack)]
		hs = hs[len(w):]
		ids = append(ids[:0], '[')
		clear(at)
		for i, h := range w {
			at[h.row] = i
			if i > 0 {
				ids = append(ids, ',')
			}
			ids = strconv.AppendInt(ids, h.row, 10)
		}
		ids = append(ids, ']')
		found = found[:len(w)]
		clear(found)
		if err := ix.readHits(ctx, ids, w, at, scopes, found); err != nil {
			return nil, err
		}
		for i, h := range w {
			if !found[i] || seen[h.hash] {
				continue
			}
			seen[h.hash] = true
			out = append(out, h)
			if len(out) == limit {
				break
			}
		}
	}
	return out, nil
}

// finishSlack is how many hits past those still wanted finish reads at a
// time, for duplicates to be passed over without a second statement.
const finishSlack = 2

// readHits fills in the hits w[at[row]] of the chunks listed in ids (a
// JSON array of row ids): their text, their scope's labels, and, for a
// bare hit, its chunk's and document's columns; found[i] says w[i]'s
// chunk was read (not deleted since the ranking) and is in one of scopes.
func (ix *Index) readHits(ctx context.Context, ids []byte, w []Hit, at map[int64]int, scopes []Scope, found []bool) error {
	rows, err := ix.query(ctx, `SELECT `+hitColumns+`, c.text, s.labels FROM json_each(?) j
		CROSS JOIN kn_chunks c ON c.id = j.value CROSS JOIN kn_docs d ON d.id = c.doc_id
		LEFT JOIN kn_scopes s ON s.name = d.scope`, string(ids))
	if err != nil {
		return fmt.Errorf("knowledge: search: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var text string
		var labels sql.NullString
		r, err := scanHit(rows, &text, &labels)
		if err != nil {
			return fmt.Errorf("knowledge: search: %w", err)
		}
		i, ok := at[r.row]
		if !ok || !slices.Contains(scopes, r.Scope) {
			continue
		}
		found[i] = true
		h := &w[i]
		if h.bare {
			r.Score, r.BM25Rank, r.VectorRank = h.Score, h.BM25Rank, h.VectorRank
			*h = r
		}
		h.Text, h.Labels = text, splitLabels(labels.String)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("knowledge: search: %w", err)
	}
	return nil
}

// filter is a query's conditions on documents, as SQL over kn_docs d.
type filter struct {
	where string
	args  []any
	// scopesOnly: where names the scopes and nothing else, so every
	// vector of a scope searched passes.
	scopesOnly bool
}

func newFilter(q Query) filter {
	var w []string
	var args []any
	ph := make([]string, len(q.Scopes))
	for i, s := range q.Scopes {
		ph[i] = "?"
		args = append(args, string(s))
	}
	w = append(w, "d.scope IN ("+strings.Join(ph, ",")+")")
	if q.PathPrefix != "" {
		w = append(w, "substr(d.source, 1, ?) = ?")
		args = append(args, len([]rune(q.PathPrefix)), q.PathPrefix)
	}
	if q.Type != "" {
		w = append(w, "d.type = ?")
		args = append(args, q.Type)
	}
	if !q.Since.IsZero() {
		w = append(w, "d.mtime >= ?")
		args = append(args, q.Since.UnixNano())
	}
	if !q.Until.IsZero() {
		w = append(w, "d.mtime < ?")
		args = append(args, q.Until.UnixNano())
	}
	return filter{where: strings.Join(w, " AND "), args: args, scopesOnly: len(w) == 1}
}

// headingWeight is how much a match in a chunk's heading weighs in BM25
// against one in its text (1.0). It is also the index's rank option, set
// when the table is made.
const headingWeight = "2.0"

// hitColumns are the columns scanHit reads, from kn_chunks c and kn_docs
// d: all of a Hit but its text and labels (finish reads those).
const hitColumns = `c.id, c.doc_id, d.source, d.type, c.heading, d.scope, c.start_line, c.end_line, c.hash`

type scanner interface{ Scan(...any) error }

func scanHit(r scanner, extra ...any) (Hit, error) {
	var h Hit
	var cid, did int64
	var scope string
	err := r.Scan(append([]any{&cid, &did, &h.Source, &h.Type, &h.Heading, &scope, &h.StartLine, &h.EndLine, &h.hash}, extra...)...)
	h.ChunkID, h.DocID, h.Scope, h.row = chunkID(cid), docID(did), Scope(scope), cid
	return h, err
}

// matchExpr turns free text into an FTS5 query: its words (letters,
// digits, '_'), each quoted, any of them; English stop words are left out
// unless nothing else is left. "" when there is no word.
func matchExpr(text string) string { return matchTerms(text, " OR ") }

// matchAll is matchExpr with every word required.
func matchAll(text string) string { return matchTerms(text, " AND ") }

func matchTerms(text, op string) string {
	words := strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '_'
	})
	var keep []string
	seen := map[string]bool{}
	for _, w := range words {
		if !stopWords[w] && !seen[w] {
			seen[w] = true
			keep = append(keep, `"`+w+`"`)
		}
	}
	if len(keep) == 0 {
		for _, w := range words {
			if !seen[w] {
				seen[w] = true
				keep = append(keep, `"`+w+`"`)
			}
		}
	}
	return strings.Join(keep, op)
}

var stopWords = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`a about an and are as at be by do does for from how i in is it its of on or
		that the this to was what when where which who why will with you`) {
		stopWords[w] = true
	}
}

// searchBM25 returns the best n matches of text by BM25 that pass f:
// those with every word first, ranked by BM25; when they are fewer than
// want, those with any word follow. (Every word is much the cheaper
// query: FTS5 scores every row that matches, and a common word matches
// much of a large index.)
func (ix *Index) searchBM25(ctx context.Context, text string, f filter, n, want int, withText bool) ([]Hit, error) {
	all, anyWord := matchAll(text), matchExpr(text)
	if anyWord == "" {
		return nil, nil
	}
	hs, err := ix.bm25Page(ctx, all, f, n, withText)
	if err != nil {
		return nil, err
	}
	if len(hs) < want && all != anyWord {
		more, err := ix.bm25Page(ctx, anyWord, f, n, withText)
		if err != nil {
			return nil, err
		}
		seen := make(map[string]bool, len(hs))
		for _, h := range hs {
			seen[h.ChunkID] = true
		}
		for _, h := range more {
			if len(hs) == n {
				break
			}
			if !seen[h.ChunkID] {
				hs = append(hs, h)
			}
		}
	}
	for i := range hs {
		hs[i].BM25Rank = i + 1
	}
	return hs, nil
}

// bm25Page returns the best n matches of the FTS5 expression m that pass
// f, with their text and labels when withText (BM25 mode: the page is
// the answer; hybrid mode reads only the fused top k's text, in finish).
// It is one statement: FTS5 scores every row that matches and SQLite
// keeps the best page (ORDER BY bm25() with a LIMIT, a top-N sort; FTS5's
// own ORDER BY rank would sort every match, through a statement it
// prepares per query), then reads the page's rows and evaluates the
// filter on each (the page's size tells whether FTS5 had more). When the
// filter leaves fewer than n of a full page, the page grows.
func (ix *Index) bm25Page(ctx context.Context, m string, f filter, n int, withText bool) ([]Hit, error) {
	q := `SELECT ` + hitColumns + `, -f.r AS score, (` + f.where + `) AS ok FROM
		(SELECT rowid AS id, bm25(kn_fts, ` + headingWeight + `, 1.0) AS r FROM kn_fts WHERE kn_fts MATCH ? ORDER BY r LIMIT ?) f
		CROSS JOIN kn_chunks c ON c.id = f.id CROSS JOIN kn_docs d ON d.id = c.doc_id`
	if withText {
		// The text and labels of the rows that pass the filter only.
		q = `SELECT g.*, t.text, s.labels FROM (` + q + `) g
			LEFT JOIN kn_chunks t ON g.ok AND t.id = g.id LEFT JOIN kn_scopes s ON g.ok AND s.name = g.scope
			ORDER BY g.score DESC`
	} else {
		q += ` ORDER BY f.r`
	}
	page := n
	for {
		args := append(append([]any{}, f.args...), m, page)
		rows, err := ix.query(ctx, q, args...)
		if err != nil {
			return nil, fmt.Errorf("knowledge: search: %w", err)
		}
		var hs []Hit
		seen := 0
		for rows.Next() {
			var ok bool
			var score float64
			var text, labels sql.NullString
			extra := []any{&score, &ok}
			if withText {
				extra = append(extra, &text, &labels)
			}
			h, err := scanHit(rows, extra...)
			if err != nil {
				rows.Close()
				return nil, fmt.Errorf("knowledge: search: %w", err)
			}
			h.Score, h.Text, h.Labels = score, text.String, splitLabels(labels.String)
			seen++
			if ok && len(hs) < n {
				hs = append(hs, h)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("knowledge: search: %w", err)
		}
		if len(hs) >= n || seen < page || page >= 1<<30 {
			return hs, nil
		}
		page *= 16
	}
}
