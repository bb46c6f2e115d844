package openai

import (
	"encoding/json"
	"errors"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zalando/go-keyring"

	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/modelstest"
	"github.com/keel-runtime/keel/models/openai/openaitest"
)

// keyringProvider returns a provider for srv whose key is in the OS
// keyring only, read by get.
func keyringProvider(t *testing.T, srv *openaitest.Server, get func(service, user string) (string, error)) *Provider {
	t.Helper()
	p, err := New(Config{
		BaseURL: srv.URL(), HTTPClient: srv.Client(),
		KeyringService: "keel-test", KeyringUser: "alice",
		Models: []ModelConfig{{Name: openaitest.ChatModel}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if get != nil {
		p.keys.get = get
	}
	return p
}

func hi() models.ChatRequest {
	return models.ChatRequest{Model: openaitest.ChatModel, Messages: []models.Message{{Role: models.RoleUser, Content: "hi"}}}
}

func TestKeyring(t *testing.T) {
	t.Run("read once, again after a refusal", func(t *testing.T) {
		srv := openaitest.New(t)
		srv.SetKey("sk-ring")
		var reads atomic.Int32
		key := "sk-ring"
		p := keyringProvider(t, srv, func(service, user string) (string, error) {
			reads.Add(1)
			if service != "keel-test" || user != "alice" {
				return "", keyring.ErrNotFound
			}
			return key + "\n", nil
		})
		for range 2 {
			if _, err := p.Chat(t.Context(), hi(), nil); err != nil {
				t.Fatalf("Chat() error = %v", err)
			}
		}
		if n := reads.Load(); n != 1 {
			t.Errorf("the keyring was read %d times for 2 calls, want 1", n)
		}
		srv.SetKey("sk-rotated")
		_, err := p.Chat(t.Context(), hi(), nil)
		if models.KindOf(err) != models.KindAuth || !strings.Contains(err.Error(), `service "keel-test", user "alice"`) {
			t.Errorf("Chat(refused key) error = %v, want KindAuth naming the keyring entry", err)
		}
		key = "sk-rotated"
		if _, err := p.Chat(t.Context(), hi(), nil); err != nil || reads.Load() != 2 {
			t.Errorf("Chat() after the key was rotated = %v with %d reads, want success reading the keyring again", err, reads.Load())
		}
	})

	t.Run("not found", func(t *testing.T) {
		srv := openaitest.New(t)
		p := keyringProvider(t, srv, func(string, string) (string, error) { return "", keyring.ErrNotFound })
		_, err := p.Chat(t.Context(), hi(), nil)
		if models.KindOf(err) != models.KindAuth || !strings.Contains(err.Error(), `no secret for service "keel-test", user "alice"`) {
			t.Errorf("Chat() error = %v, want KindAuth naming the keyring entry", err)
		}
		if n := len(srv.Requests()); n != 0 {
			t.Errorf("the server saw %d requests, want none", n)
		}
	})

	t.Run("hangs", func(t *testing.T) {
		srv := openaitest.New(t)
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		var reads atomic.Int32
		p := keyringProvider(t, srv, func(string, string) (string, error) {
			reads.Add(1)
			<-release
			return "", errors.New("released")
		})
		p.keys.timeout = 100 * time.Millisecond
		for range 2 {
			start := time.Now()
			_, err := p.Chat(t.Context(), hi(), nil)
			if d := time.Since(start); d > time.Second {
				t.Errorf("Chat() with a hung keyring returned after %v, want about 100ms", d)
			}
			if models.KindOf(err) != models.KindAuth || !strings.Contains(err.Error(), "did not answer") {
				t.Errorf("Chat() with a hung keyring error = %v, want KindAuth saying it did not answer", err)
			}
		}
		if n := reads.Load(); n != 1 {
			t.Errorf("%d keyring reads started, want 1: a hung read is shared", n)
		}
		if n := len(srv.Requests()); n != 0 {
			t.Errorf("the server saw %d requests, want none", n)
		}
	})

	// No Secret Service answers on this bus address: the real keyring
	// client must fail at once with a clear error.
	t.Run("no keyring service", func(t *testing.T) {
		if runtime.GOOS != "linux" {
			t.Skip("the Secret Service is the keyring on Linux only")
		}
		t.Setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path="+t.TempDir()+"/no-bus")
		t.Setenv("KEEL_TEST_UNSET_KEY", "")
		srv := openaitest.New(t)
		p, err := New(Config{
			BaseURL: srv.URL(), HTTPClient: srv.Client(), APIKeyEnv: "KEEL_TEST_UNSET_KEY",
			KeyringService: "keel-test", Models: []ModelConfig{{Name: openaitest.ChatModel}},
		})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = p.Chat(t.Context(), hi(), nil)
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Chat() took %v without a keyring service, want a prompt error", d)
		}
		if models.KindOf(err) != models.KindAuth || !strings.Contains(err.Error(), "KEEL_TEST_UNSET_KEY is unset") ||
			!strings.Contains(err.Error(), "keyring is unavailable") {
			t.Errorf("Chat() error = %v, want KindAuth naming the variable and the unavailable keyring", err)
		}
	})
}

func TestStrictOK(t *testing.T) {
	tests := []struct {
		schema string
		want   bool
	}{
		{modelstest.FormatSchema, true},
		{`{"type":"object","properties":{},"additionalProperties":false}`, true},
		{`{"type":"object","properties":{"a":{"type":"array","items":{"type":"object","properties":{"b":{"type":"string"}},"required":["b"],"additionalProperties":false}}},"required":["a"],"additionalProperties":false}`, true},
		{`{"type":"object","properties":{"a":{"anyOf":[{"type":"string"},{"type":"null"}]}},"required":["a"],"additionalProperties":false}`, true},
		{`{"type":"object","properties":{"a":{"$ref":"#/$defs/x"}},"required":["a"],"additionalProperties":false,"$defs":{"x":{"type":"object","properties":{}}}}`, false},
		{`{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}`, false}, // a not required
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`, false},             // additionalProperties unset
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":true}`, false},
		{`{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"string"}},"required":["b"]}},"required":["a"],"additionalProperties":false}`, false},
		{`{"type":"object","properties":{"a":{"oneOf":[{"type":"string"}]}},"required":["a"],"additionalProperties":false}`, false},
		{`{"type":"array","items":{"type":"string"}}`, false}, // the root must be an object
		{`{"anyOf":[{"type":"object","properties":{},"additionalProperties":false}]}`, false},
		{`true`, false},
		{`not json`, false},
	}
	for _, tt := range tests {
		if got := strictOK(json.RawMessage(tt.schema)); got != tt.want {
			t.Errorf("strictOK(%s) = %v, want %v", tt.schema, got, tt.want)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		header http.Header
		want   time.Duration
	}{
		{http.Header{}, 0},
		{http.Header{"Retry-After": {"7"}}, 7 * time.Second},
		{http.Header{"Retry-After": {" 1.5 "}}, 1500 * time.Millisecond},
		{http.Header{"Retry-After": {now.Add(90 * time.Second).Format(http.TimeFormat)}}, 90 * time.Second},
		{http.Header{"Retry-After": {"Friday, 01-May-26 12:00:30 GMT"}}, 30 * time.Second}, // RFC 850
		{http.Header{"Retry-After": {now.Add(-time.Minute).Format(http.TimeFormat)}}, 0},
		{http.Header{"Retry-After": {"-3"}}, 0},
		{http.Header{"Retry-After": {"soon"}}, 0},
		{http.Header{"Retry-After": {"1e300"}}, maxRetryAfter},
		{http.Header{"Retry-After-Ms": {"250"}, "Retry-After": {"1"}}, 250 * time.Millisecond},
		{http.Header{"Retry-After-Ms": {"NaN"}, "Retry-After": {"1"}}, time.Second},
	}
	for _, tt := range tests {
		if got := retryAfter(tt.header, now); got != tt.want {
			t.Errorf("retryAfter(%v) = %v, want %v", tt.header, got, tt.want)
		}
	}
}

func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"7", "0.5", "Fri, 01 May 2026 12:01:00 GMT", "-1", "NaN", "Inf", "1e400", ""} {
		f.Add(s, s)
	}
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, ra, ms string) {
		h := http.Header{"Retry-After": {ra}, "Retry-After-Ms": {ms}}
		if d := retryAfter(h, now); d < 0 || d > maxRetryAfter {
			t.Errorf("retryAfter(%q, %q) = %v, want within [0, %v]", ra, ms, d, maxRetryAfter)
		}
	})
}

