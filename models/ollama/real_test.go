package ollama

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/modelstest"
)

// These tests talk to a real Ollama, such as the one ../shared/ollama/start
// runs with its tiny models. They are skipped only when OLLAMA_HOST is
// unset.

// recorder is a RoundTripper that keeps the bodies of /api/chat requests,
// so a test can see what the provider sent to the real server.
type recorder struct {
	mu     sync.Mutex
	chats  []map[string]any
	embeds []map[string]any // /api/embed request bodies
}

func (rec *recorder) RoundTrip(r *http.Request) (*http.Response, error) {
	if (r.URL.Path == "/api/chat" || r.URL.Path == "/api/embed") && r.Body != nil {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		var m map[string]any
		json.Unmarshal(b, &m)
		rec.mu.Lock()
		if r.URL.Path == "/api/chat" {
			rec.chats = append(rec.chats, m)
		} else {
			rec.embeds = append(rec.embeds, m)
		}
		rec.mu.Unlock()
	}
	return http.DefaultTransport.RoundTrip(r)
}

func (rec *recorder) last(t *testing.T) map[string]any {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.chats) == 0 {
		t.Fatal("no /api/chat request recorded")
	}
	return rec.chats[len(rec.chats)-1]
}

// realOllama returns a provider for the server at OLLAMA_HOST, the
// recorder of its chat requests, and the completion-only and tools model
// names (KEEL_TEST_OLLAMA_MODEL, KEEL_TEST_OLLAMA_TOOLS_MODEL, default
// keel-tiny and keel-tiny-tools).
func realOllama(t *testing.T) (p *Provider, rec *recorder, tiny, tools string) {
	t.Helper()
	host := os.Getenv("OLLAMA_HOST")
	if host == "" {
		t.Skip("OLLAMA_HOST is unset; start a test server with ../shared/ollama/start")
	}
	rec = &recorder{}
	// One thread: the tiny models are quick on one, and several stall
	// each other on a busy machine (Config.NumThread).
	p, err := New(Config{Host: host, HTTPClient: &http.Client{Transport: rec}, NumThread: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	tiny, tools = os.Getenv("KEEL_TEST_OLLAMA_MODEL"), os.Getenv("KEEL_TEST_OLLAMA_TOOLS_MODEL")
	if tiny == "" {
		tiny = "keel-tiny"
	}
	if tools == "" {
		tools = "keel-tiny-tools"
	}
	return p, rec, tiny, tools
}

func TestRealModels(t *testing.T) {
	p, _, tiny, tools := realOllama(t)
	ms, err := p.Models(t.Context())
	if err != nil {
		t.Fatalf("Models() error = %v", err)
	}
	want := map[string][]models.Capability{
		tiny:  {models.CapCompletion, models.CapStructured},
		tools: {models.CapCompletion, models.CapTools, models.CapStructured},
	}
	for name, caps := range want {
		i := slices.IndexFunc(ms, func(m models.ModelInfo) bool { return m.Name == name })
		if i < 0 {
			t.Errorf("Models() = %v, want %s listed", ms, name)
			continue
		}
		m := ms[i]
		if !slices.Equal(m.Capabilities, caps) || m.ContextLength != 2048 || m.Provider != "ollama" || m.Size <= 0 {
			t.Errorf("Models() has %+v, want capabilities %v, context length 2048, provider ollama, a size", m, caps)
		}
	}
}

func TestRealChatStreams(t *testing.T) {
	p, rec, tiny, _ := realOllama(t)
	req := models.ChatRequest{
		Model:     tiny,
		Messages:  []models.Message{{Role: models.RoleUser, Content: "Once upon a time, there was a little cat."}},
		MaxTokens: 40,
	}
	var deltas []string
	start := time.Now()
	resp, err := p.Chat(t.Context(), req, func(d models.Delta) { deltas = append(deltas, d.Content) })
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("Chat() error = %v", err)
	}
	if got := strings.Join(deltas, ""); got != resp.Message.Content || resp.Message.Content == "" || len(deltas) < 2 {
		t.Errorf("Chat() streamed %d deltas joining to %q, content %q; want several, joining to the content", len(deltas), got, resp.Message.Content)
	}
	if resp.Usage.PromptTokens <= 0 || resp.Usage.CompletionTokens <= 0 || resp.Usage.CompletionTokens > 40 {
		t.Errorf("Chat() usage = %+v, want prompt > 0 and 0 < completion <= 40", resp.Usage)
	}
	if resp.FinishReason != "length" && resp.FinishReason != "stop" {
		t.Errorf("Chat() finish reason = %q, want length or stop", resp.FinishReason)
	}
	sent := rec.last(t)
	if opts, _ := sent["options"].(map[string]any); opts["num_ctx"] != float64(2048) || opts["num_predict"] != float64(40) {
		t.Errorf("options sent = %v, want num_ctx 2048 and num_predict 40", sent["options"])
	}
	t.Logf("%d deltas, usage %+v, finish %q, %v (%.0f tokens/s end to end)", len(deltas), resp.Usage, resp.FinishReason,
		elapsed, float64(resp.Usage.CompletionTokens)/elapsed.Seconds())
}

func TestRealCancel(t *testing.T) {
	p, _, tiny, _ := realOllama(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var at time.Time
	n := 0
	_, err := p.Chat(ctx, models.ChatRequest{
		Model:     tiny,
		Messages:  []models.Message{{Role: models.RoleUser, Content: "Once upon a time"}},
		MaxTokens: 100, // drained after the cancel: keep it short
	}, func(models.Delta) {
		if n++; n == 3 {
			at = time.Now()
			cancel()
		}
	})
	latency := time.Since(at)
	if n < 3 {
		t.Fatalf("Chat() streamed %d deltas (error %v), want at least 3 to cancel after", n, err)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Chat() error = %v, want context.Canceled", err)
	}
	if n != 3 {
		t.Errorf("Chat() delivered %d deltas, want none after the cancel at the 3rd", n)
	}
	if latency > time.Second {
		t.Errorf("Chat() returned %v after cancel, want promptly", latency)
	}
	t.Logf("returned %v after cancel", latency)
}

func TestRealUnknownModel(t *testing.T) {
	p, _, _, _ := realOllama(t)
	_, err := p.Chat(t.Context(), models.ChatRequest{Model: "keel-no-such-model", Messages: []models.Message{{Role: models.RoleUser, Content: "hi"}}}, nil)
	if !errors.Is(err, models.ErrModelNotFound) || !strings.Contains(err.Error(), "keel models pull keel-no-such-model") {
		t.Errorf("Chat(unknown model) error = %v, want ErrModelNotFound suggesting keel models pull", err)
	}
}

func TestRealInvalidFormat(t *testing.T) {
	p, _, tiny, _ := realOllama(t)
	_, err := p.Chat(t.Context(), models.ChatRequest{
		Model:    tiny,
		Messages: []models.Message{{Role: models.RoleUser, Content: "hi"}},
		Format:   json.RawMessage(`{"type":"object","properties":{"a":{"$ref":"#/nope"}}}`),
	}, nil)
	if !errors.Is(err, models.ErrInvalidRequest) {
		t.Errorf("Chat(unresolvable schema) error = %v, want ErrInvalidRequest", err)
	}
}

var realTools = []keel.ToolSpec{
	{
		Name:        "get_weather",
		Description: "Gets the weather forecast for a city.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string","description":"city name"},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city"]}`),
	},
	{
		Name:        "add",
		Description: "Adds two numbers.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"],"additionalProperties":false}`),
	},
}

// TestRealToolsWithoutNativeSupport offers tools to a model without the
// tools capability (Ollama refuses "tools" for it): the provider must go
// through the schema-constrained reply, and every reply must read as a
// call of an offered tool with valid arguments, or as an answer.
func TestRealToolsWithoutNativeSupport(t *testing.T) {
	p, rec, tiny, _ := realOllama(t)
	for _, prompt := range []string{"What is the weather in Paris?", "Add 2 and 3.", "Tell me a story about a dog.", "Lily had a ball."} {
		start := time.Now()
		var deltas int
		resp, err := p.Chat(t.Context(), models.ChatRequest{
			Model: tiny,
			Messages: []models.Message{
				{Role: models.RoleSystem, Content: "You are a helpful assistant."},
				{Role: models.RoleUser, Content: prompt},
			},
			Tools: realTools,
		}, func(models.Delta) { deltas++ })
		if err != nil {
			t.Fatalf("Chat(%q, tools) error = %v", prompt, err)
		}
		sent := rec.last(t)
		if _, ok := sent["tools"]; ok || sent["format"] == nil {
			t.Fatalf("Chat(%q) sent tools=%v format=%v, want no tools and a format", prompt, sent["tools"], sent["format"])
		}
		if deltas == 0 || resp.FinishReason != "stop" {
			t.Errorf("Chat(%q) streamed %d deltas, finish %q; want deltas and a complete reply", prompt, deltas, resp.FinishReason)
		}
		switch {
		case len(resp.Message.ToolCalls) > 0:
			for _, c := range resp.Message.ToolCalls {
				i := slices.IndexFunc(realTools, func(s keel.ToolSpec) bool { return s.Name == c.Name })
				if i < 0 {
					t.Errorf("Chat(%q) called %q, not an offered tool", prompt, c.Name)
					continue
				}
				if err := modelstest.CheckJSON(realTools[i].InputSchema, c.Arguments); err != nil {
					t.Errorf("Chat(%q) called %s with %s: %v", prompt, c.Name, c.Arguments, err)
				}
			}
			if resp.Message.Content != "" {
				t.Errorf("Chat(%q) content = %q alongside tool calls, want none", prompt, resp.Message.Content)
			}
		case strings.HasPrefix(strings.TrimSpace(resp.Message.Content), "{"):
			t.Errorf("Chat(%q) content = %q: the raw choice, not an answer", prompt, resp.Message.Content)
		}
		t.Logf("%q -> %s, usage %+v, %v", prompt, describe(resp.Message), resp.Usage, time.Since(start))
	}
}

func TestRealNativeTools(t *testing.T) {
	p, rec, _, tools := realOllama(t)
	resp, err := p.Chat(t.Context(), models.ChatRequest{
		Model:     tools,
		Messages:  []models.Message{{Role: models.RoleUser, Content: "What is the weather in Paris?"}},
		Tools:     realTools,
		MaxTokens: 64,
	}, nil)
	if err != nil {
		t.Fatalf("Chat(tools model) error = %v", err)
	}
	sent := rec.last(t)
	if got, _ := sent["tools"].([]any); len(got) != len(realTools) || sent["format"] != nil {
		t.Errorf("Chat(tools model) sent tools %v, format %v; want %d native tools and no format", sent["tools"], sent["format"], len(realTools))
	}
	if resp.Message.Content == "" && len(resp.Message.ToolCalls) == 0 {
		t.Errorf("Chat(tools model) = %+v, want content or tool calls", resp)
	}
	t.Logf("native tools reply: %s", describe(resp.Message))
}

func TestRealConformance(t *testing.T) {
	p, _, tiny, tools := realOllama(t)
	for _, m := range []string{tiny, tools} {
		t.Run(m, func(t *testing.T) { modelstest.TestProvider(t, p, m) })
	}
}

func describe(m models.Message) string {
	var parts []string
	for _, c := range m.ToolCalls {
		parts = append(parts, c.Name+string(c.Arguments))
	}
	if m.Content != "" {
		parts = append(parts, strconv.Quote(m.Content))
	}
	return strings.Join(parts, " ")
}

// TestRealToolSchemasOllamaCannotCompile offers tools whose schemas use
// keywords Ollama's grammar rejects (pattern, oneOf beside properties) or
// that crash its runner (a huge maxLength). The provider must still get a
// reply: it sends the grammar only what it handles.
func TestRealToolSchemasOllamaCannotCompile(t *testing.T) {
	p, _, tiny, _ := realOllama(t)
	hostile := []keel.ToolSpec{
		{Name: "fetch", Description: "Fetch a URL.", InputSchema: json.RawMessage(`{"type":"object","properties":{"url":{"type":"string","pattern":"^https?://"}},"required":["url"],"additionalProperties":false}`)},
		{Name: "writefile", Description: "Write a file.", InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string","maxLength":1048576},"old":{"type":"string"},"new":{"type":"string"}},"required":["path"],"oneOf":[{"required":["content"]},{"required":["old","new"]}],"additionalProperties":false}`)},
	}
	resp, err := p.Chat(t.Context(), models.ChatRequest{
		Model:     tiny,
		Messages:  []models.Message{{Role: models.RoleUser, Content: "Save a note."}},
		Tools:     hostile,
		MaxTokens: 64,
	}, nil)
	if err != nil {
		t.Fatalf("Chat with hostile tool schemas = %v", err)
	}
	t.Logf("reply: %s", describe(resp.Message))
	// The server is still healthy afterwards.
	if _, err := p.Chat(t.Context(), models.ChatRequest{Model: tiny, Messages: []models.Message{{Role: models.RoleUser, Content: "Hi."}}, MaxTokens: 8}, nil); err != nil {
		t.Fatalf("Chat after hostile schemas = %v", err)
	}
}

