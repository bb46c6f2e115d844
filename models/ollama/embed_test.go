package ollama

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/ollama/ollama/api"

	"github.com/keel-runtime/keel/models"
)

// TestEmbedFake: Embed sends several inputs to /api/embed untruncated with the configured
// thread count and returns one vector per input in order with the
// prompt's token count; no input asks Ollama nothing; a reply with the
// wrong number of vectors, or an unknown model, is a classified error.
func TestEmbedFake(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.embed = func(w http.ResponseWriter, r *http.Request) {
		var req api.EmbedRequest
		f.mu.Lock()
		json.Unmarshal([]byte(f.embeds[len(f.embeds)-1]), &req) // serve read the body
		f.mu.Unlock()
		switch req.Model {
		case "missing":
			http.Error(w, `{"error":"model 'missing' not found"}`, http.StatusNotFound)
			return
		case "short":
			req.Input = req.Input.([]any)[:1] // one vector short
		}
		var resp api.EmbedResponse
		for _, in := range req.Input.([]any) {
			resp.Embeddings = append(resp.Embeddings, []float32{float32(len(in.(string))), 1})
		}
		resp.PromptEvalCount = 7
		json.NewEncoder(w).Encode(resp)
	}
	p := f.provider(t, Config{NumThread: 2})

	got, err := p.Embed(t.Context(), models.EmbedRequest{Model: "tiny", Input: []string{"a", "cat"}})
	if err != nil {
		t.Fatalf("Embed() error = %v", err)
	}
	want := models.EmbedResponse{Model: "tiny", Vectors: [][]float32{{1, 1}, {3, 1}}, Usage: models.Usage{PromptTokens: 7}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Embed() mismatch (-want +got):\n%s", diff)
	}
	f.mu.Lock()
	sent := decode(t, f.embeds[0])
	f.mu.Unlock()
	wantSent := decode(t, `{"model":"tiny","input":["a","cat"],"truncate":false,"keep_alive":"5m0s","options":{"num_thread":2}}`)
	if diff := cmp.Diff(wantSent, sent); diff != "" {
		t.Errorf("embed request sent mismatch (-want +got):\n%s", diff)
	}

	got, err = p.Embed(t.Context(), models.EmbedRequest{Model: "tiny"})
	if err != nil || got.Model != "tiny" || len(got.Vectors) != 0 {
		t.Errorf("Embed(no input) = %+v, %v, want no vectors and no error", got, err)
	}
	if n := f.count("/api/embed"); n != 1 {
		t.Errorf("/api/embed called %d times, want 1 (none for no input)", n)
	}

	_, err = p.Embed(t.Context(), models.EmbedRequest{Model: "short", Input: []string{"a", "b"}})
	if !errors.Is(err, models.ErrInvalidRequest) {
		t.Errorf("Embed() with a vector missing from the reply: error = %v, want ErrInvalidRequest", err)
	}
	_, err = p.Embed(t.Context(), models.EmbedRequest{Model: "missing", Input: []string{"a", "b"}})
	if !errors.Is(err, models.ErrModelNotFound) {
		t.Errorf("Embed(unknown model) error = %v, want ErrModelNotFound", err)
	}
}

// TestEmbedOneFake: a single input goes to /api/embeddings with the
// thread count and keep-alive, and its vector comes back scaled to length
// 1 (as /api/embed's are); an unknown model is ErrModelNotFound there
// too; a too-long input, which /api/embeddings fails with a 500, is
// ErrContextTooLong; an Ollama without /api/embeddings is asked through
// /api/embed, and only once through the missing path.
func TestEmbedOneFake(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.embeddings = func(w http.ResponseWriter, r *http.Request) {
		var req api.EmbeddingRequest
		f.mu.Lock()
		json.Unmarshal([]byte(f.legacy[len(f.legacy)-1]), &req)
		f.mu.Unlock()
		switch req.Model {
		case "missing":
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"error":"model %q not found, try pulling it first"}`, req.Model)
		case "long":
			http.Error(w, `{"error":"the input length exceeds the context length"}`, http.StatusInternalServerError)
		default:
			json.NewEncoder(w).Encode(api.EmbeddingResponse{Embedding: []float64{3, 0, -4}})
		}
	}
	p := f.provider(t, Config{NumThread: 2})

	got, err := p.Embed(t.Context(), models.EmbedRequest{Model: "tiny", Input: []string{"cat"}})
	if err != nil {
		t.Fatalf("Embed(one input) error = %v", err)
	}
	want := models.EmbedResponse{Model: "tiny", Vectors: [][]float32{{0.6, 0, -0.8}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Embed(one input) mismatch (-want +got):\n%s", diff)
	}
	f.mu.Lock()
	sent := decode(t, f.legacy[0])
	f.mu.Unlock()
	wantSent := decode(t, `{"model":"tiny","prompt":"cat","keep_alive":"5m0s","options":{"num_thread":2}}`)
	if diff := cmp.Diff(wantSent, sent); diff != "" {
		t.Errorf("embeddings request sent mismatch (-want +got):\n%s", diff)
	}
	if n := f.count("/api/embed"); n != 0 {
		t.Errorf("/api/embed called %d times for one input, want 0", n)
	}
	if _, err := p.Embed(t.Context(), models.EmbedRequest{Model: "missing", Input: []string{"a"}}); !errors.Is(err, models.ErrModelNotFound) {
		t.Errorf("Embed(one input, unknown model) error = %v, want ErrModelNotFound", err)
	}
	if _, err := p.Embed(t.Context(), models.EmbedRequest{Model: "long", Input: []string{"a"}}); !errors.Is(err, models.ErrContextTooLong) {
		t.Errorf("Embed(one input too long) error = %v, want ErrContextTooLong", err)
	}
	if n := f.count("/api/embed"); n != 0 {
		t.Errorf("/api/embed called %d times after errors of /api/embeddings, want 0", n)
	}

	old := newFake(t)
	old.embeddings = func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }
	old.embed = func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.EmbedResponse{Embeddings: [][]float32{{1, 0}}})
	}
	p = old.provider(t, Config{})
	for range 2 {
		got, err := p.Embed(t.Context(), models.EmbedRequest{Model: "tiny", Input: []string{"cat"}})
		if err != nil || len(got.Vectors) != 1 {
			t.Fatalf("Embed(one input) without /api/embeddings = %+v, %v, want one vector", got, err)
		}
	}
	if n, m := old.count("/api/embeddings"), old.count("/api/embed"); n != 1 || m != 2 {
		t.Errorf("without /api/embeddings: it was asked %d times and /api/embed %d, want 1 and 2", n, m)
	}
}
