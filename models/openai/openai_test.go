package openai_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/modelstest"
	"github.com/keel-runtime/keel/models/openai"
	"github.com/keel-runtime/keel/models/openai/openaitest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	// Idle keep-alive connections of the default client are not leaks.
	http.DefaultClient.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const (
	testKey    = "sk-keel-test-0123456789abcdef"
	testKeyEnv = "KEEL_TEST_OPENAI_API_KEY"
)

var testModels = []openai.ModelConfig{
	{
		Name: openaitest.ChatModel, ContextLength: 8192, Family: "test",
		Capabilities: []models.Capability{models.CapCompletion, models.CapTools, models.CapStructured, models.CapVision},
		Price:        &models.Price{InputPerMTok: 1, OutputPerMTok: 2},
	},
	{Name: openaitest.EmbedModel, ContextLength: 512, Capabilities: []models.Capability{models.CapEmbedding}},
}

// newProvider returns a provider for srv: cfg with the server's URL and
// client and testModels filled in where unset.
func newProvider(t *testing.T, srv *openaitest.Server, cfg openai.Config) *openai.Provider {
	t.Helper()
	if cfg.BaseURL == "" {
		cfg.BaseURL = srv.URL()
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = srv.Client()
	}
	if cfg.Models == nil && !cfg.Discover {
		cfg.Models = testModels
	}
	p, err := openai.New(cfg)
	if err != nil {
		t.Fatalf("New(%+v) error = %v", cfg, err)
	}
	return p
}

// keyed returns a server requiring testKey and a provider sending it
// from testKeyEnv.
func keyed(t *testing.T, cfg openai.Config) (*openaitest.Server, *openai.Provider) {
	t.Helper()
	srv := openaitest.New(t)
	srv.SetKey(testKey)
	t.Setenv(testKeyEnv, testKey)
	cfg.APIKeyEnv = testKeyEnv
	return srv, newProvider(t, srv, cfg)
}

func hi(model string) models.ChatRequest {
	return models.ChatRequest{Model: model, Messages: []models.Message{{Role: models.RoleUser, Content: "hi"}}}
}

// chatPaths returns the paths of the requests srv received.
func paths(srv *openaitest.Server) []string {
	var out []string
	for _, r := range srv.Requests() {
		out = append(out, r.Method+" "+r.Path)
	}
	return out
}

func asError(t *testing.T, err error) *models.Error {
	t.Helper()
	e, ok := errors.AsType[*models.Error](err)
	if !ok {
		t.Fatalf("error = %v (%T), want a *models.Error", err, err)
	}
	return e
}

func TestConformance(t *testing.T) {
	srv, p := keyed(t, openai.Config{})
	modelstest.TestProvider(t, p, openaitest.ChatModel)

	chats := 0
	for _, r := range srv.Requests() {
		if r.Path != openaitest.ChatPath {
			continue
		}
		chats++
		if got := r.Header.Get("Authorization"); got != "Bearer "+testKey {
			t.Errorf("request %s has Authorization %q, want the key from $%s", r.Path, got, testKeyEnv)
		}
	}
	if chats < 8 {
		t.Errorf("the server saw %d chat requests, want the suite's (at least 8)", chats)
	}
}

