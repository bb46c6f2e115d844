package ollama

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/ollama/ollama/api"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
)

func TestModelsFake(t *testing.T) {
	f := newFake(t)
	p := f.provider(t, Config{})
	for range 2 {
		got, err := p.Models(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		want := []models.ModelInfo{
			{Name: "tiny", Provider: "ollama", Family: "llama", Size: 4, ContextLength: 4096,
				Capabilities: []models.Capability{models.CapCompletion, models.CapStructured}},
			{Name: "tools", Provider: "ollama", Family: "llama", Size: 5, ContextLength: 2048,
				Capabilities: []models.Capability{models.CapCompletion, models.CapTools, models.CapStructured}},
		}
		byName := func(a, b models.ModelInfo) bool { return a.Name < b.Name }
		if diff := cmp.Diff(want, got, cmpopts.SortSlices(byName)); diff != "" {
			t.Errorf("Models() mismatch (-want +got):\n%s", diff)
		}
	}
	if n := f.count("/api/show"); n != 2 {
		t.Errorf("/api/show called %d times for 2 models listed twice, want 2 (cached)", n)
	}
}

func TestChatNativeTools(t *testing.T) {
	f := newFake(t)
	f.lines = []any{
		chunk("Let me"),
		chunk(" look."),
		api.ChatResponse{Message: api.Message{Role: "assistant", ToolCalls: []api.ToolCall{
			{Function: api.ToolCallFunction{Name: "search", Arguments: args(t, `{"q":"go"}`)}},
		}}},
		done("stop", 31, 7),
	}
	p := f.provider(t, Config{})
	req := models.ChatRequest{
		Model: "tools",
		Messages: []models.Message{
			{Role: models.RoleSystem, Content: "sys"},
			{Role: models.RoleUser, Content: "find go"},
			{Role: models.RoleAssistant, ToolCalls: []keel.ToolCall{{ID: "c0", Name: "search", Arguments: json.RawMessage(`{"q":"golang"}`)}}},
			{Role: models.RoleTool, ToolCallID: "c0", ToolName: "search", Content: "nothing"},
		},
		Tools: testTools,
	}
	var deltas []string
	resp, err := p.Chat(t.Context(), req, func(d models.Delta) { deltas = append(deltas, d.Content) })
	if err != nil {
		t.Fatalf("Chat() error = %v", err)
	}

	sent := f.lastChat(t)
	wantSent := decode(t, `{
		"model":"tools","stream":true,"keep_alive":"5m0s","truncate":false,"shift":false,
		"options":{"num_ctx":2048,"num_predict":512},
		"messages":[
			{"role":"system","content":"sys"},
			{"role":"user","content":"find go"},
			{"role":"assistant","content":"","tool_calls":[{"id":"c0","function":{"index":0,"name":"search","arguments":{"q":"golang"}}}]},
			{"role":"tool","content":"nothing","tool_name":"search","tool_call_id":"c0"}],
		"tools":[
			{"type":"function","function":{"name":"search","description":"Searches the web.","parameters":{"type":"object","required":["q"],"properties":{"q":{"type":"string"}}}}},
			{"type":"function","function":{"name":"now","description":"Tells the time.","parameters":{"type":"object","properties":{}}}}]
	}`)
	if diff := cmp.Diff(wantSent, any(sent)); diff != "" {
		t.Errorf("request sent mismatch (-want +got):\n%s", diff)
	}

	// One delta per chunk: those without content (the tool call, done)
	// still tell the caller the model is generating.
	if got := strings.Join(deltas, ""); got != "Let me look." || len(deltas) != 4 {
		t.Errorf("deltas = %q, want [Let me,  look., \"\", \"\"]", deltas)
	}
	if len(resp.Message.ToolCalls) != 1 || !strings.HasPrefix(resp.Message.ToolCalls[0].ID, "call_") {
		t.Fatalf("Chat() tool calls = %+v, want one with a generated ID", resp.Message.ToolCalls)
	}
	want := models.ChatResponse{
		Model: "tools",
		Message: models.Message{Role: models.RoleAssistant, Content: "Let me look.", ToolCalls: []keel.ToolCall{
			{ID: resp.Message.ToolCalls[0].ID, Name: "search", Arguments: json.RawMessage(`{"q":"go"}`)},
		}},
		Usage:        models.Usage{PromptTokens: 31, CompletionTokens: 7},
		FinishReason: "stop",
	}
	if diff := cmp.Diff(want, resp); diff != "" {
		t.Errorf("Chat() mismatch (-want +got):\n%s", diff)
	}
}

func TestChatSchemaTools(t *testing.T) {
	tests := []struct {
		name       string
		reply      []string // content fragments
		reason     string
		wantCall   string // tool name, "" for none
		wantArgs   string
		wantAnswer string
	}{
		{"tool call", []string{`{ "tool" : "sea`, `rch" , "arguments" : `, `{ "q" : "go" }`, " } "}, "stop", "search", `{"q":"go"}`, ""},
		{"answer", []string{`{"answer":`, `"Paris is in France."}`}, "stop", "", "", "Paris is in France."},
		{"cut at the token cap", []string{`{"tool":"search","argu`}, "length", "", "", `{"tool":"search","argu`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			for _, c := range tt.reply {
				f.lines = append(f.lines, chunk(c))
			}
			f.lines = append(f.lines, done(tt.reason, 50, 20))
			p := f.provider(t, Config{NumPredict: 64, KeepAlive: time.Minute})
			req := models.ChatRequest{
				Model: "tiny",
				Messages: []models.Message{
					{Role: models.RoleUser, Content: "find go"},
					{Role: models.RoleAssistant, ToolCalls: []keel.ToolCall{{ID: "c0", Name: "now", Arguments: json.RawMessage(`{}`)}}},
					{Role: models.RoleTool, ToolCallID: "c0", ToolName: "now", Content: "noon"},
				},
				Tools: testTools,
			}
			var deltas strings.Builder
			resp, err := p.Chat(t.Context(), req, func(d models.Delta) { deltas.WriteString(d.Content) })
			if err != nil {
				t.Fatalf("Chat() error = %v", err)
			}

			sent := f.lastChat(t)
			if _, ok := sent["tools"]; ok {
				t.Errorf("request sent tools %v to a model without the tools capability", sent["tools"])
			}
			schema, _ := toolChoiceSchema(testTools)
			if diff := cmp.Diff(decode(t, string(schema)), sent["format"]); diff != "" {
				t.Errorf("format sent mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(decode(t, `{"num_ctx":2048,"num_predict":64}`), sent["options"]); diff != "" {
				t.Errorf("options sent mismatch (-want +got):\n%s", diff)
			}
			if sent["keep_alive"] != "1m0s" {
				t.Errorf("keep_alive sent = %v, want 1m0s", sent["keep_alive"])
			}
			msgs, _ := json.Marshal(sent["messages"])
			wantMsgs := []api.Message{
				{Role: "system", Content: toolInstruction(testTools)},
				{Role: "user", Content: "find go"},
				{Role: "assistant", Content: `{"tool":"now","arguments":{}}`},
				{Role: "user", Content: "Result of tool now (call c0):\nnoon"},
			}
			wantJSON, _ := json.Marshal(wantMsgs)
			if diff := cmp.Diff(decode(t, string(wantJSON)), decode(t, string(msgs))); diff != "" {
				t.Errorf("messages sent mismatch (-want +got):\n%s", diff)
			}

			if deltas.String() != strings.Join(tt.reply, "") {
				t.Errorf("deltas = %q, want the raw reply %q", deltas.String(), strings.Join(tt.reply, ""))
			}
			if resp.FinishReason != tt.reason || resp.Usage != (models.Usage{PromptTokens: 50, CompletionTokens: 20}) {
				t.Errorf("Chat() finish %q usage %+v, want %q {50 20}", resp.FinishReason, resp.Usage, tt.reason)
			}
			if tt.wantCall == "" {
				if len(resp.Message.ToolCalls) != 0 || resp.Message.Content != tt.wantAnswer {
					t.Errorf("Chat() = %+v, want content %q and no calls", resp.Message, tt.wantAnswer)
				}
				return
			}
			if len(resp.Message.ToolCalls) != 1 || resp.Message.Content != "" {
				t.Fatalf("Chat() = %+v, want one tool call and no content", resp.Message)
			}
			if c := resp.Message.ToolCalls[0]; c.Name != tt.wantCall || string(c.Arguments) != tt.wantArgs || c.ID == "" {
				t.Errorf("Chat() call = %+v (%s), want %s(%s)", c, c.Arguments, tt.wantCall, tt.wantArgs)
			}
		})
	}
}

func TestChatOptions(t *testing.T) {
	format := json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}}}`)
	tests := []struct {
		name string
		cfg  Config
		req  models.ChatRequest
		want string // JSON of the fields checked
	}{
		{"defaults", Config{}, models.ChatRequest{Model: "tiny"},
			`{"keep_alive":"5m0s","options":{"num_ctx":2048,"num_predict":512}}`},
		{"sampling", Config{}, models.ChatRequest{Model: "tiny", Temperature: new(0.0), Seed: new(42)},
			`{"keep_alive":"5m0s","options":{"num_ctx":2048,"num_predict":512,"temperature":0,"seed":42}}`},
		{"one thread", Config{NumThread: 1}, models.ChatRequest{Model: "tiny"},
			`{"keep_alive":"5m0s","options":{"num_ctx":2048,"num_predict":512,"num_thread":1}}`},
		{"max tokens wins", Config{NumPredict: 100}, models.ChatRequest{Model: "tiny", MaxTokens: 7},
			`{"keep_alive":"5m0s","options":{"num_ctx":2048,"num_predict":7}}`},
		{"no cap, keep loaded", Config{NumPredict: -1, KeepAlive: -1}, models.ChatRequest{Model: "tiny"},
			`{"keep_alive":-1,"options":{"num_ctx":2048,"num_predict":-1}}`},
		{"format as is", Config{}, models.ChatRequest{Model: "tiny", Format: format},
			`{"keep_alive":"5m0s","options":{"num_ctx":2048,"num_predict":512},"format":{"type":"object","properties":{"n":{"type":"integer"}}}}`},
		{"format wins over schema tools", Config{}, models.ChatRequest{Model: "tiny", Format: format, Tools: testTools},
			`{"keep_alive":"5m0s","options":{"num_ctx":2048,"num_predict":512},"format":{"type":"object","properties":{"n":{"type":"integer"}}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.lines = []any{chunk("{}"), done("stop", 1, 1)}
			p := f.provider(t, tt.cfg)
			tt.req.Messages = []models.Message{{Role: models.RoleUser, Content: "hi"}}
			resp, err := p.Chat(t.Context(), tt.req, nil)
			if err != nil {
				t.Fatalf("Chat() error = %v", err)
			}
			if resp.Message.Content != "{}" {
				t.Errorf("Chat() content = %q, want {}", resp.Message.Content)
			}
			sent := f.lastChat(t)
			got := map[string]any{"keep_alive": sent["keep_alive"], "options": sent["options"]}
			if v, ok := sent["format"]; ok {
				got["format"] = v
			}
			if diff := cmp.Diff(decode(t, tt.want), any(got)); diff != "" {
				t.Errorf("request mismatch (-want +got):\n%s", diff)
			}
			if msgs := sent["messages"].([]any); len(msgs) != 1 {
				t.Errorf("messages sent = %v, want only the user's", msgs)
			}
		})
	}
}

