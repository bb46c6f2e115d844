// Command knowledge measures keel's knowledge store over the Go standard
// library's source and docs ($(go env GOROOT)/src), in one run on this
// machine, side by side with the peer a Go user would pick instead
// (github.com/blevesearch/bleve/v2, a scorch index on disk) and with raw
// SQLite FTS5 (one FTS5 table, same tokenizer) as the floor:
//
//   - ingest: keel's Add of the whole tree (walk, read, hash, chunk,
//     write); the peers index the very chunks keel made, handed to them in
//     memory, so their time leaves out reading and chunking (keel's does
//     not). All three write in batches of 512 chunks.
//
//   - index size on disk.
//
//   - query latency p50/p99 for the same queries (every word, then any
//     word when that finds fewer than 8; 8 hits with their text) over the
//     whole corpus, measured in turns (timing.MeasureTurns): BM25 in all
//     three (raw FTS5 written two ways: ORDER BY rank, and a top-N sort by
//     bm25() then the text); hybrid in keel
//     (BM25 + the query embedded by the real Ollama + the search of
//     every chunk's vector + reciprocal rank fusion), with its parts: the
//     query's embedding by keel's client and by plain net/http, and
//     keel's part alone (the same search with the query's vector given).
//
//   - ingest with embeddings from the real Ollama: embedding the whole
//     tree with even the tiny model takes long, so keel adds the first
//     files up to -embed-limit chunks with an Embedder, and the whole
//     tree's time is extrapolated from that rate. For hybrid queries over
//     the whole corpus, the chunks not embedded get copies of the real
//     vectors (same model, digest and dimension): the scan costs the
//     same, the ranking is not judged here.
//
//     eval "$(../shared/ollama/start)"; go run ./bench/knowledge [-n 400] [-embed-limit 2000] [-model keel-tiny]
//
// Without OLLAMA_HOST the embedding rows are left out.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/blevesearch/bleve/v2"
	"github.com/blevesearch/bleve/v2/search/query"

	"github.com/keel-runtime/keel/bench/internal/timing"
	"github.com/keel-runtime/keel/knowledge"
)

// queries are what someone asks of the standard library's source.
var queries = []string{
	"parse a URL query string",
	"read a whole file into memory",
	"graceful shutdown of an HTTP server",
	"sort a slice with a custom less function",
	"gzip compress a stream",
	"unmarshal JSON into a struct",
	"TLS client certificate verification",
	"mutex lock starvation mode",
	"base64 URL encoding without padding",
	"parse a duration string",
	"compile a regular expression",
	"context deadline exceeded",
	"sha256 checksum of a file",
	"goroutine preemption signal",
	"garbage collector write barrier",
	"decode a UTF-8 rune",
	"parse a floating point number",
	"scan lines from a reader",
	"run a command and capture its output",
	"walk a directory tree",
	"resolve a DNS name",
	"environment variable lookup",
	"atomic compare and swap",
	"big integer modular exponentiation",
	"template escaping of HTML",
	"zip archive reader",
	"SQL driver connection pool",
	"timer reset and stop",
	"channel select with timeout",
	"map iteration order randomization",
	"escape analysis of closures",
	"linker dead code elimination",
	"reflect call a method by name",
	"cookie jar public suffix",
	"slog structured logging handler",
	"elliptic curve scalar multiplication",
	"png image decoder",
	"unicode normalization",
	"testing benchmark reset timer",
	"fuzzing corpus minimization",
}

func main() {
	root := flag.String("root", filepath.Join(runtime.GOROOT(), "src"), "corpus")
	n := flag.Int("n", 400, "timed queries per engine and mode")
	embedLimit := flag.Int("embed-limit", 2000, "chunks to embed with the real Ollama (the rest extrapolated)")
	model := flag.String("model", "keel-tiny", "Ollama embedding model")
	threads := flag.Int("threads", 1, "Ollama num_thread")
	keep := flag.Bool("keep", false, "keep the index directory")
	reuse := flag.String("reuse", "", "reuse the indexes a -keep run left in this directory (the ingest rows are then not measured)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the query phases to this file")
	flag.Parse()
	if err := run(*root, *n, *embedLimit, *model, *threads, *keep, *reuse, *cpuprofile); err != nil {
		fmt.Fprintln(os.Stderr, "knowledge:", err)
		os.Exit(1)
	}
}