func TestParseServerError(t *testing.T) {
	tests := []struct {
		body                string
		code, typ, wantText string
	}{
		{`{"error":{"message":"Rate limit","type":"requests","code":"rate_limit_exceeded","param":null}}`, "rate_limit_exceeded", "requests", "Rate limit"},
		{`{"error":{"message":"boom","type":"server_error","code":null}}`, "", "server_error", "boom"},
		{`{"error":"model 'x' not found"}`, "", "", "model 'x' not found"},
		{`{"object":"error","message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","param":null,"code":400}`, "400", "BadRequestError", "This model's maximum context length is 4096 tokens."},
		{`{"detail":"Not Found"}`, "", "", "Not Found"},
		{`<html>502</html>`, "", "", ""},
		{``, "", "", ""},
	}
	for _, tt := range tests {
		code, typ, msg := parseServerError([]byte(tt.body))
		if code != tt.code || typ != tt.typ || msg != tt.wantText {
			t.Errorf("parseServerError(%s) = %q, %q, %q; want %q, %q, %q", tt.body, code, typ, msg, tt.code, tt.typ, tt.wantText)
		}
	}
	if !contextTooLong("400", "BadRequestError", "This model's maximum context length is 4096 tokens.") {
		t.Errorf("contextTooLong(vLLM's message) = false, want true")
	}
}

func FuzzParseServerError(f *testing.F) {
	f.Add([]byte(`{"error":{"message":"m","type":"t","code":"c"}}`))
	f.Add([]byte(`{"error":"x","code":[1]}`))
	f.Add([]byte(`{"message":"m","code":{"a":1}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		parseServerError(body) // must not panic
		snippet(body)
	})
}