func TestFaults(t *testing.T) {
	date := time.Now().Add(30 * time.Second).UTC().Format(http.TimeFormat)
	tests := []struct {
		name       string
		reply      openaitest.Reply
		streamOnly bool
		kind       models.Kind
		is         error
		status     int
		retryAfter [2]time.Duration // bounds, inclusive
		msg        string           // in the message
	}{
		{name: "429 Retry-After seconds", kind: models.KindRateLimited, is: models.ErrUnavailable, status: 429,
			reply: openaitest.Reply{Status: 429, Header: http.Header{"Retry-After": {"7"}},
				Error: &openaitest.APIError{Type: "requests", Code: "rate_limit_exceeded", Message: "Rate limit reached for requests"}},
			retryAfter: [2]time.Duration{7 * time.Second, 7 * time.Second}, msg: "Rate limit reached for requests); retry after 7s"},
		{name: "429 Retry-After date", kind: models.KindRateLimited, is: models.ErrUnavailable, status: 429,
			reply:      openaitest.Reply{Status: 429, Header: http.Header{"Retry-After": {date}}},
			retryAfter: [2]time.Duration{28 * time.Second, 30 * time.Second}},
		{name: "500", kind: models.KindOverloaded, is: models.ErrUnavailable, status: 500,
			reply: openaitest.Reply{Status: 500, Error: &openaitest.APIError{Type: "server_error", Message: "The server had an error"}},
			msg:   "The server had an error"},
		{name: "503 with Retry-After", kind: models.KindOverloaded, is: models.ErrUnavailable, status: 503,
			reply:      openaitest.Reply{Status: 503, Header: http.Header{"Retry-After": {"2"}}},
			retryAfter: [2]time.Duration{2 * time.Second, 2 * time.Second}},
		{name: "502 HTML from a proxy", kind: models.KindOverloaded, is: models.ErrUnavailable, status: 502,
			reply: openaitest.Reply{Status: 502, Body: "<html><body>502 Bad Gateway</body></html>"}, msg: "502 Bad Gateway"},
		{name: "408", kind: models.KindTimeout, is: models.ErrUnavailable, status: 408,
			reply: openaitest.Reply{Status: 408}},
		{name: "context_length_exceeded", kind: models.KindContextTooLong, is: models.ErrContextTooLong, status: 400,
			reply: openaitest.Reply{Status: 400, Error: &openaitest.APIError{Type: "invalid_request_error", Code: "context_length_exceeded",
				Message: "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."}},
			msg: "shorten"},
		{name: "llama.cpp context exceeded", kind: models.KindContextTooLong, is: models.ErrContextTooLong, status: 400,
			reply: openaitest.Reply{Status: 400, Error: &openaitest.APIError{Type: "exceed_context_size_error",
				Message: "the request exceeds the available context size"}}},
		{name: "400", kind: models.KindInvalidRequest, is: models.ErrInvalidRequest, status: 400,
			reply: openaitest.Reply{Status: 400, Error: &openaitest.APIError{Type: "invalid_request_error", Message: "Invalid value for 'temperature'"}},
			msg:   "Invalid value for 'temperature'"},
		{name: "404 model_not_found", kind: models.KindNotFound, is: models.ErrModelNotFound, status: 404,
			reply: openaitest.Reply{Status: 404, Error: &openaitest.APIError{Type: "invalid_request_error", Code: "model_not_found", Message: "The model does not exist"}}},
		{name: "invalid JSON body", kind: models.KindInvalidRequest, is: models.ErrInvalidRequest,
			reply: openaitest.Reply{Body: `{"id": "chatcmpl-1", "choices": [`}, msg: "not valid JSON"},
		{name: "invalid JSON in stream", streamOnly: true, kind: models.KindInvalidRequest, is: models.ErrInvalidRequest,
			reply: openaitest.Reply{Events: []string{`{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"Once"}}]}`, `{not json`, "[DONE]"}},
			msg:   "not valid JSON"},
		{name: "stream cut: connection closed", streamOnly: true, kind: models.KindNetwork, is: models.ErrUnavailable,
			reply: openaitest.Reply{Cut: openaitest.CutClose, CutAfter: 3}, msg: "broke"},
		{name: "stream cut: clean end", streamOnly: true, kind: models.KindNetwork, is: models.ErrUnavailable,
			reply: openaitest.Reply{Cut: openaitest.CutEnd, CutAfter: 3}, msg: "ended before the model finished"},
		{name: "stream cut: nothing sent", streamOnly: true, kind: models.KindNetwork, is: models.ErrUnavailable,
			reply: openaitest.Reply{Cut: openaitest.CutEnd, CutAfter: 0}},
		{name: "error event mid-stream", streamOnly: true, kind: models.KindOverloaded, is: models.ErrUnavailable,
			reply: openaitest.Reply{CutAfter: 2, StreamError: &openaitest.APIError{Type: "server_error", Message: "The model is overloaded"}},
			msg:   "The model is overloaded"},
		{name: "context exceeded mid-stream", streamOnly: true, kind: models.KindContextTooLong, is: models.ErrContextTooLong,
			reply: openaitest.Reply{CutAfter: 1, StreamError: &openaitest.APIError{Type: "invalid_request_error", Code: "context_length_exceeded", Message: "too long"}}},
	}
	for _, tt := range tests {
		for _, stream := range []bool{true, false} {
			if tt.streamOnly && !stream {
				continue
			}
			t.Run(fmt.Sprintf("%s/stream=%v", tt.name, stream), func(t *testing.T) {
				srv, p := keyed(t, openai.Config{})
				srv.Script(tt.reply)
				var onDelta func(models.Delta)
				if stream {
					onDelta = func(models.Delta) {}
				}
				_, err := p.Chat(t.Context(), hi(openaitest.ChatModel), onDelta)
				e := asError(t, err)
				if e.Kind != tt.kind || !errors.Is(err, tt.is) {
					t.Errorf("Chat() error = %v (kind %s), want kind %s wrapping %v", err, e.Kind, tt.kind, tt.is)
				}
				if e.Status != tt.status {
					t.Errorf("Chat() error status = %d, want %d", e.Status, tt.status)
				}
				if e.RetryAfter < tt.retryAfter[0] || e.RetryAfter > tt.retryAfter[1] {
					t.Errorf("Chat() error RetryAfter = %v, want in %v", e.RetryAfter, tt.retryAfter)
				}
				if e.Provider != "openai" || e.Model != openaitest.ChatModel {
					t.Errorf("Chat() error names provider %q model %q, want openai %s", e.Provider, e.Model, openaitest.ChatModel)
				}
				if !strings.Contains(err.Error(), tt.msg) {
					t.Errorf("Chat() error = %q, want it to contain %q", err, tt.msg)
				}
				if n := len(srv.Requests()); n != 1 {
					t.Errorf("the server saw %d requests, want 1 (no retry by the client)", n)
				}
			})
		}
	}
}

