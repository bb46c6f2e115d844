package ollama

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/types/model"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	// Providers use http.DefaultClient; its idle keep-alive connections
	// are not leaks, but a response body left open would be.
	http.DefaultClient.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// fake is an httptest server speaking the parts of Ollama's API the
// provider uses: /api/tags, /api/show, streamed NDJSON /api/chat,
// /api/pull, /api/embed and /api/embeddings.
type fake struct {
	srv *httptest.Server

	mu      sync.Mutex
	calls   map[string]int
	chats   []string                     // /api/chat request bodies
	pulls   []string                     // /api/pull request bodies
	embeds  []string                     // /api/embed request bodies
	legacy  []string                     // /api/embeddings request bodies
	models  map[string]*api.ShowResponse // by name without ":latest"
	digests map[string]string            // what /api/tags lists as each model's digest
	// tagsStatus, when set, is the status /api/tags fails with.
	tagsStatus int
	// broken lists models /api/tags lists beside models, each with the
	// status /api/show fails with for it.
	broken map[string]int
	// reply answers /api/chat; by default it streams lines.
	reply func(w http.ResponseWriter, r *http.Request)
	lines []any
	// pull answers /api/pull; by default it streams success.
	pull func(w http.ResponseWriter, r *http.Request)
	// embed answers /api/embed; by default with no embedding.
	embed func(w http.ResponseWriter, r *http.Request)
	// embeddings answers /api/embeddings; by default with no embedding.
	embeddings func(w http.ResponseWriter, r *http.Request)
}

func newFake(t *testing.T) *fake {
	f := &fake{
		calls: map[string]int{},
		models: map[string]*api.ShowResponse{
			"tiny": {
				Capabilities: []model.Capability{"completion"},
				ModelInfo:    map[string]any{"general.architecture": "llama", "llama.context_length": 4096},
				Details:      api.ModelDetails{Family: "llama"},
			},
			"tools": {
				Capabilities: []model.Capability{"completion", "tools"},
				ModelInfo:    map[string]any{"general.architecture": "llama", "llama.context_length": 8192},
				Parameters:   "num_ctx 2048",
				Details:      api.ModelDetails{Family: "llama"},
			},
		},
	}
	f.reply = func(w http.ResponseWriter, r *http.Request) { ndjson(w, f.lines...) }
	f.pull = func(w http.ResponseWriter, r *http.Request) { ndjson(w, api.ProgressResponse{Status: "success"}) }
	f.embed = func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(api.EmbedResponse{}) }
	f.embeddings = func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(api.EmbeddingResponse{}) }
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) provider(t *testing.T, cfg Config) *Provider {
	t.Helper()
	cfg.Host = f.srv.URL
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func (f *fake) count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[path]
}

// lastChat returns the last /api/chat request body, decoded.
func (f *fake) lastChat(t *testing.T) map[string]any {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.chats) == 0 {
		t.Fatal("no /api/chat request")
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(f.chats[len(f.chats)-1]), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func (f *fake) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.calls[r.URL.Path]++
	f.mu.Unlock()
	switch r.URL.Path {
	case "/api/tags":
		var list api.ListResponse
		f.mu.Lock()
		if f.tagsStatus != 0 {
			f.mu.Unlock()
			http.Error(w, `{"error":"tags failed"}`, f.tagsStatus)
			return
		}
		for name := range f.models {
			list.Models = append(list.Models, api.ListModelResponse{Name: name + ":latest", Model: name + ":latest", Size: int64(len(name)), Digest: f.digests[name]})
		}
		for name := range f.broken {
			list.Models = append(list.Models, api.ListModelResponse{Name: name + ":latest", Model: name + ":latest"})
		}
		f.mu.Unlock()
		json.NewEncoder(w).Encode(list)
	case "/api/show":
		var req api.ShowRequest
		json.Unmarshal(body, &req)
		f.mu.Lock()
		resp, ok := f.models[strings.TrimSuffix(req.Model, ":latest")]
		status := f.broken[strings.TrimSuffix(req.Model, ":latest")]
		f.mu.Unlock()
		if status != 0 {
			http.Error(w, `{"error":"show failed"}`, status)
			return
		}
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"error":"model '%s' not found"}`, req.Model)
			return
		}
		json.NewEncoder(w).Encode(resp)
	case "/api/chat":
		f.mu.Lock()
		f.chats = append(f.chats, string(body))
		f.mu.Unlock()
		f.reply(w, r)
	case "/api/pull":
		f.mu.Lock()
		f.pulls = append(f.pulls, string(body))
		f.mu.Unlock()
		f.pull(w, r)
	case "/api/embed":
		f.mu.Lock()
		f.embeds = append(f.embeds, string(body))
		f.mu.Unlock()
		f.embed(w, r)
	case "/api/embeddings":
		f.mu.Lock()
		f.legacy = append(f.legacy, string(body))
		f.mu.Unlock()
		f.embeddings(w, r)
	default:
		http.NotFound(w, r)
	}
}

// ndjson streams each value as one JSON line, flushing after each; a
// string is written as is.
func ndjson(w http.ResponseWriter, lines ...any) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	for _, l := range lines {
		if s, ok := l.(string); ok {
			io.WriteString(w, s+"\n")
		} else {
			b, _ := json.Marshal(l)
			w.Write(append(b, '\n'))
		}
		w.(http.Flusher).Flush()
	}
}

// chunk is a streamed content fragment.
func chunk(content string) api.ChatResponse {
	return api.ChatResponse{Model: "m", Message: api.Message{Role: "assistant", Content: content}}
}

// done is the final line of a stream.
func done(reason string, prompt, eval int) api.ChatResponse {
	return api.ChatResponse{Model: "m", Message: api.Message{Role: "assistant"}, Done: true, DoneReason: reason,
		Metrics: api.Metrics{PromptEvalCount: prompt, EvalCount: eval}}
}