func TestErrorsFake(t *testing.T) {
	status := func(code int, body string) func(http.ResponseWriter, *http.Request) {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			w.Write([]byte(body))
		}
	}
	tests := []struct {
		name  string
		model string
		reply func(http.ResponseWriter, *http.Request)
		want  error
	}{
		{"show 404", "missing", nil, models.ErrModelNotFound},
		{"chat 404", "tiny", status(404, `{"error":"model 'tiny' not found"}`), models.ErrModelNotFound},
		{"400", "tiny", status(400, `{"error":"\"tiny\" does not support tools"}`), models.ErrInvalidRequest},
		{"500 bad schema", "tiny", status(500, `{"error":"invalid JSON schema in format"}`), models.ErrInvalidRequest},
		{"500 bad format", "tiny", status(500, `{"error":"invalid format: \"yaml\"; expected \"json\" or a valid JSON Schema object"}`), models.ErrInvalidRequest},
		{"500", "tiny", status(500, `{"error":"llama runner process has terminated"}`), models.ErrUnavailable},
		{"503 not JSON", "tiny", status(503, `busy`), models.ErrUnavailable},
		{"error after content", "tiny", func(w http.ResponseWriter, _ *http.Request) {
			ndjson(w, chunk("Once"), `{"error":"runner crashed"}`)
		}, models.ErrUnavailable},
		{"stream cut before done", "tiny", func(w http.ResponseWriter, _ *http.Request) {
			ndjson(w, chunk("Once"), chunk(" upon"))
		}, models.ErrUnavailable},
		{"empty model", "", nil, models.ErrInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			if tt.reply != nil {
				f.reply = tt.reply
			}
			p := f.provider(t, Config{})
			_, err := p.Chat(t.Context(), models.ChatRequest{Model: tt.model, Messages: []models.Message{{Role: models.RoleUser, Content: "hi"}}}, nil)
			if !errors.Is(err, tt.want) {
				t.Errorf("Chat() error = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestErrorKinds(t *testing.T) {
	tests := []struct {
		name  string
		reply func(http.ResponseWriter, *http.Request)
		want  models.Kind
	}{
		{"429", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, `{"error":"server busy"}`, 429) }, models.KindRateLimited},
		{"500", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, `{"error":"runner died"}`, 500) }, models.KindOverloaded},
		{"401", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, `{"error":"no"}`, 401) }, models.KindAuth},
		{"stream cut", func(w http.ResponseWriter, _ *http.Request) { ndjson(w, chunk("Once")) }, models.KindNetwork},
		// Ollama v0.17.4's words for a runner that died: at load, before
		// the reply, during it.
		{"runner died at load", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":"llama runner process has terminated: signal: segmentation fault (core dumped)"}`, 500)
		}, models.KindCrashed},
		{"runner died before reply", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":"model runner has unexpectedly stopped, this may be due to resource limitations or an internal error, check ollama server logs for details"}`, 500)
		}, models.KindCrashed},
		{"runner died mid-reply", func(w http.ResponseWriter, _ *http.Request) {
			ndjson(w, chunk("Once"), `{"error":"an error was encountered while running the model: unexpected EOF"}`)
		}, models.KindCrashed},
		{"prompt over num_ctx", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":"the input length exceeds the context length"}`, 400)
		}, models.KindContextTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.reply = tt.reply
			_, err := f.provider(t, Config{}).Chat(t.Context(), hi("tiny"), nil)
			if got := models.KindOf(err); got != tt.want {
				t.Errorf("Chat() error = %v, kind %q; want %q", err, got, tt.want)
			}
		})
	}
}

