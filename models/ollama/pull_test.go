package ollama

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/types/model"

	"github.com/keel-runtime/keel/models"
)

// pullLines is a pull of one layer as Ollama v0.17.4 streams it.
var pullLines = []any{
	api.ProgressResponse{Status: "pulling manifest"},
	api.ProgressResponse{Status: "pulling 8eeb52dfb3bb", Digest: "sha256:8eeb52dfb3bb", Total: 1000},
	api.ProgressResponse{Status: "pulling 8eeb52dfb3bb", Digest: "sha256:8eeb52dfb3bb", Total: 1000, Completed: 400},
	api.ProgressResponse{Status: "pulling 8eeb52dfb3bb", Digest: "sha256:8eeb52dfb3bb", Total: 1000, Completed: 1000},
	api.ProgressResponse{Status: "verifying sha256 digest"},
	api.ProgressResponse{Status: "writing manifest"},
	api.ProgressResponse{Status: "success"},
}

func TestPullProgress(t *testing.T) {
	f := newFake(t)
	f.pull = func(w http.ResponseWriter, _ *http.Request) { ndjson(w, pullLines...) }
	p := f.provider(t, Config{})
	var got []PullProgress
	if err := p.Pull(t.Context(), "qwen2.5:0.5b", func(pp PullProgress) { got = append(got, pp) }); err != nil {
		t.Fatalf("Pull() = %v, want nil", err)
	}
	want := []PullProgress{
		{Status: "pulling manifest"},
		{Status: "pulling 8eeb52dfb3bb", Digest: "sha256:8eeb52dfb3bb", Total: 1000},
		{Status: "pulling 8eeb52dfb3bb", Digest: "sha256:8eeb52dfb3bb", Total: 1000, Completed: 400},
		{Status: "pulling 8eeb52dfb3bb", Digest: "sha256:8eeb52dfb3bb", Total: 1000, Completed: 1000},
		{Status: "verifying sha256 digest"},
		{Status: "writing manifest"},
		{Status: "success"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
	f.mu.Lock()
	bodies := slices.Clone(f.pulls)
	f.mu.Unlock()
	var req api.PullRequest
	if len(bodies) != 1 || json.Unmarshal([]byte(bodies[0]), &req) != nil || req.Model != "qwen2.5:0.5b" || (req.Stream != nil && !*req.Stream) {
		t.Errorf("/api/pull requests = %q, want one streaming pull of qwen2.5:0.5b", bodies)
	}
	// No progress function is fine too.
	if err := p.Pull(t.Context(), "qwen2.5:0.5b", nil); err != nil {
		t.Errorf("Pull(nil progress) = %v, want nil", err)
	}
}

func TestPullErrors(t *testing.T) {
	status := func(code int, body string) func(http.ResponseWriter, *http.Request) {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			w.Write([]byte(body))
		}
	}
	stream := func(lines ...any) func(http.ResponseWriter, *http.Request) {
		return func(w http.ResponseWriter, _ *http.Request) { ndjson(w, lines...) }
	}
	manifest := api.ProgressResponse{Status: "pulling manifest"}
	tests := []struct {
		name     string
		model    string
		pull     func(http.ResponseWriter, *http.Request)
		want     error
		wantMsg  string // a substring of the error message
		requests int    // /api/pull requests expected
	}{
		{"invalid name", "Bad Name!!", nil, models.ErrInvalidRequest, "not a valid model name", 0},
		{"empty name", "", nil, models.ErrInvalidRequest, "not a valid model name", 0},
		{"refused by Ollama", "qwen2.5", status(400, `{"error":"invalid model name"}`), models.ErrInvalidRequest, "invalid model name", 1},
		{"not in the registry", "keel-no-such-model", stream(manifest, `{"error":"pull model manifest: file does not exist"}`), models.ErrModelNotFound, "https://ollama.com/search", 1},
		{"registry unreachable", "qwen2.5", stream(manifest,
			`{"error":"pull model manifest: Get \"https://registry.ollama.ai/v2/library/qwen2.5/manifests/latest\": dial tcp: lookup registry.ollama.ai: no such host"}`),
			models.ErrUnavailable, "internet connection", 1},
		{"failed part way", "qwen2.5", stream(manifest, pullLines[1], `{"error":"max retries exceeded: unexpected EOF"}`), models.ErrUnavailable, "pull again", 1},
		{"stream cut before success", "qwen2.5", stream(pullLines[:4]...), models.ErrUnavailable, "ended before the pull completed", 1},
		{"Ollama failing", "qwen2.5", status(500, `{"error":"disk full"}`), models.ErrUnavailable, "server log", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			if tt.pull != nil {
				f.pull = tt.pull
			}
			p := f.provider(t, Config{})
			err := p.Pull(t.Context(), tt.model, nil)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Pull(%q) = %v, want %v saying %q", tt.model, err, tt.want, tt.wantMsg)
			}
			if n := f.count("/api/pull"); n != tt.requests {
				t.Errorf("Pull(%q) sent %d /api/pull requests, want %d", tt.model, n, tt.requests)
			}
		})
	}
}