// closedURL returns the URL of a loopback port nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr + "/v1"
}

func TestServerDown(t *testing.T) {
	base := closedURL(t)
	p, err := openai.New(openai.Config{Name: "local", BaseURL: base, Local: true, Models: testModels})
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"Chat stream": func() error {
			_, err := p.Chat(t.Context(), hi(openaitest.ChatModel), func(models.Delta) {})
			return err
		},
		"Chat": func() error { _, err := p.Chat(t.Context(), hi(openaitest.ChatModel), nil); return err },
		"Embed": func() error {
			_, err := p.Embed(t.Context(), models.EmbedRequest{Model: openaitest.EmbedModel, Input: []string{"x"}})
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			err := call()
			if e := asError(t, err); e.Kind != models.KindNetwork || !errors.Is(err, models.ErrUnavailable) || !strings.Contains(err.Error(), base) {
				t.Errorf("%s error = %v, want KindNetwork wrapping ErrUnavailable naming %s", name, err, base)
			}
		})
	}

	t.Run("Models with Discover", func(t *testing.T) {
		d, err := openai.New(openai.Config{BaseURL: base, Discover: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Models(t.Context()); !errors.Is(err, models.ErrUnavailable) {
			t.Errorf("Models() with no declared model and the server down error = %v, want ErrUnavailable", err)
		}
		d, err = openai.New(openai.Config{BaseURL: base, Discover: true, Models: testModels})
		if err != nil {
			t.Fatal(err)
		}
		if ms, err := d.Models(t.Context()); err != nil || len(ms) != len(testModels) {
			t.Errorf("Models() with declared models and the server down = %d models, %v; want the %d declared", len(ms), err, len(testModels))
		}
	})
}

func TestDeadlines(t *testing.T) {
	const limit = 200 * time.Millisecond
	tests := []struct {
		name   string
		reply  openaitest.Reply
		stream bool
		cfg    openai.Config
		caller string // how the caller ends the call: "deadline", "cancel" or ""
		kind   models.Kind
		is     error
	}{
		{"slow first byte, caller deadline", openaitest.Reply{Delay: time.Minute}, true, openai.Config{},
			"deadline", models.KindTimeout, context.DeadlineExceeded},
		{"slow first byte, caller cancels", openaitest.Reply{Delay: time.Minute}, true, openai.Config{},
			"cancel", models.KindCancelled, context.Canceled},
		{"stalled stream, caller deadline", openaitest.Reply{Cut: openaitest.CutHang, CutAfter: 3}, true, openai.Config{},
			"deadline", models.KindTimeout, context.DeadlineExceeded},
		{"slow first byte, provider timeout", openaitest.Reply{Delay: time.Minute}, false, openai.Config{Timeout: limit},
			"", models.KindTimeout, models.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := openaitest.New(t)
			srv.Script(tt.reply)
			p := newProvider(t, srv, tt.cfg)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			switch tt.caller {
			case "deadline":
				ctx, cancel = context.WithTimeout(ctx, limit)
				defer cancel()
			case "cancel":
				time.AfterFunc(limit, cancel)
			}
			var onDelta func(models.Delta)
			if tt.stream {
				onDelta = func(models.Delta) {}
			}
			start := time.Now()
			_, err := p.Chat(ctx, hi(openaitest.ChatModel), onDelta)
			if d := time.Since(start); d > limit+2*time.Second {
				t.Errorf("Chat() returned after %v, want within 2s of the %v limit", d, limit)
			}
			if e := asError(t, err); e.Kind != tt.kind || !errors.Is(err, tt.is) {
				t.Errorf("Chat() error = %v, want kind %s wrapping %v", err, tt.kind, tt.is)
			}
		})
	}
}