// TestNumCtxSizedForRequest: num_ctx covers the prompt and the reply,
// grows in powers of two, never shrinks for a model (a change reloads
// it), and a prompt that cannot fit is refused before anything is sent.
func TestNumCtxSizedForRequest(t *testing.T) {
	f := newFake(t)
	f.lines = []any{chunk("ok"), done("stop", 1, 1)}
	p := f.provider(t, Config{})
	send := func(bytes int) (int, error) {
		req := hi("tiny")
		req.Messages[0].Content = strings.Repeat("x", bytes)
		if _, err := p.Chat(t.Context(), req, nil); err != nil {
			return 0, err
		}
		opts := f.lastChat(t)["options"].(map[string]any)
		return int(opts["num_ctx"].(float64)), nil
	}
	for _, step := range []struct{ bytes, want int }{{100, 2048}, {6000, 4096}, {100, 4096}} {
		got, err := send(step.bytes)
		if err != nil || got != step.want {
			t.Errorf("prompt of %d bytes: num_ctx %d, %v; want %d", step.bytes, got, err, step.want)
		}
	}
	before := f.count("/api/chat")
	_, err := send(13000) // about 4300 tokens for a 4096-token model
	if !errors.Is(err, models.ErrContextTooLong) || !strings.Contains(err.Error(), "nothing was sent") {
		t.Errorf("too long a prompt: %v, want ErrContextTooLong", err)
	}
	if f.count("/api/chat") != before {
		t.Errorf("Ollama received the prompt that cannot fit")
	}
}

