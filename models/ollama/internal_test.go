package ollama

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/types/model"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/modelstest"
)

func TestParseHost(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"", "http://127.0.0.1:11434"},
		{"127.0.0.1:5000", "http://127.0.0.1:5000"},
		{"localhost", "http://localhost:11434"},
		{":5000", "http://127.0.0.1:5000"},
		{"http://example.com", "http://example.com:80"},
		{"https://example.com", "https://example.com:443"},
		{"https://example.com:8443/ollama", "https://example.com:8443/ollama"},
		{"[::1]:5000", "http://[::1]:5000"},
		{"::1", "http://[::1]:11434"},
	}
	for _, tt := range tests {
		got, err := parseHost(tt.in)
		if err != nil || got.String() != tt.want {
			t.Errorf("parseHost(%q) = %v, %v, want %s", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"ftp://host", "host:0", "host:99999", "host:http"} {
		if got, err := parseHost(bad); err == nil {
			t.Errorf("parseHost(%q) = %v, want an error", bad, got)
		}
	}
}

func TestNewUsesOllamaHost(t *testing.T) {
	t.Setenv("OLLAMA_HOST", "127.0.0.1:1234")
	p, err := New(Config{})
	if err != nil || p.Endpoint() != "http://127.0.0.1:1234" {
		t.Errorf("New() with OLLAMA_HOST: endpoint %v, %v, want http://127.0.0.1:1234", p, err)
	}
	p, err = New(Config{Host: "127.0.0.1:99"})
	if err != nil || p.Endpoint() != "http://127.0.0.1:99" {
		t.Errorf("New(Host) endpoint = %v, %v, want Config.Host to win", p, err)
	}
}

func TestModelInfo(t *testing.T) {
	tests := []struct {
		name string
		resp api.ShowResponse
		want models.ModelInfo
	}{
		{
			name: "num_ctx smaller wins",
			resp: api.ShowResponse{
				Capabilities: []model.Capability{"completion", "tools", "thinking"},
				ModelInfo:    map[string]any{"general.architecture": "llama", "llama.context_length": float64(131072)},
				Parameters:   "num_ctx                        2048\nstop \"<|eot|>\"\ntemperature 0",
				Details:      api.ModelDetails{Family: "llama"},
			},
			want: models.ModelInfo{Name: "m", Provider: "ollama", Family: "llama", ContextLength: 2048,
				Capabilities: []models.Capability{models.CapCompletion, models.CapTools, models.CapStructured}},
		},
		{
			name: "num_ctx larger ignored",
			resp: api.ShowResponse{
				Capabilities: []model.Capability{"completion", "vision"},
				ModelInfo:    map[string]any{"general.architecture": "gemma3", "gemma3.context_length": float64(8192)},
				Parameters:   "num_ctx 32768",
			},
			want: models.ModelInfo{Name: "m", Provider: "ollama", ContextLength: 8192,
				Capabilities: []models.Capability{models.CapCompletion, models.CapVision, models.CapStructured}},
		},
		{
			name: "embedding only, no structured",
			resp: api.ShowResponse{
				Capabilities: []model.Capability{"embedding"},
				ModelInfo:    map[string]any{"general.architecture": "bert", "bert.context_length": float64(512)},
			},
			want: models.ModelInfo{Name: "m", Provider: "ollama", ContextLength: 512,
				Capabilities: []models.Capability{models.CapEmbedding}},
		},
		{
			name: "unknown architecture length, num_ctx used",
			resp: api.ShowResponse{Capabilities: []model.Capability{"completion"}, Parameters: "num_ctx 4096"},
			want: models.ModelInfo{Name: "m", Provider: "ollama", ContextLength: 4096,
				Capabilities: []models.Capability{models.CapCompletion, models.CapStructured}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, modelInfo("m", &tt.resp)); diff != "" {
				t.Errorf("modelInfo() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

var testTools = []keel.ToolSpec{
	{Name: "search", Description: "Searches the web.", InputSchema: json.RawMessage(`{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}`)},
	{Name: "now", Description: "Tells the time."}, // no input schema
}

func TestToolChoiceSchema(t *testing.T) {
	schema, err := toolChoiceSchema(testTools)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"anyOf":[` +
		`{"type":"object","properties":{"tool":{"const":"search"},"arguments":{"properties":{"q":{"type":"string"}},"required":["q"],"type":"object"}},"required":["tool","arguments"],"additionalProperties":false},` +
		`{"type":"object","properties":{"tool":{"const":"now"},"arguments":{"type":"object"}},"required":["tool","arguments"],"additionalProperties":false},` +
		`{"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"],"additionalProperties":false}]}`
	if string(schema) != want {
		t.Errorf("toolChoiceSchema() =\n%s\nwant\n%s", schema, want)
	}

	tests := []struct {
		doc   string
		valid bool
	}{
		{`{"tool":"search","arguments":{"q":"go"}}`, true},
		{`{"tool":"now","arguments":{}}`, true},
		{`{"answer":"hello"}`, true},
		{`{"tool":"search","arguments":{}}`, false},           // missing q
		{`{"tool":"search","arguments":{"q":1}}`, false},      // wrong type
		{`{"tool":"delete","arguments":{}}`, false},           // not offered
		{`{"tool":"now"}`, false},                             // no arguments
		{`{"answer":"x","tool":"now","arguments":{}}`, false}, // both
		{`{}`, false},
	}
	for _, tt := range tests {
		err := modelstest.CheckJSON(schema, []byte(tt.doc))
		if (err == nil) != tt.valid {
			t.Errorf("CheckJSON(toolChoiceSchema, %s) = %v, want valid %v", tt.doc, err, tt.valid)
		}
	}

	if _, err := toolChoiceSchema([]keel.ToolSpec{{Name: "x", InputSchema: json.RawMessage(`{bad`)}}); err == nil {
		t.Error("toolChoiceSchema(invalid input schema) error = nil, want one")
	}
}

func TestParseChoice(t *testing.T) {
	tests := []struct {
		content    string
		wantCall   *keel.ToolCall // ID not compared
		wantAnswer string
		wantOK     bool
	}{
		{"{ \"tool\" : \"search\",\n\n   \"arguments\" : { \"q\" : \"go\" } } ", &keel.ToolCall{Name: "search", Arguments: json.RawMessage(`{"q":"go"}`)}, "", true},
		{`{"tool":"now","arguments":{}}`, &keel.ToolCall{Name: "now", Arguments: json.RawMessage(`{}`)}, "", true},
		{`{"tool":"now"}`, &keel.ToolCall{Name: "now", Arguments: json.RawMessage(`{}`)}, "", true},
		{`{"answer":"it is 42"}`, nil, "it is 42", true},
		{`{"answer":""}`, nil, "", true},
		{`{"tool":"delete","arguments":{}}`, nil, "", false},
		{`{"tool":"search","arguments":{"q":"unfinished`, nil, "", false},
		{`plain text`, nil, "", false},
		{`{"other":1}`, nil, "", false},
	}
	for _, tt := range tests {
		calls, answer, ok := parseChoice(tt.content, testTools)
		if ok != tt.wantOK || answer != tt.wantAnswer {
			t.Errorf("parseChoice(%q) = %v, %q, %v, want answer %q, ok %v", tt.content, calls, answer, ok, tt.wantAnswer, tt.wantOK)
			continue
		}
		switch {
		case tt.wantCall == nil && len(calls) != 0:
			t.Errorf("parseChoice(%q) calls = %v, want none", tt.content, calls)
		case tt.wantCall != nil && len(calls) != 1:
			t.Errorf("parseChoice(%q) calls = %v, want one", tt.content, calls)
		case tt.wantCall != nil:
			c := calls[0]
			if c.Name != tt.wantCall.Name || string(c.Arguments) != string(tt.wantCall.Arguments) || !strings.HasPrefix(c.ID, "call_") {
				t.Errorf("parseChoice(%q) call = %+v, want %s(%s) with a call_ ID", tt.content, c, tt.wantCall.Name, tt.wantCall.Arguments)
			}
		}
	}
}

func TestToAPIMessages(t *testing.T) {
	history := []models.Message{
		{Role: models.RoleSystem, Content: "sys"},
		{Role: models.RoleUser, Content: "find go"},
		{Role: models.RoleAssistant, Content: "Searching.", ToolCalls: []keel.ToolCall{
			{ID: "c1", Name: "search", Arguments: json.RawMessage(`{"q":"go","n":2}`)},
			{ID: "c2", Name: "now"},
		}},
		{Role: models.RoleTool, ToolCallID: "c1", ToolName: "search", Content: `["go.dev"]`},
	}
	tests := []struct {
		name   string
		native bool
		want   string // JSON of []api.Message
	}{
		{"native", true, `[
			{"role":"system","content":"sys"},
			{"role":"user","content":"find go"},
			{"role":"assistant","content":"Searching.","tool_calls":[
				{"id":"c1","function":{"index":0,"name":"search","arguments":{"q":"go","n":2}}},
				{"id":"c2","function":{"index":1,"name":"now","arguments":{}}}]},
			{"role":"tool","content":"[\"go.dev\"]","tool_name":"search","tool_call_id":"c1"}]`},
		{"flattened", false, `[
			{"role":"system","content":"sys"},
			{"role":"user","content":"find go"},
			{"role":"assistant","content":"Searching.\n{\"tool\":\"search\",\"arguments\":{\"q\":\"go\",\"n\":2}}\n{\"tool\":\"now\",\"arguments\":{}}"},
			{"role":"user","content":"Result of tool search (call c1):\n[\"go.dev\"]"}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msgs, err := toAPIMessages(history, tt.native)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := json.Marshal(msgs)
			if diff := cmp.Diff(decode(t, tt.want), decode(t, string(got))); diff != "" {
				t.Errorf("toAPIMessages(native=%v) mismatch (-want +got):\n%s", tt.native, diff)
			}
		})
	}

	bad := []models.Message{{Role: models.RoleAssistant, ToolCalls: []keel.ToolCall{{ID: "c", Name: "x", Arguments: json.RawMessage(`[1]`)}}}}
	if _, err := toAPIMessages(bad, true); err == nil {
		t.Error("toAPIMessages(array arguments) error = nil, want one")
	}
}

func TestFromAPIToolCallKeepsArguments(t *testing.T) {
	var tc api.ToolCall
	if err := json.Unmarshal([]byte(`{"function":{"name":"search","arguments":{"q":"go","opts":{"n":2,"exact":true}}}}`), &tc); err != nil {
		t.Fatal(err)
	}
	c := fromAPIToolCall(tc)
	if c.Name != "search" || string(c.Arguments) != `{"q":"go","opts":{"exact":true,"n":2}}` || !strings.HasPrefix(c.ID, "call_") || len(c.ID) != len("call_")+12 {
		t.Errorf("fromAPIToolCall() = %+v %s", c, c.Arguments)
	}
	tc.ID = "given"
	if c := fromAPIToolCall(tc); c.ID != "given" {
		t.Errorf("fromAPIToolCall() ID = %q, want given", c.ID)
	}
}

func TestWithInstruction(t *testing.T) {
	got := withInstruction([]api.Message{{Role: "system", Content: "sys\n"}, {Role: "user", Content: "u"}}, "TOOLS")
	if len(got) != 2 || got[0].Content != "sys\n\nTOOLS" {
		t.Errorf("withInstruction(leading system) = %+v", got)
	}
	got = withInstruction([]api.Message{{Role: "user", Content: "u"}}, "TOOLS")
	if len(got) != 2 || got[0].Role != "system" || got[0].Content != "TOOLS" {
		t.Errorf("withInstruction(no system) = %+v", got)
	}
	text := toolInstruction(testTools)
	for _, want := range []string{`"tool"`, `"answer"`, "- search: Searches the web.", `{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}`, "- now: Tells the time."} {
		if !strings.Contains(text, want) {
			t.Errorf("toolInstruction() = %q, want it to contain %q", text, want)
		}
	}
}

func TestShowCacheExpires(t *testing.T) {
	f := newFake(t)
	p := f.provider(t, Config{})
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	for range 3 {
		if _, err := p.Show(t.Context(), "tiny"); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.count("/api/show"); n != 1 {
		t.Errorf("/api/show called %d times within the TTL, want 1", n)
	}
	now = now.Add(showTTL)
	if _, err := p.Show(t.Context(), "tiny"); err != nil {
		t.Fatal(err)
	}
	if n := f.count("/api/show"); n != 2 {
		t.Errorf("/api/show called %d times after the TTL, want 2", n)
	}
}

func decode(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("decode %s: %v", s, err)
	}
	return v
}

func TestAsInt(t *testing.T) {
	tests := []struct {
		in   any
		want int
	}{
		{float64(4096), 4096},
		{4096, 4096},
		{int64(4096), 4096},
		{json.Number("4096"), 4096},
		{json.Number("4096.5"), 0},
		{"4096", 0},
		{nil, 0},
	}
	for _, tt := range tests {
		if got := asInt(tt.in); got != tt.want {
			t.Errorf("asInt(%#v) = %d, want %d", tt.in, got, tt.want)
		}
	}
}
