package knowledge

import (
	"context"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"slices"
	"testing"

	"github.com/keel-runtime/keel/models"
)

// hashEmbedder gives each text a vector of 8 from its hash: the cache's
// bookkeeping is under test here, not the model (ollama_test.go has the
// real one).
type hashEmbedder struct{}

func (hashEmbedder) Embed(_ context.Context, req models.EmbedRequest) (models.EmbedResponse, error) {
	out := models.EmbedResponse{Model: req.Model}
	for _, in := range req.Input {
		h := fnv.New64a()
		h.Write([]byte(in))
		x := h.Sum64()
		v := make([]float32, 8)
		for i := range v {
			v[i] = float32(int8(x>>(8*i))) + 0.5
		}
		out.Vectors = append(out.Vectors, v)
	}
	return out, nil
}

// TestVectorCacheUpdates: writes update the loaded vector set in place
// (no reload of the scope's vectors), and it holds exactly the vectors
// of the chunks in the table.
func TestVectorCacheUpdates(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ix, err := Open(ctx, filepath.Join(t.TempDir(), "k.db"), Options{Embedder: hashEmbedder{}, EmbedModel: "hash"})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	o := AddOptions{Scope: ScopeUser}
	for _, d := range []string{"alpha", "beta"} {
		if _, err := ix.AddText(ctx, "keel:"+d, "", d+" words", o); err != nil {
			t.Fatal(err)
		}
	}
	search := func() {
		t.Helper()
		if _, err := ix.Search(ctx, Query{Text: "alpha", Scopes: []Scope{ScopeUser}, Mode: ModeVector}); err != nil {
			t.Fatal(err)
		}
	}
	search()
	loaded, _ := ix.vecs.get(ScopeUser, "hash", "")
	if loaded == nil {
		t.Fatal("no vector set cached after a search")
	}
	check := func(step string) {
		t.Helper()
		v, _ := ix.vecs.get(ScopeUser, "hash", "")
		if v != loaded {
			t.Fatalf("%s: the vector set was dropped or reloaded, want it updated in place", step)
		}
		rows, err := ix.r.QueryContext(ctx, `SELECT chunk_id FROM kn_vectors ORDER BY chunk_id`)
		if err != nil {
			t.Fatal(err)
		}
		var want []int64
		for rows.Next() {
			var id int64
			rows.Scan(&id)
			want = append(want, id)
		}
		rows.Close()
		got := slices.Sorted(slices.Values(v.ids))
		if !slices.Equal(got, want) {
			t.Errorf("%s: cached ids %v, want the table's %v", step, got, want)
		}
		for i, id := range v.ids {
			if v.pos != nil && v.pos[id] != int32(i) {
				t.Errorf("%s: pos[%d] = %d, want %d", step, id, v.pos[id], i)
			}
		}
		if len(v.vecs) != len(v.ids)*v.dim {
			t.Errorf("%s: %d floats for %d vectors of %d", step, len(v.vecs), len(v.ids), v.dim)
		}
	}
	if _, err := ix.AddText(ctx, "keel:gamma", "", "gamma words", o); err != nil {
		t.Fatal(err)
	}
	check("a document added")
	if _, err := ix.AddText(ctx, "keel:alpha", "", "alpha changed", o); err != nil {
		t.Fatal(err)
	}
	check("a document replaced")
	search()
	check("a search after")
}