func TestModelNotFoundSuggestsPull(t *testing.T) {
	p := newFake(t).provider(t, Config{})
	_, err := p.Chat(t.Context(), models.ChatRequest{Model: "llama9", Messages: []models.Message{{Role: models.RoleUser, Content: "hi"}}}, nil)
	var se api.StatusError
	if !errors.Is(err, models.ErrModelNotFound) || !errors.As(err, &se) || !strings.Contains(err.Error(), "keel models pull llama9") {
		t.Errorf("Chat(unknown) error = %v, want ErrModelNotFound wrapping the StatusError and suggesting `keel models pull llama9`", err)
	}
}

// TestClosedPort needs no Ollama: nothing listens on the port.
func TestClosedPort(t *testing.T) {
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
	_, err = p.Models(t.Context())
	if !errors.Is(err, models.ErrUnavailable) || !strings.Contains(err.Error(), "ollama serve") || !strings.Contains(err.Error(), addr) {
		t.Errorf("Models() error = %v, want ErrUnavailable naming %s and suggesting `ollama serve`", err, addr)
	}
	_, err = p.Chat(t.Context(), models.ChatRequest{Model: "tiny", Messages: []models.Message{{Role: models.RoleUser, Content: "hi"}}}, nil)
	if !errors.Is(err, models.ErrUnavailable) {
		t.Errorf("Chat() error = %v, want ErrUnavailable", err)
	}
}