func TestAPIKey(t *testing.T) {
	t.Run("sent as bearer", func(t *testing.T) {
		srv, p := keyed(t, openai.Config{})
		if _, err := p.Chat(t.Context(), hi(openaitest.ChatModel), nil); err != nil {
			t.Fatalf("Chat() error = %v", err)
		}
		if _, err := p.Embed(t.Context(), models.EmbedRequest{Model: openaitest.EmbedModel, Input: []string{"x"}}); err != nil {
			t.Fatalf("Embed() error = %v", err)
		}
		for _, r := range srv.Requests() {
			if got := r.Header.Get("Authorization"); got != "Bearer "+testKey {
				t.Errorf("%s Authorization = %q, want Bearer and the key", r.Path, got)
			}
		}
	})

	t.Run("refused, echoed by the server", func(t *testing.T) {
		srv, p := keyed(t, openai.Config{})
		wrong := "sk-wrong-key-which-must-not-leak"
		t.Setenv(testKeyEnv, wrong)
		_, err := p.Chat(t.Context(), hi(openaitest.ChatModel), func(models.Delta) {})
		if e := asError(t, err); e.Kind != models.KindAuth || e.Status != 401 {
			t.Errorf("Chat(wrong key) error = %v, want KindAuth with status 401", err)
		}
		if strings.Contains(err.Error(), wrong) || !strings.Contains(err.Error(), testKeyEnv) {
			t.Errorf("Chat(wrong key) error = %q, want it to name $%s and not hold the key", err, testKeyEnv)
		}
		if body := string(srv.Requests()[0].Body); strings.Contains(body, wrong) {
			t.Errorf("request body holds the key: %s", body)
		}
	})

	t.Run("env var unset: nothing sent", func(t *testing.T) {
		srv, p := keyed(t, openai.Config{Discover: true, Models: testModels})
		t.Setenv(testKeyEnv, "")
		calls := map[string]func() error{
			"Chat": func() error {
				_, err := p.Chat(t.Context(), hi(openaitest.ChatModel), func(models.Delta) {})
				return err
			},
			"Embed": func() error {
				_, err := p.Embed(t.Context(), models.EmbedRequest{Model: openaitest.EmbedModel, Input: []string{"x"}})
				return err
			},
		}
		for name, call := range calls {
			err := call()
			if e := asError(t, err); e.Kind != models.KindAuth || !strings.Contains(err.Error(), testKeyEnv) {
				t.Errorf("%s() without the key error = %v, want KindAuth naming $%s", name, err, testKeyEnv)
			}
		}
		if got := paths(srv); len(got) != 0 {
			t.Errorf("the server saw %v, want no request", got)
		}
	})

	t.Run("none configured: no header, OPENAI_* ignored", func(t *testing.T) {
		srv := openaitest.New(t)
		t.Setenv("OPENAI_API_KEY", "sk-from-the-environment")
		t.Setenv("OPENAI_ADMIN_KEY", "sk-admin-from-the-environment")
		t.Setenv("OPENAI_BASE_URL", closedURL(t))
		p := newProvider(t, srv, openai.Config{Local: true})
		if _, err := p.Chat(t.Context(), hi(openaitest.ChatModel), nil); err != nil {
			t.Fatalf("Chat() error = %v", err)
		}
		reqs := srv.Requests()
		if len(reqs) != 1 {
			t.Fatalf("the server saw %v, want one request", paths(srv))
		}
		if got := reqs[0].Header.Get("Authorization"); got != "" {
			t.Errorf("Authorization = %q, want none for a provider with no key configured", got)
		}
	})

	t.Run("server wants a key none is configured", func(t *testing.T) {
		srv := openaitest.New(t)
		srv.SetKey(testKey)
		p := newProvider(t, srv, openai.Config{Name: "lab"})
		_, err := p.Chat(t.Context(), hi(openaitest.ChatModel), nil)
		if e := asError(t, err); e.Kind != models.KindAuth || !strings.Contains(err.Error(), "requires an API key") {
			t.Errorf("Chat() error = %v, want KindAuth saying a key is required", err)
		}
	})
}