// TestCompact: compact (run after an Add that wrote much of the index)
// leaves the index in one segment, still answering.
func TestCompact(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ix, err := Open(ctx, filepath.Join(t.TempDir(), "k.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	for i := range 8 { // a commit each: a segment each
		if _, err := ix.AddText(ctx, fmt.Sprintf("keel:%d", i), "", fmt.Sprintf("words number %d", i), AddOptions{Scope: ScopeUser}); err != nil {
			t.Fatal(err)
		}
	}
	segments := func() int {
		var n int
		if err := ix.r.QueryRowContext(ctx, `SELECT count(DISTINCT segid) FROM kn_fts_idx`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := segments(); n < 2 {
		t.Fatalf("%d segments after 8 commits, want several", n)
	}
	if err := ix.compact(ctx); err != nil {
		t.Fatal(err)
	}
	if n := segments(); n != 1 {
		t.Errorf("%d segments after compact, want 1", n)
	}
	if hits, err := ix.Search(ctx, Query{Text: "words", Scopes: []Scope{ScopeUser}}); err != nil || len(hits) != 8 {
		t.Errorf("Search(words) = %d hits, %v, want 8", len(hits), err)
	}
}

// TestHybridHits: a hybrid or vector search returns whole hits (chunk,
// document, source, lines, text, the scope's labels) for the hits found
// by their vector alone too, which the ranking carries bare; a text
// copied into several documents is returned once, also when its copies
// fill more than the first rows read.
func TestHybridHits(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ix, err := Open(ctx, filepath.Join(t.TempDir(), "k.db"), Options{Embedder: hashEmbedder{}, EmbedModel: "hash"})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	o := AddOptions{Scope: ScopeUser, Labels: []string{"private"}}
	docs := map[string]string{"keel:c": "gamma delta", "keel:d": "epsilon zeta", "keel:e": "eta theta"}
	for i := range 5 {
		docs[fmt.Sprintf("keel:copy%d", i)] = "alpha beta"
	}
	for src, text := range docs {
		if _, err := ix.AddText(ctx, src, "", text, o); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		mode  Mode
		limit int
		want  int
	}{{ModeHybrid, 8, 4}, {ModeHybrid, 2, 2}, {ModeVector, 8, 4}, {ModeVector, 3, 3}} {
		hits, err := ix.Search(ctx, Query{Text: "alpha beta", Scopes: []Scope{ScopeUser}, Mode: tc.mode, Limit: tc.limit})
		if err != nil {
			t.Fatalf("Search(%s, limit %d) error = %v", tc.mode, tc.limit, err)
		}
		if len(hits) != tc.want {
			t.Errorf("Search(%s, limit %d) = %d hits, want %d (four texts, one of them in five documents)", tc.mode, tc.limit, len(hits), tc.want)
		}
		texts := map[string]bool{}
		vecOnly := 0
		for i, h := range hits {
			if texts[h.Text] {
				t.Errorf("Search(%s, limit %d)[%d]: text %q returned twice", tc.mode, tc.limit, i, h.Text)
			}
			texts[h.Text] = true
			if h.BM25Rank == 0 {
				vecOnly++
			}
			if h.Text == "" || docs[h.Source] != h.Text || h.ChunkID == "" || h.DocID == "" || h.Scope != ScopeUser ||
				h.StartLine == 0 || h.Type != "text" || !slices.Equal(h.Labels, []string{"private"}) || h.VectorRank == 0 {
				t.Errorf("Search(%s, limit %d)[%d] = %+v, want a whole hit of its document with the scope's labels and a vector rank", tc.mode, tc.limit, i, h)
			}
		}
		if tc.limit == 8 && vecOnly == 0 {
			t.Errorf("Search(%s, limit 8): no hit found by its vector alone, want the texts without alpha", tc.mode)
		}
		if !texts["alpha beta"] {
			t.Errorf("Search(%s, limit %d): the text searched for is missing", tc.mode, tc.limit)
		}
	}
}

// TestVectorHitOutsideScope: a vector set that holds a chunk of another
// scope (one lagging behind the table) does not show that chunk's text:
// the vector hits, which no statement filtered, are checked against the
// scopes searched when they are read.
func TestVectorHitOutsideScope(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ix, err := Open(ctx, filepath.Join(t.TempDir(), "k.db"), Options{Embedder: hashEmbedder{}, EmbedModel: "hash"})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	other, err := ParseScope("workspace:/elsewhere")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ix.AddText(ctx, "keel:mine", "", "alpha beta", AddOptions{Scope: ScopeUser}); err != nil {
		t.Fatal(err)
	}
	secret, err := ix.AddText(ctx, "keel:theirs", "", "gamma secret", AddOptions{Scope: other})
	if err != nil {
		t.Fatal(err)
	}
	q := Query{Text: "gamma secret", Scopes: []Scope{ScopeUser}, Mode: ModeVector}
	if _, err := ix.Search(ctx, q); err != nil {
		t.Fatal(err)
	}
	// The other scope's chunk, put into the user scope's loaded set.
	theirs, err := ix.vectors(ctx, other)
	if err != nil || len(theirs.ids) != 1 {
		t.Fatalf("vectors(%s) = %v, %v, want one vector", other, theirs, err)
	}
	mine, _ := ix.vecs.get(ScopeUser, "hash", "")
	if mine == nil {
		t.Fatal("no vector set cached for the user scope after a search")
	}
	mine.ids = append(mine.ids, theirs.ids[0])
	mine.vecs = append(mine.vecs, theirs.vecs...)
	for _, mode := range []Mode{ModeVector, ModeHybrid} {
		q.Mode = mode
		hits, err := ix.Search(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hits {
			if h.Scope != ScopeUser || h.DocID == secret.ID {
				t.Errorf("Search(%s, scope user) returned %s of %s: %q", mode, h.ChunkID, h.Scope, h.Text)
			}
		}
		if len(hits) != 1 {
			t.Errorf("Search(%s, scope user) = %d hits, want the user scope's one", mode, len(hits))
		}
	}
}