// TestCancelDrains checks that a cancelled call returns at once while its
// reply is still read to the end, so Ollama never sees a disconnect
// mid-stream (see Config.CancelDrain).
func TestCancelDrains(t *testing.T) {
	f := newFake(t)
	release := make(chan struct{})
	served := make(chan error, 1)
	f.reply = func(w http.ResponseWriter, r *http.Request) {
		ndjson(w, chunk("Once"))
		<-release
		for range 50 {
			ndjson(w, chunk(" more"))
		}
		ndjson(w, done("length", 3, 51))
		served <- r.Context().Err()
	}
	p := f.provider(t, Config{})
	ctx, cancel := context.WithCancel(t.Context())
	deltas := 0
	start := time.Now()
	_, err := p.Chat(ctx, hi("tiny"), func(models.Delta) {
		deltas++
		cancel()
	})
	if !errors.Is(err, context.Canceled) || deltas != 1 || time.Since(start) > time.Second {
		t.Errorf("Chat() = %v after %d deltas in %v, want context.Canceled at once after 1", err, deltas, time.Since(start))
	}
	close(release)
	if err := <-served; err != nil {
		t.Errorf("server saw the client go away (%v), want the reply drained", err)
	}
	start = time.Now()
	p.Close()
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close() took %v with no reply left to drain, want at once", d)
	}
}

func TestCloseEndsCallInFlight(t *testing.T) {
	f := newFake(t)
	f.reply = func(w http.ResponseWriter, r *http.Request) {
		ndjson(w, chunk("Once"))
		<-r.Context().Done()
	}
	p := f.provider(t, Config{CancelDrain: 50 * time.Millisecond})
	errc := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		_, err := p.Chat(t.Context(), hi("tiny"), func(models.Delta) { close(started) })
		errc <- err
	}()
	<-started
	p.Close()
	if err := <-errc; !errors.Is(err, models.ErrUnavailable) {
		t.Errorf("Chat() in flight during Close error = %v, want ErrUnavailable", err)
	}
}