// TestPullNamesAsOllama checks that the local name check agrees with the
// one Ollama's pull handler makes, on names of every shape.
func TestPullNamesAsOllama(t *testing.T) {
	for _, name := range []string{"qwen2.5:0.5b", "llama3.2", "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", "user/model:tag"} {
		if !model.ParseName(name).IsValid() {
			t.Fatalf("%q is not a valid name to Ollama; fix the test", name)
		}
		p := newFake(t).provider(t, Config{})
		if err := p.Pull(t.Context(), name, nil); err != nil {
			t.Errorf("Pull(%q) = %v, want nil", name, err)
		}
	}
}

func TestPullOllamaDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p, err := New(Config{Host: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	err = p.Pull(t.Context(), "qwen2.5:0.5b", nil)
	if !errors.Is(err, models.ErrUnavailable) || !strings.Contains(err.Error(), "ollama serve") || !strings.Contains(err.Error(), "OLLAMA_HOST") {
		t.Errorf("Pull() with Ollama down = %v, want ErrUnavailable saying to start Ollama or set OLLAMA_HOST", err)
	}
}

// TestPullCancel cancels a pull mid-stream: Pull returns the context's
// error and Ollama sees the request end.
func TestPullCancel(t *testing.T) {
	f := newFake(t)
	ended := make(chan struct{})
	f.pull = func(w http.ResponseWriter, r *http.Request) {
		ndjson(w, pullLines[:2]...)
		<-r.Context().Done()
		close(ended)
	}
	p := f.provider(t, Config{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- p.Pull(ctx, "qwen2.5:0.5b", func(pp PullProgress) {
			if pp.Total > 0 {
				cancel()
			}
		})
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Pull() after cancel = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Pull() did not return within 5s of cancel")
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not see the pull request end")
	}
}

// TestPullRefreshesShow checks that a pull that replaces a model makes
// Show report the new model at once, not after the cache expires.
func TestPullRefreshesShow(t *testing.T) {
	f := newFake(t)
	p := f.provider(t, Config{})
	if info, err := p.Show(t.Context(), "tiny"); err != nil || info.Has(models.CapTools) {
		t.Fatalf("Show(tiny) = %+v, %v; want it without tools", info, err)
	}
	f.mu.Lock()
	f.models["tiny"] = f.models["tools"]
	f.mu.Unlock()
	if err := p.Pull(t.Context(), "tiny", nil); err != nil {
		t.Fatal(err)
	}
	if info, err := p.Show(t.Context(), "tiny"); err != nil || !info.Has(models.CapTools) {
		t.Errorf("Show(tiny) after pull = %+v, %v; want the pulled model, with tools", info, err)
	}
}

// TestRealPullUnknownModel pulls a model no registry has from the real
// Ollama. Without internet access Ollama cannot reach its registry;
// with it, the registry answers that there is no such model. Either way
// the error says so, and the provider goes on working.
func TestRealPullUnknownModel(t *testing.T) {
	p, _, tiny, _ := realOllama(t)
	var statuses []string
	err := p.Pull(t.Context(), "keel-no-such-model-7f3a", func(pp PullProgress) { statuses = append(statuses, pp.Status) })
	switch {
	case errors.Is(err, models.ErrModelNotFound):
		if !strings.Contains(err.Error(), "no model of that name") {
			t.Errorf("Pull(unknown) = %v, want it to say the registry has no such model", err)
		}
	case errors.Is(err, models.ErrUnavailable):
		if !strings.Contains(err.Error(), "could not get the model from its registry") {
			t.Errorf("Pull(unknown) = %v, want it to say Ollama cannot reach its registry", err)
		}
	default:
		t.Fatalf("Pull(unknown) = %v, want ErrModelNotFound or ErrUnavailable", err)
	}
	t.Logf("Pull(unknown) = %v (progress %q)", err, statuses)
	if _, err := p.Show(t.Context(), tiny); err != nil {
		t.Errorf("Show(%s) after the failed pull = %v", tiny, err)
	}
}