// TestLogs checks that calls are logged and that the key is in no log
// record and no error, even when the server echoes it.
func TestLogs(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, p := keyed(t, openai.Config{Logger: log})
	srv.Script(
		openaitest.Reply{},
		openaitest.Reply{Status: 400, Error: &openaitest.APIError{Type: "invalid_request_error", Message: "bad key " + testKey}},
		openaitest.Reply{CutAfter: 1, StreamError: &openaitest.APIError{Type: "server_error", Message: "failed for " + testKey}},
	)
	var errs []error
	for range 3 {
		_, err := p.Chat(t.Context(), hi(openaitest.ChatModel), func(models.Delta) {})
		errs = append(errs, err)
	}
	_, err := p.Embed(t.Context(), models.EmbedRequest{Model: openaitest.EmbedModel, Input: []string{"x"}})
	errs = append(errs, err)

	if errs[0] != nil || errs[1] == nil || errs[2] == nil || errs[3] != nil {
		t.Fatalf("errors = %v, want nil, an error, an error, nil", errs)
	}
	for _, err := range errs[1:3] {
		if strings.Contains(err.Error(), testKey) || !strings.Contains(err.Error(), "[redacted]") {
			t.Errorf("error %q holds the key or no [redacted] mark", err)
		}
	}
	out := logs.String()
	for _, want := range []string{`"msg":"openai chat"`, `"msg":"openai chat failed"`, `"msg":"openai embed"`, `"prompt_tokens"`} {
		if !strings.Contains(out, want) {
			t.Errorf("logs have no %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, testKey) {
		t.Errorf("logs hold the API key:\n%s", out)
	}
}

// decode returns the JSON s as a generic value.
func decode(t *testing.T, s []byte) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(s, &v); err != nil {
		t.Fatalf("decode %s: %v", s, err)
	}
	return v
}

// png is the smallest valid PNG header, enough for content sniffing.
var png = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89")

func TestRequest(t *testing.T) {
	strictSchema := json.RawMessage(`{"type":"object","properties":{"word":{"type":"string"}},"required":["word"],"additionalProperties":false}`)
	looseSchema := json.RawMessage(`{"type":"object","properties":{"q":{"type":"string"},"n":{"type":"integer"}},"required":["q"]}`)
	req := models.ChatRequest{
		Model: openaitest.ChatModel,
		Messages: []models.Message{
			{Role: models.RoleSystem, Content: "Be brief."},
			{Role: models.RoleUser, Content: "What is this?", Images: [][]byte{png}},
			{Role: models.RoleAssistant, Content: "Let me look.", ToolCalls: []keel.ToolCall{
				{ID: "call_1", Name: "lookup", Arguments: json.RawMessage(`{"word":"cat"}`)},
				{ID: "call_2", Name: "search"},
			}},
			{Role: models.RoleTool, ToolCallID: "call_1", ToolName: "lookup", Content: "a small animal"},
			{Role: models.RoleTool, ToolCallID: "call_2", ToolName: "search", Content: "nothing"},
		},
		Tools: []keel.ToolSpec{
			{Name: "lookup", Description: "Looks a word up.", InputSchema: strictSchema},
			{Name: "search", InputSchema: looseSchema},
		},
		Format:    strictSchema,
		MaxTokens: 77,
	}
	want := `{
		"model": "keel-test-chat",
		"messages": [
			{"role": "system", "content": "Be brief."},
			{"role": "user", "content": [
				{"type": "text", "text": "What is this?"},
				{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJ"}}]},
			{"role": "assistant", "content": "Let me look.", "tool_calls": [
				{"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"word\":\"cat\"}"}},
				{"id": "call_2", "type": "function", "function": {"name": "search", "arguments": "{}"}}]},
			{"role": "tool", "tool_call_id": "call_1", "content": "a small animal"},
			{"role": "tool", "tool_call_id": "call_2", "content": "nothing"}],
		"tools": [
			{"type": "function", "function": {"name": "lookup", "description": "Looks a word up.", "strict": true,
				"parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"], "additionalProperties": false}}},
			{"type": "function", "function": {"name": "search",
				"parameters": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}}}],
		"response_format": {"type": "json_schema", "json_schema": {"name": "reply", "strict": true,
			"schema": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"], "additionalProperties": false}}}
	}`
	tests := []struct {
		name   string
		cfg    openai.Config
		stream bool
		extra  string // the fields that differ
	}{
		{"stream", openai.Config{}, true, `{"max_tokens": 77, "stream": true, "stream_options": {"include_usage": true}}`},
		{"whole", openai.Config{}, false, `{"max_tokens": 77}`},
		{"max_completion_tokens", openai.Config{MaxCompletionTokens: true}, false, `{"max_completion_tokens": 77}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := openaitest.New(t)
			p := newProvider(t, srv, tt.cfg)
			var onDelta func(models.Delta)
			if tt.stream {
				onDelta = func(models.Delta) {}
			}
			if _, err := p.Chat(t.Context(), req, onDelta); err != nil {
				t.Fatalf("Chat() error = %v", err)
			}
			wantBody := decode(t, []byte(want))
			for k, v := range decode(t, []byte(tt.extra)) {
				wantBody[k] = v
			}
			if diff := cmp.Diff(wantBody, decode(t, srv.Requests()[0].Body)); diff != "" {
				t.Errorf("request body mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRequestRefused(t *testing.T) {
	tests := []struct {
		name string
		req  models.ChatRequest
		msg  string
	}{
		{"image in a system message", models.ChatRequest{Messages: []models.Message{{Role: models.RoleSystem, Images: [][]byte{png}}}}, "user messages only"},
		{"image not a picture", models.ChatRequest{Messages: []models.Message{{Role: models.RoleUser, Images: [][]byte{[]byte("%PDF-1.7")}}}}, "not PNG"},
		{"tool result without call ID", models.ChatRequest{Messages: []models.Message{{Role: models.RoleTool, Content: "x"}}}, "ToolCallID"},
		{"unknown role", models.ChatRequest{Messages: []models.Message{{Role: "narrator"}}}, "unknown role"},
		{"tool schema not an object", models.ChatRequest{Tools: []keel.ToolSpec{{Name: "t", InputSchema: json.RawMessage(`[1]`)}}}, "not a JSON object"},
		{"format not an object", models.ChatRequest{Format: json.RawMessage(`"json"`)}, "not a JSON Schema object"},
		{"no model", models.ChatRequest{Model: "-"}, "no model"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := openaitest.New(t)
			p := newProvider(t, srv, openai.Config{})
			switch tt.req.Model {
			case "":
				tt.req.Model = openaitest.ChatModel
			case "-":
				tt.req.Model = ""
			}
			_, err := p.Chat(t.Context(), tt.req, nil)
			if !errors.Is(err, models.ErrInvalidRequest) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Chat() error = %v, want ErrInvalidRequest saying %q", err, tt.msg)
			}
			if got := paths(srv); len(got) != 0 {
				t.Errorf("the server saw %v, want nothing sent", got)
			}
		})
	}
}

func TestReply(t *testing.T) {
	script := openaitest.Reply{
		Content: []string{"Let me", " check."},
		ToolCalls: []openaitest.ToolCall{
			{ID: "call_a", Name: "lookup", Arguments: `{ "word" : "cat" }`},
			{Name: "add", Arguments: `{"a": 1,`}, // no ID, arguments cut
		},
		Usage: &openaitest.Usage{PromptTokens: 31, CompletionTokens: 7},
	}
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			srv := openaitest.New(t)
			srv.Script(script)
			p := newProvider(t, srv, openai.Config{})
			var deltas []string
			var onDelta func(models.Delta)
			if stream {
				onDelta = func(d models.Delta) { deltas = append(deltas, d.Content) }
			}
			req := hi(openaitest.ChatModel)
			req.Tools = modelstest.Tools
			resp, err := p.Chat(t.Context(), req, onDelta)
			if err != nil {
				t.Fatalf("Chat() error = %v", err)
			}
			if stream && !cmp.Equal(deltas, []string{"Let me", " check."}) {
				t.Errorf("deltas = %q, want [Let me,  check.]", deltas)
			}
			if len(resp.Message.ToolCalls) != 2 || !strings.HasPrefix(resp.Message.ToolCalls[1].ID, "call_") || resp.Message.ToolCalls[1].ID == "call_a" {
				t.Fatalf("Chat() tool calls = %+v, want two, the second with a generated ID", resp.Message.ToolCalls)
			}
			want := models.ChatResponse{
				Model: openaitest.ChatModel,
				Message: models.Message{Role: models.RoleAssistant, Content: "Let me check.", ToolCalls: []keel.ToolCall{
					{ID: "call_a", Name: "lookup", Arguments: json.RawMessage(`{"word":"cat"}`)},
					{ID: resp.Message.ToolCalls[1].ID, Name: "add", Arguments: json.RawMessage(`"{\"a\": 1,"`)},
				}},
				Usage:        models.Usage{PromptTokens: 31, CompletionTokens: 7},
				FinishReason: "tool_calls",
			}
			if diff := cmp.Diff(want, resp); diff != "" {
				t.Errorf("Chat() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMaxTokens(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			srv := openaitest.New(t)
			p := newProvider(t, srv, openai.Config{})
			req := hi(openaitest.ChatModel)
			req.MaxTokens = 5
			var deltas int
			var onDelta func(models.Delta)
			if stream {
				onDelta = func(models.Delta) { deltas++ }
			}
			resp, err := p.Chat(t.Context(), req, onDelta)
			if err != nil {
				t.Fatalf("Chat() error = %v", err)
			}
			if resp.FinishReason != "length" || resp.Message.Content != "Once upon a time, a" {
				t.Errorf("Chat(MaxTokens 5) = %q, finish %q; want 5 words and finish length", resp.Message.Content, resp.FinishReason)
			}
			// The fake server counts 3 tokens per message plus its words.
			if want := (models.Usage{PromptTokens: 4, CompletionTokens: 5}); resp.Usage != want {
				t.Errorf("Chat() usage = %+v, want %+v", resp.Usage, want)
			}
			if stream && deltas != 5 {
				t.Errorf("Chat() streamed %d deltas, want 5", deltas)
			}
		})
	}
}

// TestStreamWithoutUsage checks a server that ignores include_usage: the
// reply is complete, with no usage.
func TestStreamWithoutUsage(t *testing.T) {
	srv := openaitest.New(t)
	srv.Script(openaitest.Reply{Events: []string{
		`{"id":"1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}`,
		`{"id":"1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"stop"}]}`,
		"[DONE]",
	}})
	p := newProvider(t, srv, openai.Config{})
	resp, err := p.Chat(t.Context(), hi(openaitest.ChatModel), func(models.Delta) {})
	if err != nil || resp.Message.Content != "Hi there" || resp.FinishReason != "stop" || resp.Usage != (models.Usage{}) {
		t.Errorf("Chat() = %+v, %v; want content \"Hi there\", finish stop, no usage", resp, err)
	}
}

func TestEmbed(t *testing.T) {
	srv, p := keyed(t, openai.Config{})
	var e models.Embedder = p
	input := []string{"the cat", "a dog", "the cat"}
	resp, err := e.Embed(t.Context(), models.EmbedRequest{Model: openaitest.EmbedModel, Input: input})
	if err != nil {
		t.Fatalf("Embed() error = %v", err)
	}
	want := models.EmbedResponse{Model: openaitest.EmbedModel, Usage: models.Usage{PromptTokens: 6}}
	for _, in := range input {
		want.Vectors = append(want.Vectors, openaitest.Vector(in))
	}
	if diff := cmp.Diff(want, resp); diff != "" {
		t.Errorf("Embed() mismatch (-want +got):\n%s", diff)
	}
	if body := decode(t, srv.Requests()[0].Body); body["encoding_format"] != "float" {
		t.Errorf("request encoding_format = %v, want float", body["encoding_format"])
	}

	_, err = p.Embed(t.Context(), models.EmbedRequest{Model: "nomic", Input: input})
	if !errors.Is(err, models.ErrModelNotFound) {
		t.Errorf("Embed(undeclared model) error = %v, want ErrModelNotFound", err)
	}
	_, err = p.Embed(t.Context(), models.EmbedRequest{Model: openaitest.EmbedModel})
	if !errors.Is(err, models.ErrInvalidRequest) {
		t.Errorf("Embed(no input) error = %v, want ErrInvalidRequest", err)
	}
	srv.ScriptPath(openaitest.EmbeddingsPath, openaitest.Reply{Status: 503})
	_, err = p.Embed(t.Context(), models.EmbedRequest{Model: openaitest.EmbedModel, Input: input})
	if models.KindOf(err) != models.KindOverloaded {
		t.Errorf("Embed(503) error = %v, want KindOverloaded", err)
	}
	srv.ScriptPath(openaitest.EmbeddingsPath, openaitest.Reply{Body: `{"object":"list","data":[{"index":5,"embedding":[1]}]}`})
	_, err = p.Embed(t.Context(), models.EmbedRequest{Model: openaitest.EmbedModel, Input: input})
	if models.KindOf(err) != models.KindInvalidRequest {
		t.Errorf("Embed(index out of range) error = %v, want KindInvalidRequest", err)
	}
}

func TestModels(t *testing.T) {
	srv := openaitest.New(t)
	t.Run("declared", func(t *testing.T) {
		for _, local := range []bool{false, true} {
			p := newProvider(t, srv, openai.Config{Name: "vendor", Local: local})
			got, err := p.Models(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			want := []models.ModelInfo{
				{Name: openaitest.ChatModel, Provider: "vendor", ContextLength: 8192, Family: "test", Cloud: !local,
					Capabilities: []models.Capability{models.CapCompletion, models.CapTools, models.CapStructured, models.CapVision},
					Price:        &models.Price{InputPerMTok: 1, OutputPerMTok: 2}},
				{Name: openaitest.EmbedModel, Provider: "vendor", ContextLength: 512, Cloud: !local,
					Capabilities: []models.Capability{models.CapEmbedding}},
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Models(Local %v) mismatch (-want +got):\n%s", local, diff)
			}
			got[0].Price.InputPerMTok = 99
			got[0].Capabilities[0] = "x"
			again, _ := p.Models(t.Context())
			if diff := cmp.Diff(want, again); diff != "" {
				t.Errorf("Models() changed after a caller edited its result (-want +got):\n%s", diff)
			}
		}
		if got := paths(srv); len(got) != 0 {
			t.Errorf("Models() without Discover sent %v, want nothing", got)
		}
	})

	t.Run("discovered", func(t *testing.T) {
		srv := openaitest.New(t)
		srv.SetModels(openaitest.ChatModel, "qwen3-0.6b")
		p := newProvider(t, srv, openai.Config{Discover: true, Local: true, Models: testModels[:1]})
		for range 2 {
			got, err := p.Models(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, m := range got {
				names = append(names, m.Name)
			}
			if want := []string{openaitest.ChatModel, "qwen3-0.6b"}; !cmp.Equal(names, want) {
				t.Errorf("Models() = %v, want %v", names, want)
			}
			if last := got[len(got)-1]; !last.Has(models.CapCompletion) || last.Cloud || last.Price != nil {
				t.Errorf("discovered model = %+v, want a local, free completion model", last)
			}
		}
		if _, err := p.Chat(t.Context(), hi("qwen3-0.6b"), nil); err != nil {
			t.Errorf("Chat(discovered model) error = %v", err)
		}
		if _, err := p.Chat(t.Context(), hi("llama9"), nil); !errors.Is(err, models.ErrModelNotFound) {
			t.Errorf("Chat(neither declared nor listed) error = %v, want ErrModelNotFound", err)
		}
		want := []string{"GET /v1/models", "POST /v1/chat/completions"}
		if got := paths(srv); !cmp.Equal(got, want) {
			t.Errorf("requests = %v, want %v (the list fetched once)", got, want)
		}
	})
}

func TestNew(t *testing.T) {
	tests := []struct {
		name string
		cfg  openai.Config
	}{
		{"no models", openai.Config{}},
		{"bad scheme", openai.Config{BaseURL: "ftp://example.com/v1", Models: testModels}},
		{"no host", openai.Config{BaseURL: "http:///v1", Models: testModels}},
		{"model twice", openai.Config{Models: []openai.ModelConfig{{Name: "a"}, {Name: "a"}}}},
		{"model unnamed", openai.Config{Models: []openai.ModelConfig{{}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := openai.New(tt.cfg); err == nil {
				t.Errorf("New(%+v) = nil error, want one", tt.cfg)
			}
		})
	}
	p, err := openai.New(openai.Config{Models: []openai.ModelConfig{{Name: "gpt-x"}}})
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := p.Models(t.Context())
	if p.Name() != "openai" || p.BaseURL() != openai.DefaultBaseURL || !ms[0].Cloud || !ms[0].Has(models.CapCompletion) {
		t.Errorf("New(zero config) = %s at %s serving %+v, want openai at %s, cloud, completion", p.Name(), p.BaseURL(), ms, openai.DefaultBaseURL)
	}
}

// TestDefaultKeyEnv checks that the zero config reads $OPENAI_API_KEY.
func TestDefaultKeyEnv(t *testing.T) {
	t.Setenv(openai.DefaultAPIKeyEnv, "")
	p, err := openai.New(openai.Config{Models: []openai.ModelConfig{{Name: "gpt-x"}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Chat(t.Context(), hi("gpt-x"), nil)
	if models.KindOf(err) != models.KindAuth || !strings.Contains(err.Error(), openai.DefaultAPIKeyEnv) {
		t.Errorf("Chat() without $%s error = %v, want KindAuth naming it", openai.DefaultAPIKeyEnv, err)
	}
}