func TestCancelDisconnects(t *testing.T) {
	tests := []struct {
		name    string
		drain   time.Duration
		close   bool // Close the provider right after the call
		atLeast time.Duration
	}{
		{"negative drain: at once", -1, false, 0},
		{"after the drain", 100 * time.Millisecond, false, 100 * time.Millisecond},
		{"on Close, after the drain", 100 * time.Millisecond, true, 100 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			serverSaw := make(chan time.Time, 1)
			f.reply = func(w http.ResponseWriter, r *http.Request) {
				ndjson(w, chunk("Once"))
				select {
				case <-r.Context().Done():
					serverSaw <- time.Now()
				case <-time.After(10 * time.Second):
					serverSaw <- time.Time{}
				}
			}
			p := f.provider(t, Config{CancelDrain: tt.drain})
			ctx, cancel := context.WithCancel(t.Context())
			// The drain timer starts when the call sees its context end,
			// which is no earlier than the moment of cancel: measure from there.
			var cancelled time.Time
			_, err := p.Chat(ctx, hi("tiny"), func(models.Delta) { cancelled = time.Now(); cancel() })
			returned := cancelled
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Chat() error = %v, want context.Canceled", err)
			}
			if tt.close {
				p.Close()
				if d := time.Since(returned); d < tt.atLeast {
					t.Errorf("Close() returned %v after the cancel, want it to wait for the drain (%v)", d, tt.atLeast)
				}
			}
			saw := <-serverSaw
			if d := saw.Sub(returned); saw.IsZero() || d < tt.atLeast || d > tt.atLeast+2*time.Second {
				t.Errorf("server saw the disconnect %v after the cancel, want about %v", d, tt.atLeast)
			}
		})
	}
}

func TestChatAfterClose(t *testing.T) {
	f := newFake(t)
	f.lines = []any{chunk("hi"), done("stop", 1, 1)}
	p := f.provider(t, Config{})
	p.Close()
	if _, err := p.Chat(t.Context(), hi("tiny"), nil); !errors.Is(err, models.ErrUnavailable) {
		t.Errorf("Chat() after Close error = %v, want ErrUnavailable", err)
	}
}

func hi(model string) models.ChatRequest {
	return models.ChatRequest{Model: model, Messages: []models.Message{{Role: models.RoleUser, Content: "hi"}}}
}

