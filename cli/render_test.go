package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
)

// TestEventLabels: each event whose data carries labels shows them at
// the end of its line (a person's tool call, human.tool, as a tool
// result's), and a declassification shows who cleared which
// label, why, and what the context holds after; an event without labels
// shows none.
func TestEventLabels(t *testing.T) {
	ev := func(typ keel.EventType, data any) keel.Event {
		raw, err := json.Marshal(data)
		if err != nil {
			t.Fatal(err)
		}
		return keel.Event{RunID: "r", Seq: 7, Type: typ, Data: raw}
	}
	pii := []string{"pii", "private"}
	for _, tt := range []struct {
		name string
		ev   keel.Event
		want string
	}{
		{"tool result", ev(keel.EventToolResult, keel.ToolResultData{Name: "readfile", Output: json.RawMessage(`"x"`), Labels: pii}), `  7 tool  ← readfile "x"  0s  labels {pii,private}` + "\n"},
		{"failed tool result", ev(keel.EventToolResult, keel.ToolResultData{Name: "fetch", Error: &keel.ToolError{Code: keel.ToolPolicyDenied, Message: "no"}, Labels: []string{"pii"}}), "  labels {pii}\n"},
		{"tool result without labels", ev(keel.EventToolResult, keel.ToolResultData{Name: "readfile", Output: json.RawMessage(`"x"`)}), `  7 tool  ← readfile "x"  0s` + "\n"},
		{"person's tool call", ev(keel.EventHumanTool, keel.HumanToolData{Call: keel.ToolCall{ID: "human_1", Name: "readfile", Arguments: json.RawMessage(`{"path":"a"}`)},
			Output: json.RawMessage(`"x"`), Labels: pii}), `  7 person ran readfile {"path":"a"} ← "x"  labels {pii,private}` + "\n"},
		{"person's failed tool call", ev(keel.EventHumanTool, keel.HumanToolData{Call: keel.ToolCall{ID: "human_2", Name: "fetch", Arguments: json.RawMessage(`{}`)},
			Error: &keel.ToolError{Code: keel.ToolPolicyDenied, Message: "no"}, Labels: []string{"pii"}}), "  7 person ran fetch {}: failed (policy_denied): no  labels {pii}\n"},
		{"human message", ev(keel.EventHumanMessage, keel.HumanMessageData{Content: "hi", Labels: []string{"secret"}}), "  7 person says: hi  labels {secret}\n"},
		{"model result", ev(keel.EventModelResult, keel.ModelResultData{Step: 2, Model: "m", Labels: pii}), "  7 model step 2  m  tokens 0 in / 0 out  0s  labels {pii,private}\n"},
		{"summary", ev(keel.EventContextSummary, keel.ContextSummaryData{Step: 3, Messages: 4, TokensBefore: 900, TokensAfter: 100, Summary: "s", Labels: []string{"pii"}}),
			"  7 context summarized at step 3: 4 messages, ~900 → ~100 tokens  labels {pii}\n      │ s\n"},
		{"declassified", ev(keel.EventDeclassified, keel.DeclassifyData{Label: "pii", By: "ada", Reason: "she agreed", Labels: []string{"private"}}),
			"  7 label pii cleared by ada: she agreed\n      │ the context now holds {private}\n"},
		{"sub-agent step", ev(keel.EventStepFinished, keel.StepData{StepID: "a", Status: keel.RunSucceeded, Labels: []string{"pii"}}), "  7 step  ← a succeeded  labels {pii}\n"},
	} {
		var b strings.Builder
		(&eventPrinter{w: &b}).print(tt.ev)
		if got := b.String(); !strings.HasSuffix(got, tt.want) {
			t.Errorf("%s: printed %q, want it to end with %q", tt.name, got, tt.want)
		}
	}
}
