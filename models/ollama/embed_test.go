package ollama

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/ollama/ollama/api"

	"github.com/keel-runtime/keel/models"
)

// TestEmbedFake: Embed sends the inputs untruncated with the configured
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
	_, err = p.Embed(t.Context(), models.EmbedRequest{Model: "missing", Input: []string{"a"}})
	if !errors.Is(err, models.ErrModelNotFound) {
		t.Errorf("Embed(unknown model) error = %v, want ErrModelNotFound", err)
	}
}