func args(t *testing.T, s string) api.ToolCallFunctionArguments {
	t.Helper()
	var a api.ToolCallFunctionArguments
	if err := json.Unmarshal([]byte(s), &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestCrashIsNotRetried: a runner crash is its own kind, which the router
// does not retry (each retry crashed the runner again).
func TestCrashIsNotRetried(t *testing.T) {
	f := newFake(t)
	f.reply = func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":"llama runner process has terminated: signal: segmentation fault"}`, 500)
	}
	r, err := models.NewRouter(models.RouterConfig{Providers: map[string]models.ProviderConfig{"ollama": {Provider: f.provider(t, Config{})}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Chat(t.Context(), hi("tiny"), nil)
	if models.KindOf(err) != models.KindCrashed || !errors.Is(err, models.ErrUnavailable) {
		t.Errorf("Chat() error = %v, want kind %s", err, models.KindCrashed)
	}
	if n := f.count("/api/chat"); n != 1 {
		t.Errorf("Ollama got %d chat requests, want 1: a crash is not retried", n)
	}
}

// TestFormatGrammarSafe: an output schema goes to Ollama without what
// crashes or defeats its grammar (the planner's 8 KiB maxLength, an id
// pattern), and one that does not compile is refused before sending.
func TestFormatGrammarSafe(t *testing.T) {
	f := newFake(t)
	f.lines = []any{chunk(`{"steps":[]}`), done("stop", 1, 1)}
	p := f.provider(t, Config{})
	req := hi("tiny")
	req.Format = json.RawMessage(`{"type":"object","additionalProperties":false,"required":["steps"],"properties":{"steps":{
		"type":"array","minItems":1,"maxItems":32,"items":{"type":"object","additionalProperties":false,"required":["id","goal"],"properties":{
			"id":{"type":"string","pattern":"^[A-Za-z0-9_-]{1,64}$"},
			"goal":{"type":"string","minLength":1,"maxLength":8192},
			"depends_on":{"type":"array","uniqueItems":true,"items":{"type":"string"}}}}}}}`)
	if _, err := p.Chat(t.Context(), req, nil); err != nil {
		t.Fatalf("Chat() error = %v", err)
	}
	want := `{"type":"object","additionalProperties":false,"required":["steps"],"properties":{"steps":{
		"type":"array","minItems":1,"maxItems":32,"items":{"type":"object","additionalProperties":false,"required":["id","goal"],"properties":{
			"id":{"type":"string"},
			"goal":{"type":"string","minLength":1},
			"depends_on":{"type":"array","items":{"type":"string"}}}}}}}`
	if diff := cmp.Diff(decode(t, want), f.lastChat(t)["format"]); diff != "" {
		t.Errorf("format sent (-want +got):\n%s", diff)
	}

	req.Format = json.RawMessage(`"json"`)
	if _, err := p.Chat(t.Context(), req, nil); err != nil || f.lastChat(t)["format"] != "json" {
		t.Errorf("Chat(format json) = %v, sent %v; want it as is", err, f.lastChat(t)["format"])
	}
	before := f.count("/api/chat")
	req.Format = json.RawMessage(`{"type":"object","properties":{"a":{"$ref":"#/nope"}}}`)
	if _, err := p.Chat(t.Context(), req, nil); !errors.Is(err, models.ErrInvalidRequest) || f.count("/api/chat") != before {
		t.Errorf("Chat(unresolvable schema) = %v after %d sends, want ErrInvalidRequest and nothing sent", err, f.count("/api/chat")-before)
	}
}

// TestPromptNeverCut: Ollama is asked not to cut the prompt; when it
// refuses one as longer than num_ctx, the provider counts that model's
// prompts higher (so num_ctx grows, or a prompt that cannot fit is
// refused before sending) and what Ollama reports calibrates it.
func TestPromptNeverCut(t *testing.T) {
	f := newFake(t)
	var refuse bool
	f.reply = func(w http.ResponseWriter, r *http.Request) {
		var req api.ChatRequest
		f.mu.Lock()
		json.Unmarshal([]byte(f.chats[len(f.chats)-1]), &req)
		f.mu.Unlock()
		if refuse && req.Options["num_ctx"].(float64) < 4096 {
			http.Error(w, `{"error":"the input length exceeds the context length"}`, 400)
			return
		}
		ndjson(w, chunk("ok"), done("stop", 1, 1))
	}
	p := f.provider(t, Config{})
	sent := func() map[string]any { return f.lastChat(t) }
	if _, err := p.Chat(t.Context(), hi("tiny"), nil); err != nil {
		t.Fatal(err)
	}
	if s := sent(); s["truncate"] != false || s["shift"] != false {
		t.Errorf("sent truncate %v, shift %v; want both false", s["truncate"], s["shift"])
	}

	// 3000 bytes: about 1000 tokens by the estimate, num_ctx 2048; Ollama
	// counts more and refuses, so the call goes again with 4096.
	refuse = true
	req := hi("tiny")
	req.Messages[0].Content = strings.Repeat("x", 3000)
	before := f.count("/api/chat")
	if _, err := p.Chat(t.Context(), req, nil); err != nil {
		t.Fatalf("Chat(3000 bytes) error = %v", err)
	}
	if n, ctx := f.count("/api/chat")-before, sent()["options"].(map[string]any)["num_ctx"]; n != 2 || ctx != 4096.0 {
		t.Errorf("Chat(3000 bytes) sent %d requests, the last with num_ctx %v; want 2, with 4096", n, ctx)
	}

	// The "tools" model holds 2048: a refusal is final, and then the same
	// prompt is refused before anything is sent.
	req.Model = "tools"
	_, err := p.Chat(t.Context(), req, nil)
	if !errors.Is(err, models.ErrContextTooLong) {
		t.Fatalf("Chat(tools, 3000 bytes) error = %v, want ErrContextTooLong", err)
	}
	before = f.count("/api/chat")
	if _, err := p.Chat(t.Context(), req, nil); !errors.Is(err, models.ErrContextTooLong) || f.count("/api/chat") != before {
		t.Errorf("Chat(tools, the same prompt again) = %v after %d sends; want ErrContextTooLong before sending", err, f.count("/api/chat")-before)
	}
}

// TestPromptCountCalibrates: prompt_eval_count above the estimate makes
// the provider count the model's prompts higher.
func TestPromptCountCalibrates(t *testing.T) {
	f := newFake(t)
	p := f.provider(t, Config{})
	req := hi("tools") // num_ctx 2048
	req.Messages[0].Content = strings.Repeat("x", 3000)
	est := models.EstimateTokens(req.Messages, nil)
	f.lines = []any{chunk("ok"), done("stop", est*2, 1)}
	if _, err := p.Chat(t.Context(), req, nil); err != nil {
		t.Fatalf("first Chat() error = %v", err)
	}
	before := f.count("/api/chat")
	req.Messages[0].Content = strings.Repeat("x", 4000) // 1342 by the estimate, twice that for this model
	if _, err := p.Chat(t.Context(), req, nil); !errors.Is(err, models.ErrContextTooLong) || f.count("/api/chat") != before {
		t.Errorf("Chat(over the calibrated limit) = %v after %d sends; want ErrContextTooLong before sending", err, f.count("/api/chat")-before)
	}
}

// TestChatRefusedBeforeSending: a request keel can tell is bad, or one
// whose context is already done, fails with its kind and reaches no
// /api/chat.
func TestChatRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	badSchema := []keel.ToolSpec{{Name: "bad", Description: "x", InputSchema: json.RawMessage(`[1]`)}}
	notJSON := []keel.ToolSpec{{Name: "bad", Description: "x", InputSchema: json.RawMessage(`{"type":`)}}
	badCall := []models.Message{
		{Role: models.RoleUser, Content: "hi"},
		{Role: models.RoleAssistant, ToolCalls: []keel.ToolCall{{ID: "c0", Name: "now", Arguments: json.RawMessage(`[1]`)}}},
	}
	tests := []struct {
		name string
		ctx  context.Context
		req  models.ChatRequest
		want error
	}{
		{"context already cancelled", cancelled, hi("tiny"), context.Canceled},
		{"native tool schema not an object", t.Context(), models.ChatRequest{Model: "tools", Messages: hi("").Messages, Tools: badSchema}, models.ErrInvalidRequest},
		{"schema-mode tool schema not JSON", t.Context(), models.ChatRequest{Model: "tiny", Messages: hi("").Messages, Tools: notJSON}, models.ErrInvalidRequest},
		{"native tool call arguments not an object", t.Context(), models.ChatRequest{Model: "tools", Messages: badCall, Tools: testTools}, models.ErrInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.lines = []any{chunk("hi"), done("stop", 1, 1)}
			_, err := f.provider(t, Config{}).Chat(tt.ctx, tt.req, nil)
			if !errors.Is(err, tt.want) {
				t.Errorf("Chat() error = %v, want %v", err, tt.want)
			}
			if n := f.count("/api/chat"); n != 0 {
				t.Errorf("/api/chat called %d times, want none", n)
			}
		})
	}
}

// TestChatSendsImages: a message's pictures reach Ollama as base64, on
// that message.
func TestChatSendsImages(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.lines = []any{chunk("a cat"), done("stop", 1, 1)}
	req := hi("tiny")
	req.Messages[0].Images = [][]byte{[]byte("PNG1"), []byte("PNG2")}
	if _, err := f.provider(t, Config{}).Chat(t.Context(), req, nil); err != nil {
		t.Fatal(err)
	}
	msgs := f.lastChat(t)["messages"].([]any)
	got := msgs[len(msgs)-1].(map[string]any)["images"]
	want := decode(t, `["UE5HMQ==","UE5HMg=="]`)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("images sent mismatch (-want +got):\n%s", diff)
	}
}

// TestModelsShowFails: a model deleted between /api/tags and /api/show
// is left out of the list; any other failure of /api/show fails Models
// with its kind.
func TestModelsShowFails(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.broken = map[string]int{"gone": http.StatusNotFound}
	p := f.provider(t, Config{})
	list, err := p.Models(t.Context())
	if err != nil {
		t.Fatalf("Models() with a deleted model: error = %v", err)
	}
	var names []string
	for _, m := range list {
		names = append(names, m.Name)
	}
	if diff := cmp.Diff([]string{"tiny", "tools"}, names, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("Models() names mismatch (-want +got):\n%s", diff)
	}

	f.mu.Lock()
	f.broken["sick"] = http.StatusInternalServerError
	f.mu.Unlock()
	if _, err := p.Models(t.Context()); !errors.Is(err, models.ErrUnavailable) {
		t.Errorf("Models() with /api/show failing: error = %v, want ErrUnavailable", err)
	}
}

func TestNewRefusesABadHost(t *testing.T) {
	t.Parallel()
	if p, err := New(Config{Host: "ftp://example.com"}); err == nil {
		p.Close()
		t.Errorf("New(Host ftp://example.com) = %v, want an error", p.Endpoint())
	}
}
