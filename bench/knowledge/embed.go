package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/keel-runtime/keel/knowledge"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/ollama"
)

type embedFigures struct {
	files, chunks int
	total         time.Duration // BM25 ingest + embedding of the subset
	rate          float64       // chunks embedded per second
	whole         time.Duration // the whole tree, extrapolated
	dim           int
	queryEmbed    []time.Duration
	scan          []time.Duration // vector mode: query embedding + scan + rows
	// The query's embedding without keel's client: the same request
	// body over a kept-alive HTTP connection, and Ollama's own account
	// of it (total_duration; load_duration is finding the model and its
	// runner, before the runner computes).
	httpEmbed, ollamaTotal, ollamaLoad []time.Duration
	// The same by plain net/http through /api/embeddings, the path
	// keel's client takes for one input.
	httpLegacy []time.Duration
	// keel's part of a hybrid query alone: the same search with the
	// query's vector given (computed before the timed rounds), so BM25,
	// the vector search, the fusion and the text read.
	given []time.Duration
}

// givenVectors is an Embedder that answers the bench's queries with
// their vectors computed beforehand; it times keel's part of a search
// apart from the model's. The hybrid figures do not use it.
type givenVectors map[string][]float32

func (g givenVectors) Embed(_ context.Context, req models.EmbedRequest) (models.EmbedResponse, error) {
	out := models.EmbedResponse{Model: req.Model}
	for _, in := range req.Input {
		v, ok := g[in]
		if !ok {
			return out, fmt.Errorf("no vector given for %q", in)
		}
		out.Vectors = append(out.Vectors, v)
	}
	return out, nil
}