func TestRealEmbed(t *testing.T) {
	p, rec, tiny, _ := realOllama(t)
	resp, err := p.Embed(t.Context(), models.EmbedRequest{Model: tiny, Input: []string{"a cat", "a dog", "a cat"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Vectors) != 3 || len(resp.Vectors[0]) == 0 || len(resp.Vectors[0]) != len(resp.Vectors[1]) {
		t.Fatalf("Embed() = %d vectors, want 3 of one non-zero dimension", len(resp.Vectors))
	}
	if !slices.Equal(resp.Vectors[0], resp.Vectors[2]) || slices.Equal(resp.Vectors[0], resp.Vectors[1]) {
		t.Errorf("Embed(): equal inputs must give equal vectors and different inputs different ones")
	}
	rec.mu.Lock()
	sent := rec.embeds[len(rec.embeds)-1]
	rec.mu.Unlock()
	if opts, _ := sent["options"].(map[string]any); opts["num_thread"] != float64(1) {
		t.Errorf("embed options sent = %v, want num_thread 1 (Config.NumThread)", sent["options"])
	}
	if _, err := p.Embed(t.Context(), models.EmbedRequest{Model: "keel-no-such-model", Input: []string{"x"}}); !errors.Is(err, models.ErrModelNotFound) {
		t.Errorf("Embed(unknown model) error = %v, want ErrModelNotFound", err)
	}
	// One input goes through /api/embeddings, normalized by Embed: the
	// same vector as /api/embed's, to float32 rounding.
	for i, in := range []string{"a cat", "a dog"} {
		one, err := p.Embed(t.Context(), models.EmbedRequest{Model: tiny, Input: []string{in}})
		if err != nil {
			t.Fatalf("Embed(%q) error = %v", in, err)
		}
		if len(one.Vectors) != 1 || len(one.Vectors[0]) != len(resp.Vectors[i]) {
			t.Fatalf("Embed(%q) = %d vectors, want 1 of dimension %d", in, len(one.Vectors), len(resp.Vectors[i]))
		}
		for d, f := range one.Vectors[0] {
			if diff := math.Abs(float64(f - resp.Vectors[i][d])); diff > 1e-5 {
				t.Errorf("Embed(%q) alone, dimension %d = %v, want %v as in a batch (/api/embed)", in, d, f, resp.Vectors[i][d])
				break
			}
		}
	}
	if _, err := p.Embed(t.Context(), models.EmbedRequest{Model: "keel-no-such-model", Input: []string{"x", "y"}}); !errors.Is(err, models.ErrModelNotFound) {
		t.Errorf("Embed(unknown model, two inputs) error = %v, want ErrModelNotFound", err)
	}
}

// TestRealPromptTooLong: a prompt beyond the model's context is refused
// before anything reaches Ollama, which would otherwise cut it silently.
func TestRealPromptTooLong(t *testing.T) {
	p, rec, tiny, _ := realOllama(t)
	req := models.ChatRequest{Model: tiny, Messages: []models.Message{{Role: models.RoleUser, Content: strings.Repeat("lorem ipsum ", 2000)}}}
	_, err := p.Chat(t.Context(), req, nil)
	if !errors.Is(err, models.ErrContextTooLong) {
		t.Fatalf("Chat(24 KB prompt) error = %v, want ErrContextTooLong", err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.chats) != 0 {
		t.Errorf("the prompt that cannot fit was sent to Ollama")
	}
}

// TestRealStructured asks the real Ollama, through the router, for JSON
// that fits a schema: constrained decoding makes the first reply valid.
func TestRealStructured(t *testing.T) {
	p, rec, tiny, _ := realOllama(t)
	r, err := models.NewRouter(models.RouterConfig{Providers: map[string]models.ProviderConfig{"ollama": {Provider: p}}})
	if err != nil {
		t.Fatal(err)
	}
	const schema = `{"type":"object","properties":{"colour":{"type":"string","enum":["red","green","blue"]},"count":{"type":"integer","minimum":1,"maximum":9}},"required":["colour","count"],"additionalProperties":false}`
	req := models.ChatRequest{Model: tiny, MaxTokens: 64, Messages: []models.Message{{Role: models.RoleUser, Content: "Pick a colour and a count."}}}
	res, err := models.Structured(t.Context(), r, req, json.RawMessage(schema), 2)
	if err != nil {
		t.Fatalf("Structured() = %v after %+v", err, res.Attempts)
	}
	var v struct {
		Colour string
		Count  int
	}
	if err := json.Unmarshal(res.Value, &v); err != nil || v.Colour == "" || v.Count < 1 {
		t.Errorf("Structured() value %s does not fit the schema", res.Value)
	}
	if res.Response.Meta.Provider != "ollama" || res.Usage.CompletionTokens == 0 {
		t.Errorf("accounting = %+v, usage %+v", res.Response.Meta, res.Usage)
	}
	if f := rec.last(t)["format"]; f == nil {
		t.Errorf("the schema was not sent as Ollama's format (no constrained decoding)")
	}
}

// TestRealPlannerSchema sends the planner's kind of output schema (an
// 8 KiB maxLength, an id pattern, 32-item arrays of objects), which as
// is crashed Ollama's runner, through models.Structured: the runner must
// not crash, and the outcome is a schema-valid value or a clear
// invalid_output after the repairs.
func TestRealPlannerSchema(t *testing.T) {
	p, rec, tiny, _ := realOllama(t)
	r, err := models.NewRouter(models.RouterConfig{Providers: map[string]models.ProviderConfig{"ollama": {Provider: p}}})
	if err != nil {
		t.Fatal(err)
	}
	const schema = `{"type":"object","additionalProperties":false,"required":["steps"],"properties":{"steps":{
		"type":"array","minItems":1,"maxItems":32,"items":{"type":"object","additionalProperties":false,"required":["id","goal"],"properties":{
			"id":{"type":"string","pattern":"^[A-Za-z0-9_-]{1,64}$"},
			"goal":{"type":"string","minLength":1,"maxLength":8192},
			"tools":{"type":"array","uniqueItems":true,"items":{"type":"string","enum":["wordcount","fetch"]}},
			"depends_on":{"type":"array","uniqueItems":true,"items":{"type":"string"}},
			"retries":{"type":"integer","minimum":0,"maximum":5}}}}}}`
	req := models.ChatRequest{Model: tiny, MaxTokens: 64, Messages: []models.Message{
		{Role: models.RoleSystem, Content: "You plan. Reply with only the JSON plan."},
		{Role: models.RoleUser, Content: "Goal: count the words of a story."}}}
	res, err := models.Structured(t.Context(), r, req, json.RawMessage(schema), 2)
	switch k := models.KindOf(err); {
	case err == nil:
		t.Logf("plan: %s", res.Value)
	case k == models.KindInvalidOutput:
		t.Logf("no valid plan after %d replies (a tiny model): %v", len(res.Attempts), err)
	default:
		t.Fatalf("Structured(planner schema) = %v (kind %s), want a plan or invalid_output", err, k)
	}
	f, _ := json.Marshal(rec.last(t)["format"])
	if strings.Contains(string(f), "8192") || strings.Contains(string(f), "pattern") {
		t.Errorf("format sent = %s, want it without the big maxLength and the pattern", f)
	}
	if _, err := p.Chat(t.Context(), models.ChatRequest{Model: tiny, Messages: []models.Message{{Role: models.RoleUser, Content: "Hi."}}, MaxTokens: 8}, nil); err != nil {
		t.Fatalf("Chat after the planner schema = %v", err)
	}
}

// TestRealPromptNeverCut: a prompt the byte estimate says fits but the
// tiny model's tokenizer counts over num_ctx is refused by Ollama
// (context_too_long), never answered from its cut tail; after that the
// provider counts such prompts right and refuses them before sending,
// and every reply it does get counts at most num_ctx prompt tokens.
func TestRealPromptNeverCut(t *testing.T) {
	p, rec, tiny, _ := realOllama(t)
	story := strings.Repeat("Once upon a time, Lily found a big red ball in the park. ", 100) // 5.7 KB
	req := models.ChatRequest{Model: tiny, MaxTokens: 16, Messages: []models.Message{{Role: models.RoleUser, Content: story}}}
	if est := models.EstimateTokens(req.Messages, nil); est+16 >= 2048 {
		t.Fatalf("the story is %d tokens by the estimate; the test needs one that looks as if it fits", est)
	}
	resp, err := p.Chat(t.Context(), req, nil)
	if !errors.Is(err, models.ErrContextTooLong) {
		t.Fatalf("Chat(story over num_ctx by the model's count) = %+v, %v; want ErrContextTooLong (Ollama would cut it)", resp.Usage, err)
	}
	rec.mu.Lock()
	sent := len(rec.chats)
	rec.mu.Unlock()
	if _, err := p.Chat(t.Context(), req, nil); !errors.Is(err, models.ErrContextTooLong) {
		t.Fatalf("Chat(the same story again) = %v, want ErrContextTooLong", err)
	}
	rec.mu.Lock()
	if len(rec.chats) != sent {
		t.Errorf("the story known not to fit was sent again")
	}
	rec.mu.Unlock()
	// A third of it fits, and Ollama counts it under num_ctx.
	req.Messages[0].Content = story[:len(story)/3]
	resp, err = p.Chat(t.Context(), req, nil)
	if err != nil || resp.Usage.PromptTokens <= 0 || resp.Usage.PromptTokens > 2048 {
		t.Fatalf("Chat(a third of the story) = %+v, %v; want a reply counting at most 2048 prompt tokens", resp.Usage, err)
	}
	t.Logf("a third of the story: %d bytes, %d estimated, %d counted", len(req.Messages[0].Content), models.EstimateTokens(req.Messages, nil), resp.Usage.PromptTokens)
}
