package acp

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
)

func ev(typ keel.EventType, data any) keel.Event {
	raw, _ := json.Marshal(data)
	return keel.Event{Type: typ, Data: raw}
}

// TestCompleteStep: the next turn forks from the last step whose calls
// all finished, so a call cut off by a cancel does not run again.
func TestCompleteStep(t *testing.T) {
	t.Parallel()
	call := func(id string) []keel.ToolCall { return []keel.ToolCall{{ID: id, Name: "tally"}} }
	for _, tt := range []struct {
		name string
		evs  []keel.Event
		want int
	}{
		{"nothing", nil, 0},
		{"an answer", []keel.Event{ev(keel.EventModelResult, keel.ModelResultData{Step: 1, Content: "hi"})}, 1},
		{"a call and its result, then an answer", []keel.Event{
			ev(keel.EventModelResult, keel.ModelResultData{Step: 1, ToolCalls: call("c1")}),
			ev(keel.EventToolResult, keel.ToolResultData{Step: 1, CallID: "c1"}),
			ev(keel.EventModelResult, keel.ModelResultData{Step: 2, Content: "done"}),
		}, 2},
		{"a call cut off at step 2", []keel.Event{
			ev(keel.EventModelResult, keel.ModelResultData{Step: 1, ToolCalls: call("c1")}),
			ev(keel.EventToolResult, keel.ToolResultData{Step: 1, CallID: "c1"}),
			ev(keel.EventModelResult, keel.ModelResultData{Step: 2, ToolCalls: call("c2")}),
			ev(keel.EventToolCall, keel.ToolCallData{Step: 2, Call: call("c2")[0]}),
		}, 1},
	} {
		if got := completeStep(tt.evs); got != tt.want {
			t.Errorf("%s: completeStep = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// TestPromptText: text is the message, a resource link is named, an
// embedded resource quoted; other content and empty prompts are refused.
func TestPromptText(t *testing.T) {
	t.Parallel()
	var blocks []contentBlock
	json.Unmarshal([]byte(`[{"type":"text","text":"look at"},{"type":"resource_link","name":"a.go","uri":"file:///w/a.go"},
		{"type":"resource","resource":{"uri":"file:///w/b.go","text":"package b"}}]`), &blocks)
	got, err := promptText(blocks)
	if want := "look at\n[a.go](file:///w/a.go)\nContents of file:///w/b.go:\npackage b"; err != nil || got != want {
		t.Errorf("promptText = %q, %v; want %q", got, err, want)
	}
	for _, bad := range []string{`[]`, `[{"type":"text","text":"  "}]`, `[{"type":"image","data":"AAAA","mimeType":"image/png"}]`, `[{"type":"resource"}]`} {
		var blocks []contentBlock
		json.Unmarshal([]byte(bad), &blocks)
		if _, err := promptText(blocks); err == nil {
			t.Errorf("promptText(%s) = nil error, want invalid params", bad)
		}
	}
}

// TestStopReason maps finish reasons.
func TestStopReason(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"": "end_turn", "stop": "end_turn", "length": "max_tokens", "content_filter": "refusal"} {
		if got := stopReason(in); got != want {
			t.Errorf("stopReason(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestTurnSteps: a loaded session's next turn gets the steps a turn had,
// not the whole bound of its last run (which counts the steps it forked
// with).
func TestTurnSteps(t *testing.T) {
	t.Parallel()
	first := keel.Run{MaxSteps: 8}
	if got := turnSteps(first, []keel.Event{ev(keel.EventRunStarted, keel.RunStartedData{MaxSteps: 8})}); got != 8 {
		t.Errorf("turnSteps(first run) = %d, want 8", got)
	}
	fork := keel.Run{MaxSteps: 11}
	if got := turnSteps(fork, []keel.Event{ev(keel.EventRunForked, keel.RunForkedData{Step: 3})}); got != 8 {
		t.Errorf("turnSteps(a fork from step 3 bounded at 11) = %d, want 8", got)
	}
}

// TestToolKind maps side-effect classes to ACP tool kinds.
func TestToolKind(t *testing.T) {
	t.Parallel()
	for se, want := range map[keel.SideEffect]string{keel.SideEffectReadOnly: "read", keel.SideEffectIdempotentWrite: "edit",
		keel.SideEffectNonIdempotentWrite: "edit", keel.SideEffectExternal: "fetch", "": "other"} {
		if got := toolKind(se); got != want {
			t.Errorf("toolKind(%q) = %q, want %q", se, got, want)
		}
	}
}

// FuzzConn feeds the JSON-RPC reader arbitrary input: it never panics,
// every line it writes is one JSON-RPC 2.0 message, and every request it
// answers (or refuses) gets exactly one line.
func FuzzConn(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"echo","params":{}}`,
		`{"jsonrpc":"2.0","method":"note"}`,
		`{"jsonrpc":"2.0","id":"x","result":{}}`,
		`[1,2]`, `{"jsonrpc":`, `null`, `"str"`, `{"jsonrpc":"2.0","id":{},"method":"echo"}`,
		`{"jsonrpc":"2.0","id":2,"method":7}`, "\n\n\r\n", strings.Repeat("a", 100),
	} {
		f.Add(seed + "\n")
	}
	f.Fuzz(func(t *testing.T, in string) {
		var out strings.Builder
		c := &conn{w: &out, maxLine: 64, pending: map[string]chan *message{},
			handle:      func(context.Context, string, json.RawMessage) (any, error) { return map[string]int{"ok": 1}, nil },
			errorObject: errorObject}
		if err := c.serve(context.Background(), strings.NewReader(in)); err != nil {
			t.Fatalf("serve = %v", err)
		}
		for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
			if line == "" {
				continue
			}
			var m struct {
				JSONRPC string          `json:"jsonrpc"`
				ID      json.RawMessage `json:"id"`
			}
			if err := json.Unmarshal([]byte(line), &m); err != nil || m.JSONRPC != "2.0" || len(m.ID) == 0 {
				t.Fatalf("wrote %q for input %q", line, in)
			}
		}
	})
}
