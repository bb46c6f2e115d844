package openaitest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/keel-runtime/keel/models/modelstest"
)

func TestInstance(t *testing.T) {
	schemas := []string{
		modelstest.FormatSchema,
		string(modelstest.Tools[0].InputSchema),
		string(modelstest.Tools[1].InputSchema),
		`{"type":"object","properties":{"tags":{"type":"array","items":{"type":"string","minLength":3},"minItems":2},"n":{"type":["null","number"],"exclusiveMinimum":5}},"required":["tags","n"]}`,
		`{"anyOf":[{"type":"object","properties":{"tool":{"const":"x"}},"required":["tool"]},{"type":"string"}]}`,
		`{"allOf":[{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]},{"type":"object","properties":{"b":{"enum":[3,4]}},"required":["b"]}]}`,
		`{"type":"integer","minimum":10,"maximum":20}`,
	}
	for _, s := range schemas {
		doc, err := json.Marshal(instance(json.RawMessage(s)))
		if err != nil {
			t.Fatal(err)
		}
		if err := modelstest.CheckJSON(json.RawMessage(s), doc); err != nil {
			t.Errorf("instance(%s) = %s: %v", s, doc, err)
		}
	}
}

// post sends body to the server's path and returns the status and reply.
func post(t *testing.T, s *Server, path, body string) (int, string) {
	t.Helper()
	res, err := s.Client().Post(strings.TrimSuffix(s.URL(), "/v1")+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestRefuses checks that the server refuses what OpenAI refuses, so
// that a client sending it fails in tests.
func TestRefuses(t *testing.T) {
	tests := []struct {
		name, body string
		status     int
		msg        string
	}{
		{"not JSON", `{`, 400, "could not parse"},
		{"unknown model", `{"model":"x","messages":[{"role":"user","content":"hi"}]}`, 404, "model_not_found"},
		{"no messages", `{"model":"keel-test-chat","messages":[]}`, 400, "at least one message"},
		{"tool result without call", `{"model":"keel-test-chat","messages":[{"role":"tool","tool_call_id":"c1","content":"x"}]}`, 400, "preceding message with 'tool_calls'"},
		{"stream_options without stream", `{"model":"keel-test-chat","messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}`, 400, "stream_options"},
		{"image in a system message", `{"model":"keel-test-chat","messages":[{"role":"system","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]}]}`, 400, "invalid content part"},
		{"bad tool name", `{"model":"keel-test-chat","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"a.b"}}]}`, 400, "tools[0]"},
		{"json_schema without schema", `{"model":"keel-test-chat","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"r"}}}`, 400, "response_format"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(t)
			status, body := post(t, s, ChatPath, tt.body)
			if status != tt.status || !strings.Contains(body, tt.msg) {
				t.Errorf("POST %s = %d %s, want %d with %q", tt.body, status, body, tt.status, tt.msg)
			}
			if n := len(s.Requests()); n != 1 {
				t.Errorf("Requests() has %d, want the refused request recorded", n)
			}
		})
	}
}

func TestKey(t *testing.T) {
	s := New(t)
	s.SetKey("sk-1")
	for _, tt := range []struct {
		auth   string
		status int
	}{{"", 401}, {"Bearer sk-2", 401}, {"Bearer sk-1", 200}} {
		req, _ := http.NewRequest(http.MethodGet, s.URL()+"/models", nil)
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		res, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tt.status {
			t.Errorf("GET /v1/models with Authorization %q = %d, want %d", tt.auth, res.StatusCode, tt.status)
		}
	}
}

func TestStreamUsage(t *testing.T) {
	s := New(t)
	for _, usage := range []bool{false, true} {
		body := `{"model":"keel-test-chat","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":2`
		if usage {
			body += `,"stream_options":{"include_usage":true}`
		}
		status, reply := post(t, s, ChatPath, body+"}")
		events := strings.Split(strings.TrimSpace(reply), "\n\n")
		// role, 2 words, finish, [usage], [DONE]
		want := 5
		if usage {
			want = 6
		}
		if status != 200 || len(events) != want || events[len(events)-1] != "data: [DONE]" {
			t.Fatalf("stream (include_usage %v) = %d with %d events:\n%s\nwant 200 with %d ending in [DONE]", usage, status, len(events), reply, want)
		}
		hasUsage := bytes.Contains([]byte(events[len(events)-2]), []byte(`"prompt_tokens"`))
		if hasUsage != usage {
			t.Errorf("stream (include_usage %v): usage chunk present = %v", usage, hasUsage)
		}
	}
}

// TestFind: a string is found wherever a request carries it (body,
// header, query, path), and not in requests that do not.
func TestFind(t *testing.T) {
	s := New(t)
	const canary = "CANARY-42"
	send := func(path, header, body string) {
		req, _ := http.NewRequest(http.MethodPost, strings.TrimSuffix(s.URL(), "/v1")+path, strings.NewReader(body))
		if header != "" {
			req.Header.Set("X-Test", header)
		}
		res, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	send(ChatPath, "", `{"model":"keel-test-chat","messages":[{"role":"user","content":"hi"}]}`)
	send(ChatPath, "", `{"messages":[{"role":"user","content":"`+canary+`"}]}`)
	send(ChatPath, "x "+canary, `{}`)
	send(ChatPath+"?q="+canary, "", `{}`)
	send("/v1/"+canary, "", `{}`)
	if got := len(s.Find(canary)); got != 4 {
		t.Errorf("Find found %d requests, want 4 of the 5", got)
	}
	if got := s.Find("absent"); got != nil {
		t.Errorf("Find(absent) = %v, want none", got)
	}
}