type chunkRow struct {
	id                    int64
	source, heading, text string
}

type engine struct {
	name   string
	ingest time.Duration
	size   int64
	bm25   []time.Duration
	hybrid []time.Duration
	chunks int
}

func run(root string, n, embedLimit int, model string, threads int, keep bool, reuse, cpuprofile string) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "keel-bench-knowledge-")
	if reuse != "" {
		dir, err, keep = reuse, nil, true
	}
	if err != nil {
		return err
	}
	if !keep {
		defer os.RemoveAll(dir)
	} else {
		fmt.Println("indexes in", dir)
	}
	scope := knowledge.Scope("workspace:" + root)
	scopes := []knowledge.Scope{scope}

	// keel, BM25 only.
	keelDB := filepath.Join(dir, "keel.db")
	ix, err := knowledge.Open(ctx, keelDB, knowledge.Options{})
	if err != nil {
		return err
	}
	var rep knowledge.AddReport
	keel := &engine{name: "keel"}
	if reuse == "" {
		fmt.Fprintf(os.Stderr, "keel: adding %s\n", root)
		start := time.Now()
		rep, err = ix.Add(ctx, []string{root}, knowledge.AddOptions{Scope: scope, AddedBy: "bench"})
		keel.ingest, keel.chunks = time.Since(start), rep.Chunks
		if err != nil {
			return err
		}
	}
	ix.Close()
	keel.size = fileSize(keelDB) + fileSize(keelDB+"-wal")
	reasons := map[string]int{}
	for _, s := range rep.Skipped {
		r := s.Reason
		if i := strings.IndexByte(r, ':'); i > 0 {
			r = r[:i]
		}
		reasons[r]++
	}

	chunks, textBytes, err := readChunks(keelDB)
	if err != nil {
		return err
	}
	if reuse != "" {
		keel.chunks, keel.ingest = len(chunks), time.Nanosecond
	}

	// Raw FTS5, the floor.
	fts := &engine{name: "raw FTS5", chunks: len(chunks)}
	ftsDB := filepath.Join(dir, "fts.db")
	fmt.Fprintln(os.Stderr, "raw FTS5: indexing")
	raw, err := sql.Open("sqlite", "file:"+ftsDB+"?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(10000)")
	if err != nil {
		return err
	}
	defer raw.Close()
	raw.SetMaxOpenConns(4)
	if reuse != "" {
		fts.ingest = time.Nanosecond
		if err := optimizeOnce(ctx, keelDB, raw); err != nil {
			return err
		}
	} else if fts.ingest, err = ingestFTS(ctx, raw, chunks); err != nil {
		return err
	}
	fts.size = fileSize(ftsDB) + fileSize(ftsDB+"-wal")

	// bleve.
	bl := &engine{name: "bleve", chunks: len(chunks)}
	fmt.Fprintln(os.Stderr, "bleve: indexing")
	var bix bleve.Index
	if reuse != "" {
		bix, err = bleve.Open(filepath.Join(dir, "bleve"))
		bl.ingest = time.Nanosecond
	} else {
		bix, err = bleve.New(filepath.Join(dir, "bleve"), bleve.NewIndexMapping())
	}
	if err != nil {
		return err
	}
	defer bix.Close()
	if reuse == "" {
		if bl.ingest, err = ingestBleve(bix, chunks); err != nil {
			return err
		}
	}
	bl.size = dirSize(filepath.Join(dir, "bleve"))

	// Queries, BM25: the three engines in turn, query by query, so that
	// drift in the machine's speed hits all three alike.
	ix, err = knowledge.Open(ctx, keelDB, knowledge.Options{})
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "querying")
	if cpuprofile != "" {
		f, err := os.Create(cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ftsQ, err := raw.PrepareContext(ctx, `SELECT rowid, heading, text FROM fts WHERE fts MATCH ? ORDER BY rank LIMIT 8`)
	if err != nil {
		return err
	}
	// The floor written the other way: the best 8 by bm25() with a
	// LIMIT (SQLite's top-N sort; ORDER BY rank has FTS5 sort every
	// match), then their text. keel's search takes this way; the ratio
	// is given against both.
	// Its own connections: two statements on one connection, one after
	// the other with the same MATCH, would have the second find the
	// first's pages in that connection's cache.
	raw2, err := sql.Open("sqlite", "file:"+ftsDB+"?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(10000)")
	if err != nil {
		return err
	}
	defer raw2.Close()
	raw2.SetMaxOpenConns(4)
	ftsTopN, err := raw2.PrepareContext(ctx, `SELECT f.id, c.c0, c.c1 FROM
		(SELECT rowid AS id, bm25(fts) AS r FROM fts WHERE fts MATCH ? ORDER BY r LIMIT 8) f
		CROSS JOIN fts_content c ON c.id = f.id ORDER BY f.r`)
	if err != nil {
		return err
	}
	rawFTS := func(st *sql.Stmt) func(q string) error {
		return func(q string) error {
			seen := map[int64]bool{}
			for _, m := range []string{matchTerms(q, " AND "), matchTerms(q, " OR ")} {
				rows, err := st.QueryContext(ctx, m)
				if err != nil {
					return err
				}
				for rows.Next() {
					var id int64
					var h, t string
					if err := rows.Scan(&id, &h, &t); err != nil {
						rows.Close()
						return err
					}
					seen[id] = true
				}
				rows.Close()
				if len(seen) >= 8 {
					break
				}
			}
			return nil
		}
	}
	times, err := inTurns(n, func(q string) error {
		_, err := ix.Search(ctx, knowledge.Query{Text: q, Scopes: scopes, Mode: knowledge.ModeBM25, Limit: 8})
		return err
	}, rawFTS(ftsQ), rawFTS(ftsTopN), func(q string) error {
		seen := map[string]bool{}
		for _, op := range []query.MatchQueryOperator{query.MatchQueryOperatorAnd, query.MatchQueryOperatorOr} {
			mq := bleve.NewMatchQuery(q)
			mq.SetOperator(op)
			req := bleve.NewSearchRequestOptions(mq, 8, 0, false)
			req.Fields = []string{"heading", "text", "source"}
			res, err := bix.SearchInContext(ctx, req)
			if err != nil {
				return err
			}
			for _, h := range res.Hits {
				seen[h.ID] = true
			}
			if len(seen) >= 8 {
				break
			}
		}
		return nil
	})
	ix.Close()
	if err != nil {
		return err
	}
	ftsTop := &engine{name: "raw FTS5 top-N", chunks: fts.chunks, ingest: fts.ingest, size: fts.size}
	keel.bm25, fts.bm25, ftsTop.bm25, bl.bm25 = times[0], times[1], times[2], times[3]

	// Embeddings from the real Ollama.
	var emb *embedFigures
	if os.Getenv("OLLAMA_HOST") != "" && embedLimit > 0 {
		emb, err = embedRun(ctx, root, dir, keelDB, scope, model, threads, embedLimit, len(chunks), keel, reuse != "")
		if err != nil {
			return err
		}
	}

	// Report.
	fmt.Printf("\nknowledge store: the Go standard library's source (%s), one run, %d CPUs\n", root, runtime.NumCPU())
	fmt.Printf("corpus: %d files indexed, %d skipped %v, %d chunks, %.1f MB of chunk text\n\n",
		rep.Added+rep.Updated+rep.Unchanged, len(rep.Skipped), reasons, len(chunks), float64(textBytes)/1e6)
	es := []*engine{keel, bl, fts, ftsTop}
	row := func(label string, f func(e *engine) string) {
		fmt.Printf("%-30s", label)
		for _, e := range es {
			fmt.Printf("%16s", f(e))
		}
		fmt.Println()
	}
	row("", func(e *engine) string { return e.name })
	row("ingest, BM25 only", func(e *engine) string { return e.ingest.Round(10 * time.Millisecond).String() })
	row("ingest chunks/s", func(e *engine) string { return strconv.Itoa(int(float64(e.chunks) / e.ingest.Seconds())) })
	row("index size", func(e *engine) string { return fmt.Sprintf("%.1f MB", float64(e.size)/1e6) })
	row("BM25 query p50", func(e *engine) string { return timing.Pct(e.bm25, 0.5).String() })
	row("BM25 query p99", func(e *engine) string { return timing.Pct(e.bm25, 0.99).String() })
	if emb != nil {
		row("hybrid query p50", func(e *engine) string { return pctOr(e.hybrid, 0.5) })
		row("hybrid query p99", func(e *engine) string { return pctOr(e.hybrid, 0.99) })
	}
	fmt.Println()
	floor := fts
	if timing.Pct(ftsTop.bm25, 0.5) < timing.Pct(fts.bm25, 0.5) {
		floor = ftsTop
	}
	fmt.Printf("keel BM25 p50 / raw FTS5 p50: %.2fx (ORDER BY rank), %.2fx (top-N); against the faster, %s: %.2fx (target <= 1.5x); p99: %.2fx\n",
		ratio(timing.Pct(keel.bm25, 0.5), timing.Pct(fts.bm25, 0.5)), ratio(timing.Pct(keel.bm25, 0.5), timing.Pct(ftsTop.bm25, 0.5)),
		floor.name, ratio(timing.Pct(keel.bm25, 0.5), timing.Pct(floor.bm25, 0.5)), ratio(timing.Pct(keel.bm25, 0.99), timing.Pct(floor.bm25, 0.99)))
	fmt.Printf("keel BM25 p50 / bleve p50: %.2fx\n", ratio(timing.Pct(keel.bm25, 0.5), timing.Pct(bl.bm25, 0.5)))
	fmt.Printf("ingest chunks/s, keel / bleve: %.2fx (target >= 1x; bleve's time leaves out reading and chunking)\n",
		(float64(keel.chunks)/keel.ingest.Seconds())/(float64(bl.chunks)/bl.ingest.Seconds()))
	if emb != nil {
		fmt.Printf("hybrid p50: %s (target <= 10ms); vector mode alone (the query's embedding + the search of %d vectors of dim %d) p50 %s\n",
			timing.Pct(keel.hybrid, 0.5), len(chunks), emb.dim, timing.Pct(emb.scan, 0.5))
		fmt.Printf("the query's embedding alone, p50: keel's client (/api/embeddings) %s; plain net/http: /api/embeddings %s, /api/embed %s (Ollama's total_duration %s, of which load_duration %s)\n",
			timing.Pct(emb.queryEmbed, 0.5), timing.Pct(emb.httpLegacy, 0.5), timing.Pct(emb.httpEmbed, 0.5), timing.Pct(emb.ollamaTotal, 0.5), timing.Pct(emb.ollamaLoad, 0.5))
		fmt.Printf("keel's part alone (the same hybrid search, the query's vector given): p50 %s, p99 %s\n",
			timing.Pct(emb.given, 0.5), timing.Pct(emb.given, 0.99))
		fmt.Println("(every query is embedded: keel keeps no cache of query embeddings, Ollama's runner none of prompts for embeddings)")
	}
	if emb != nil && emb.rate > 0 {
		fmt.Printf("ingest with embeddings (%s, num_thread %d): %d chunks of the first %d files in %s = %.0f chunks/s (embedding alone %.0f chunks/s);\n",
			model, threads, emb.chunks, emb.files, emb.total.Round(10*time.Millisecond), float64(emb.chunks)/emb.total.Seconds(), emb.rate)
		fmt.Printf("  the whole tree extrapolated: %s BM25 ingest + %d chunks / %.0f per s = %s, %.0f chunks/s\n",
			keel.ingest.Round(time.Second), len(chunks), emb.rate, emb.whole.Round(time.Second), float64(len(chunks))/emb.whole.Seconds())
	}
	return nil
}

// inTurns times n queries of each f with timing.MeasureTurns (one call
// of each f per round, in a rotating order, after untimed rounds), each f
// taking the queries in turn: every f meets the same load and the same
// queries.
func inTurns(n int, fs ...func(q string) error) ([][]time.Duration, error) {
	calls := make([]func() error, len(fs))
	for i, f := range fs {
		next := 0
		calls[i] = func() error {
			q := queries[next%len(queries)]
			next++
			return f(q)
		}
	}
	return timing.MeasureTurns(n, calls...)
}

func pctOr(d []time.Duration, p float64) string {
	if len(d) == 0 {
		return "-"
	}
	return timing.Pct(d, p).String()
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func fileSize(p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return st.Size()
}

func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// optimizeOnce merges the FTS5 indexes of a -keep run made before the
// ingests merged them (once: a later -reuse finds them merged).
func optimizeOnce(ctx context.Context, keelDB string, raw *sql.DB) error {
	k, err := sql.Open("sqlite", "file:"+keelDB+"?_pragma=journal_mode(WAL)")
	if err != nil {
		return err
	}
	defer k.Close()
	for _, x := range []struct {
		db    *sql.DB
		table string
	}{{k, "kn_fts"}, {raw, "fts"}} {
		var n int
		if err := x.db.QueryRowContext(ctx, `SELECT count(DISTINCT segid) FROM `+x.table+`_idx`).Scan(&n); err != nil {
			return err
		}
		if n > 1 {
			fmt.Fprintf(os.Stderr, "%s: merging %d segments\n", x.table, n)
			if _, err := x.db.ExecContext(ctx, `INSERT INTO `+x.table+`(`+x.table+`) VALUES ('optimize')`); err != nil {
				return err
			}
		}
	}
	return nil
}

// readChunks reads back the chunks keel made, for the peers.
func readChunks(path string) ([]chunkRow, int64, error) {
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		return nil, 0, err
	}
	defer db.Close()
	rows, err := db.Query(`SELECT c.id, d.source, c.heading, c.text FROM kn_chunks c JOIN kn_docs d ON d.id = c.doc_id ORDER BY c.id`)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var out []chunkRow
	var size int64
	for rows.Next() {
		var c chunkRow
		if err := rows.Scan(&c.id, &c.source, &c.heading, &c.text); err != nil {
			return nil, 0, err
		}
		size += int64(len(c.text))
		out = append(out, c)
	}
	return out, size, rows.Err()
}

const batch = 512

func ingestFTS(ctx context.Context, db *sql.DB, chunks []chunkRow) (time.Duration, error) {
	start := time.Now()
	if _, err := db.ExecContext(ctx, `CREATE VIRTUAL TABLE fts USING fts5(heading, text, tokenize='porter unicode61')`); err != nil {
		return 0, err
	}
	for i := 0; i < len(chunks); i += batch {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		st, err := tx.PrepareContext(ctx, `INSERT INTO fts(rowid, heading, text) VALUES (?, ?, ?)`)
		if err != nil {
			tx.Rollback()
			return 0, err
		}
		for _, c := range chunks[i:min(i+batch, len(chunks))] {
			if _, err := st.ExecContext(ctx, c.id, c.heading, c.text); err != nil {
				tx.Rollback()
				return 0, err
			}
		}
		if err := tx.Commit(); err != nil {
			return 0, err
		}
	}
	// Merged into one segment, as keel's Add leaves a large ingest: a
	// query seeks every term in every segment.
	if _, err := db.ExecContext(ctx, `INSERT INTO fts(fts) VALUES ('optimize')`); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

type bleveDoc struct {
	Source  string `json:"source"`
	Heading string `json:"heading"`
	Text    string `json:"text"`
}

func ingestBleve(ix bleve.Index, chunks []chunkRow) (time.Duration, error) {
	start := time.Now()
	for i := 0; i < len(chunks); i += batch {
		b := ix.NewBatch()
		for _, c := range chunks[i:min(i+batch, len(chunks))] {
			if err := b.Index(strconv.FormatInt(c.id, 10), bleveDoc{Source: c.source, Heading: c.heading, Text: c.text}); err != nil {
				return 0, err
			}
		}
		if err := ix.Batch(b); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// matchTerms is knowledge's query rewriting (search.go), so that raw FTS5
// runs the same MATCH expressions: the words, quoted, joined by op,
// English stop words left out. Like keel, each engine asks for every word
// first and for any word when that finds fewer than 8.
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
	return strings.Join(keep, op)
}

var stopWords = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`a about an and are as at be by do does for from how i in is it its of on or
		that the this to was what when where which who why will with you`) {
		stopWords[w] = true
	}
}
