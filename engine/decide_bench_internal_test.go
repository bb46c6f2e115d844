package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/policy"
	"github.com/keel-runtime/keel/store"
)

// benchTools has one read-only tool and works out a call's targets as
// wasmtools.RunTools does: it parses the arguments.
type benchTools struct{}

func (benchTools) Specs(context.Context) []keel.ToolSpec {
	return []keel.ToolSpec{{Name: "query", InputSchema: json.RawMessage(`{"type":"object"}`), SideEffects: keel.SideEffectReadOnly}}
}

func (benchTools) Call(context.Context, keel.ToolInvocation) (json.RawMessage, error) {
	return json.RawMessage(`{}`), nil
}

func (benchTools) SideEffects(string) (keel.SideEffect, bool) { return keel.SideEffectReadOnly, true }

func (benchTools) CallTargets(_ string, args json.RawMessage) keel.CallTargets {
	var in map[string]any
	_ = json.Unmarshal(args, &in)
	return keel.CallTargets{}
}

type fixedPolicy struct{ snap policy.Snapshot }

func (f fixedPolicy) Current() policy.Snapshot               { return f.snap }
func (f fixedPolicy) CurrentFor(string) policy.Snapshot      { return f.snap }
func (f fixedPolicy) Use(string) (release func(), err error) { return func() {}, nil }

// BenchmarkDecideTool measures the engine's decision before a tool call
// of a live run: a policy of 1,000 tool rules, none of them path or url
// rules, and 2 KB of arguments.
func BenchmarkDecideTool(b *testing.B) {
	var rules []string
	for i := range 1000 {
		rules = append(rules, fmt.Sprintf(`{"action": "tool", "tool": "tool%d", "decision": %q}`, i, []string{"allow", "ask", "deny"}[i%3]))
	}
	p, err := policy.Compile(policy.Options{}, policy.LayerFile{Layer: policy.LayerUser, Name: "policy.json",
		Data: []byte(`{"rules": [` + strings.Join(rules, ",") + `]}`)})
	if err != nil {
		b.Fatal(err)
	}
	st, err := store.Open(context.Background(), filepath.Join(b.TempDir(), "keel.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	e, err := New(Config{Store: st, Model: scripted.New(nil), Tools: benchTools{}, Policy: fixedPolicy{policy.Snapshot{Policy: p, Version: 1}}})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close(context.Background())
	run := keel.Run{ID: "bench"}
	e.labels.mu.Lock()
	if e.labels.runs == nil {
		e.labels.runs = map[keel.RunID]*liveLabels{}
	}
	e.labels.runs[run.ID] = &liveLabels{}
	e.labels.mu.Unlock()
	args, _ := json.Marshal(map[string]any{"query": strings.Repeat("x", 1900), "limit": 10, "fields": []string{"a", "b", "c"}})
	call := keel.ToolCall{ID: "c1", Name: "query", Arguments: args}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if o, _ := e.decideTool(ctx, run, call); o != policy.Allow {
			b.Fatalf("decideTool = %s, want allow", o)
		}
	}
}