// embedRun ingests the first files of the tree (up to limit chunks) with
// embeddings from the real Ollama, fills the whole corpus's index with
// vectors, and times hybrid queries over it.
func embedRun(ctx context.Context, root, dir, keelDB string, scope knowledge.Scope, model string, threads, limit, total int, keel *engine, reuse bool) (*embedFigures, error) {
	p, err := ollama.New(ollama.Config{NumThread: threads})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	digest, _ := p.Digest(ctx, model)
	if digest == "" {
		return nil, fmt.Errorf("ollama has no model %s", model)
	}
	f := &embedFigures{}

	// The first files, in the order of the tree, up to limit chunks.
	db, err := sql.Open("sqlite", "file:"+keelDB)
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, `SELECT source, chunks FROM kn_docs ORDER BY source`)
	if err != nil {
		db.Close()
		return nil, err
	}
	var files []string
	for rows.Next() && f.chunks < limit {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			rows.Close()
			db.Close()
			return nil, err
		}
		files = append(files, s)
		f.chunks += n
	}
	rows.Close()
	db.Close()
	f.files = len(files)

	o := knowledge.Options{Embedder: p, EmbedModel: model, ModelDigest: p.Digest}
	if reuse {
		// The vectors a -keep run left, if any: then only the queries
		// are timed. They carry the digest of the model as that run's
		// Ollama made it, and a server started afresh (../shared/ollama/start
		// creates keel-tiny again) gives the same model another digest,
		// under which keel would search no vector at all: the kept
		// vectors are labelled with this server's digest.
		f.dim, _ = vectorDim(ctx, keelDB)
		if f.dim > 0 {
			if err := relabelVectors(ctx, keelDB, model, digest); err != nil {
				return nil, err
			}
		}
	}
	if f.dim == 0 {
		fmt.Fprintf(os.Stderr, "embedding: %d chunks of %d files with %s\n", f.chunks, f.files, model)
		embDB := filepath.Join(dir, "embed.db")
		plain, err := knowledge.Open(ctx, embDB, knowledge.Options{})
		if err != nil {
			return nil, err
		}
		start := time.Now()
		if _, err := plain.Add(ctx, files, knowledge.AddOptions{Scope: scope}); err != nil {
			return nil, err
		}
		bm := time.Since(start)
		plain.Close()
		ix, err := knowledge.Open(ctx, embDB, o)
		if err != nil {
			return nil, err
		}
		start = time.Now()
		n, err := ix.Reembed(ctx, scope, nil)
		emb := time.Since(start)
		ix.Close()
		if err != nil {
			return nil, err
		}
		f.chunks = n
		f.total = bm + emb
		f.rate = float64(n) / emb.Seconds()
		f.whole = keel.ingest + time.Duration(float64(total)/f.rate*float64(time.Second))

		// Every chunk of the whole corpus gets a vector: the real ones, cycled.
		if f.dim, err = fillVectors(ctx, embDB, keelDB); err != nil {
			return nil, err
		}
	}

	ix, err := knowledge.Open(ctx, keelDB, o)
	if err != nil {
		return nil, err
	}
	defer ix.Close()
	given := givenVectors{}
	for _, q := range queries {
		r, err := p.Embed(ctx, models.EmbedRequest{Model: model, Input: []string{q}})
		if err != nil {
			return nil, err
		}
		given[q] = r.Vectors[0]
	}
	gix, err := knowledge.Open(ctx, keelDB, knowledge.Options{Embedder: given, EmbedModel: model, ModelDigest: p.Digest})
	if err != nil {
		return nil, err
	}
	defer gix.Close()
	scopes := []knowledge.Scope{scope}
	plainHTTP := &http.Client{}
	url := p.Endpoint() + "/api/embed"
	post := func(path string, body any, into any) error {
		b, _ := json.Marshal(body)
		resp, err := plainHTTP.Post(p.Endpoint()+path, "application/json", bytes.NewReader(b))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", path, resp.Status)
		}
		return json.NewDecoder(resp.Body).Decode(into)
	}
	times, err := inTurns(len(keel.bm25), func(q string) error {
		_, err := ix.Search(ctx, knowledge.Query{Text: q, Scopes: scopes, Mode: knowledge.ModeHybrid, Limit: 8})
		return err
	}, func(q string) error {
		_, err := ix.Search(ctx, knowledge.Query{Text: q, Scopes: scopes, Mode: knowledge.ModeVector, Limit: 8})
		return err
	}, func(q string) error {
		_, err := p.Embed(ctx, models.EmbedRequest{Model: model, Input: []string{q}})
		return err
	}, func(q string) error {
		body, _ := json.Marshal(map[string]any{"model": model, "input": []string{q}, "truncate": false,
			"keep_alive": ollama.DefaultKeepAlive.String(), "options": map[string]any{"num_thread": threads}})
		resp, err := plainHTTP.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var r struct {
			Total int64 `json:"total_duration"`
			Load  int64 `json:"load_duration"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return err
		}
		f.ollamaTotal = append(f.ollamaTotal, time.Duration(r.Total))
		f.ollamaLoad = append(f.ollamaLoad, time.Duration(r.Load))
		return nil
	}, func(q string) error {
		var r struct {
			Embedding []float64 `json:"embedding"`
		}
		return post("/api/embeddings", map[string]any{"model": model, "prompt": q,
			"keep_alive": ollama.DefaultKeepAlive.String(), "options": map[string]any{"num_thread": threads}}, &r)
	}, func(q string) error {
		_, err := gix.Search(ctx, knowledge.Query{Text: q, Scopes: scopes, Mode: knowledge.ModeHybrid, Limit: 8})
		return err
	})
	if err != nil {
		return nil, err
	}
	keel.hybrid, f.scan, f.queryEmbed, f.httpEmbed, f.httpLegacy, f.given = times[0], times[1], times[2], times[3], times[4], times[5]
	// The untimed rounds came first.
	f.ollamaTotal = f.ollamaTotal[len(f.ollamaTotal)-len(f.httpEmbed):]
	f.ollamaLoad = f.ollamaLoad[len(f.ollamaLoad)-len(f.httpEmbed):]
	return f, nil
}

// fillVectors gives every chunk of dst a vector from src's, cycled, with
// src's model and digest; it returns their dimension.
func fillVectors(ctx context.Context, src, dst string) (int, error) {
	s, err := sql.Open("sqlite", "file:"+src)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	rows, err := s.QueryContext(ctx, `SELECT model, digest, vec FROM kn_vectors ORDER BY chunk_id`)
	if err != nil {
		return 0, err
	}
	var model, digest string
	var vecs [][]byte
	for rows.Next() {
		var v []byte
		if err := rows.Scan(&model, &digest, &v); err != nil {
			rows.Close()
			return 0, err
		}
		vecs = append(vecs, v)
	}
	rows.Close()
	if len(vecs) == 0 {
		return 0, fmt.Errorf("no vectors embedded")
	}
	d, err := sql.Open("sqlite", "file:"+dst+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
	if err != nil {
		return 0, err
	}
	defer d.Close()
	d.SetMaxOpenConns(1)
	tx, err := d.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	ids, err := tx.QueryContext(ctx, `SELECT id FROM kn_chunks ORDER BY id`)
	if err != nil {
		return 0, err
	}
	var all []int64
	for ids.Next() {
		var id int64
		if err := ids.Scan(&id); err != nil {
			ids.Close()
			return 0, err
		}
		all = append(all, id)
	}
	ids.Close()
	st, err := tx.PrepareContext(ctx, `INSERT OR REPLACE INTO kn_vectors(chunk_id, model, digest, vec) VALUES (?, ?, ?, ?)`)
	if err != nil {
		return 0, err
	}
	for i, id := range all {
		if _, err := st.ExecContext(ctx, id, model, digest, vecs[i%len(vecs)]); err != nil {
			return 0, err
		}
	}
	return len(vecs[0]) / 4, tx.Commit()
}

// vectorDim is the dimension of the vectors in the keel index at path.
func vectorDim(ctx context.Context, path string) (int, error) {
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var n int
	err = db.QueryRowContext(ctx, `SELECT length(vec) / 4 FROM kn_vectors LIMIT 1`).Scan(&n)
	return n, err
}

// relabelVectors gives the vectors of model in the keel index at path
// the digest digest.
func relabelVectors(ctx context.Context, path, model, digest string) error {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
	if err != nil {
		return err
	}
	defer db.Close()
	res, err := db.ExecContext(ctx, `UPDATE kn_vectors SET digest = ? WHERE model = ? AND digest != ?`, digest, model, digest)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n > 0 {
		fmt.Fprintf(os.Stderr, "embedding: %d kept vectors of %s relabelled with this server's digest\n", n, model)
	}
	return nil
}
