package knowledge_test

import (
	"context"
	"database/sql"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/keel-runtime/keel/knowledge"
	"github.com/keel-runtime/keel/models/ollama"
)

// realEmbedder returns the Ollama provider for the server of OLLAMA_HOST
// (../shared/ollama/start) and its test model; the test is skipped only
// when OLLAMA_HOST is unset.
func realEmbedder(t *testing.T) (*ollama.Provider, string) {
	t.Helper()
	if os.Getenv("OLLAMA_HOST") == "" {
		t.Skip("OLLAMA_HOST is unset: no real Ollama to embed with")
	}
	p, err := ollama.New(ollama.Config{NumThread: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	model := os.Getenv("KEEL_TEST_OLLAMA_MODEL")
	if model == "" {
		model = "keel-tiny"
	}
	return p, model
}

// vectorRows counts the vectors of the database at path by model and
// digest.
func vectorRows(t *testing.T, path string) map[[2]string]int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT model, digest, count(*) FROM kn_vectors GROUP BY model, digest`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[[2]string]int{}
	for rows.Next() {
		var model, digest string
		var n int
		if err := rows.Scan(&model, &digest, &n); err != nil {
			t.Fatal(err)
		}
		m[[2]string{model, digest}] = n
	}
	return m
}

// TestHybridOllama embeds the fixture corpus with the real Ollama: every
// chunk gets a vector recorded with the model and its digest; a chunk's
// own text finds it first by vector; hybrid search (RRF of BM25 and
// vectors) keeps each known answer in its top three (the tiny model's
// vectors are poor, the plumbing is real); a changed digest re-embeds
// everything on the next Add.
func TestHybridOllama(t *testing.T) {
	t.Parallel()
	p, model := realEmbedder(t)
	ctx := t.Context()
	digest, _ := p.Digest(ctx, model)
	if digest == "" {
		t.Fatalf("Digest(%s) = \"\", want the model's digest from /api/tags", model)
	}
	path := filepath.Join(t.TempDir(), "keel.db")
	o := knowledge.Options{Embedder: p, EmbedModel: model, ModelDigest: p.Digest}
	ix, err := knowledge.Open(ctx, path, o)
	if err != nil {
		t.Fatal(err)
	}
	var last knowledge.Progress
	rep, err := ix.Add(ctx, []string{corpus(t)}, knowledge.AddOptions{Scope: fixtureScope, Progress: func(p knowledge.Progress) { last = p }})
	if err != nil {
		t.Fatalf("Add() error = %v", err)
	}
	if rep.Chunks == 0 || rep.Embedded != rep.Chunks || last.Embedded != rep.Chunks || last.FilesDone != 6 {
		t.Errorf("Add() = %+v, last progress %+v; want every chunk embedded and reported", rep, last)
	}
	if got := vectorRows(t, path); len(got) != 1 || got[[2]string{model, digest}] != rep.Chunks {
		t.Errorf("vectors by model and digest = %v, want %d of %s@%s", got, rep.Chunks, model, digest)
	}

	scopes := []knowledge.Scope{fixtureScope}
	// A chunk's own text (as embedded: heading, newline, text) is nearest to itself.
	bm, err := ix.Search(ctx, knowledge.Query{Text: "water flour tokens pivot moon tomatoes", Scopes: scopes, Mode: knowledge.ModeBM25, Limit: 20})
	if err != nil || len(bm) < 5 {
		t.Fatalf("Search(BM25) = %d hits, %v, want at least 5", len(bm), err)
	}
	for _, h := range bm[:5] {
		q := h.Text
		if h.Heading != "" {
			q = h.Heading + "\n" + h.Text
		}
		hits, err := ix.Search(ctx, knowledge.Query{Text: q, Scopes: scopes, Mode: knowledge.ModeVector, Limit: 3})
		if err != nil || len(hits) == 0 {
			t.Fatalf("Search(vector, chunk %s's text) = %v, %v", h.ChunkID, hits, err)
		}
		if hits[0].ChunkID != h.ChunkID || math.Abs(hits[0].Score-1) > 1e-3 || hits[0].VectorRank != 1 || hits[0].BM25Rank != 0 {
			t.Errorf("Search(vector, chunk %s's text)[0] = %s cos %v ranks %d/%d, want itself, cos 1, vector rank 1",
				h.ChunkID, hits[0].ChunkID, hits[0].Score, hits[0].BM25Rank, hits[0].VectorRank)
		}
	}

	root := corpus(t)
	both := 0
	for _, c := range rankCases {
		hits, err := ix.Search(ctx, knowledge.Query{Text: c.query, Scopes: scopes}) // hybrid by default
		if err != nil {
			t.Fatalf("Search(hybrid %q) error = %v", c.query, err)
		}
		found := false
		for i, h := range hits {
			if h.BM25Rank > 0 && h.VectorRank > 0 {
				both++
			}
			want := 1/float64(60+h.BM25Rank)*b2f(h.BM25Rank > 0) + 1/float64(60+h.VectorRank)*b2f(h.VectorRank > 0)
			if math.Abs(h.Score-want) > 1e-9 {
				t.Errorf("Search(hybrid %q)[%d] score %v, want RRF of ranks %d/%d = %v", c.query, i, h.Score, h.BM25Rank, h.VectorRank, want)
			}
			if i < 3 && h.Source == filepath.Join(root, c.file) && h.Heading == c.heading {
				found = true
			}
		}
		if !found {
			t.Errorf("Search(hybrid %q): %s %q not in the top 3", c.query, c.file, c.heading)
		}
	}
	if both == 0 {
		t.Errorf("no hybrid hit was in both rankings: the fusion is not fusing")
	}
	ix.Close()

	// The model changed (its digest): the next Add re-embeds every chunk, though no file changed.
	o.ModelDigest = func(context.Context, string) (string, error) { return "sha256-changed", nil }
	ix, err = knowledge.Open(ctx, path, o)
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	rep2, err := ix.Add(ctx, []string{corpus(t)}, knowledge.AddOptions{Scope: fixtureScope})
	if err != nil || rep2.Unchanged != 6 || rep2.Embedded != rep.Chunks {
		t.Errorf("Add() after the model changed = %+v, %v, want 6 unchanged files and %d chunks re-embedded", rep2, err, rep.Chunks)
	}
	if got := vectorRows(t, path); len(got) != 1 || got[[2]string{model, "sha256-changed"}] != rep.Chunks {
		t.Errorf("vectors by model and digest after re-embedding = %v, want all %d of the new digest", got, rep.Chunks)
	}
	if hits, err := ix.Search(ctx, knowledge.Query{Text: "sourdough starter", Scopes: scopes}); err != nil || len(hits) == 0 || hits[0].VectorRank == 0 && hits[0].BM25Rank == 0 {
		t.Errorf("Search(hybrid) after re-embedding = %v, %v", hits, err)
	}
	if n, err := ix.Reembed(ctx, "", nil); err != nil || n != 0 {
		t.Errorf("Reembed() with nothing stale = %d, %v, want 0", n, err)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
