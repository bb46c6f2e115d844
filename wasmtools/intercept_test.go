package wasmtools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/intercept"
)

// hookLog is what interceptors saw, in order.
type hookLog struct {
	mu    sync.Mutex
	lines []string
	after []intercept.ToolOutcome
}

func (l *hookLog) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
}

func (l *hookLog) take() ([]string, []intercept.ToolOutcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines, after := l.lines, l.after
	l.lines, l.after = nil, nil
	return lines, after
}

// named is an interceptor that logs its hooks and denies the calls
// deny picks.
type named struct {
	name string
	log  *hookLog
	deny func(keel.ToolInvocation) bool
}

func (n named) BeforeTool(_ context.Context, inv keel.ToolInvocation) intercept.Decision {
	n.log.add(fmt.Sprintf("%s before %s run=%s step=%d call=%s", n.name, inv.Name, inv.Run, inv.Step, inv.CallID))
	if n.deny != nil && n.deny(inv) {
		return intercept.Decision{Deny: true, By: n.name, Reason: "the path names a secret"}
	}
	return intercept.Decision{}
}

func (n named) AfterTool(_ context.Context, inv keel.ToolInvocation, d intercept.Decision, o intercept.ToolOutcome) {
	n.log.add(fmt.Sprintf("%s after %s deny=%v by=%s", n.name, inv.Name, d.Deny, d.By))
	n.log.mu.Lock()
	n.log.after = append(n.log.after, o)
	n.log.mu.Unlock()
}

// TestInterceptors: the registry's call entry runs its interceptors
// around every call of a real module, in order (Before first to last,
// After last to first), and each sees who called, the decision and the
// outcome: the build that ran, the result or the classified error, the
// duration. A denied call does not run.
func TestInterceptors(t *testing.T) {
	t.Parallel()
	ws := workspace(t)
	log := &hookLog{}
	var ran atomic.Int32
	cfg := Config{Dir: toolsDir, Grants: readOnlyWorkspace(ws), testHookCall: func(string) { ran.Add(1) }}
	cfg.Interceptors = intercept.Tools{
		named{name: "audit", log: log},
		named{name: "policy", log: log, deny: func(inv keel.ToolInvocation) bool { return strings.Contains(string(inv.Args), "secret") }},
		named{name: "telemetry", log: log},
	}
	r := openRegistry(t, cfg)
	wc, _ := r.Tool("wordcount")
	rf, _ := r.Tool("readfile")
	ctx := context.Background()

	tests := []struct {
		name      string
		inv       keel.ToolInvocation
		wantHooks []string
		wantCode  keel.ToolErrorCode // "" for success
		wantBuild intercept.ToolBuild
		wantRan   bool
	}{
		{
			name: "a run's call",
			inv:  keel.ToolInvocation{Run: "run_1", Step: 2, CallID: "call_2_1", Name: "wordcount", Args: json.RawMessage(`{"text":"a b c"}`)},
			wantHooks: []string{
				"audit before wordcount run=run_1 step=2 call=call_2_1",
				"policy before wordcount run=run_1 step=2 call=call_2_1",
				"telemetry before wordcount run=run_1 step=2 call=call_2_1",
				"telemetry after wordcount deny=false by=",
				"policy after wordcount deny=false by=",
				"audit after wordcount deny=false by=",
			},
			wantBuild: intercept.ToolBuild{Version: wc.Spec.Version, SHA256: wc.SHA256, SideEffects: keel.SideEffectReadOnly},
			wantRan:   true,
		},
		{
			name:      "a direct call with its grants",
			inv:       keel.ToolInvocation{Name: "readfile", Args: json.RawMessage(`{"path":"notes.txt"}`)},
			wantBuild: intercept.ToolBuild{Version: rf.Spec.Version, SHA256: rf.SHA256, Grants: []string{"fs:/workspace=ro"}, SideEffects: keel.SideEffectReadOnly},
			wantRan:   true,
		},
		{
			name:      "invalid input",
			inv:       keel.ToolInvocation{Name: "wordcount", Args: json.RawMessage(`{"text":3}`)},
			wantCode:  keel.ToolInvalidInput,
			wantBuild: intercept.ToolBuild{Version: wc.Spec.Version, SHA256: wc.SHA256, SideEffects: keel.SideEffectReadOnly},
		},
		{
			name:     "no such tool",
			inv:      keel.ToolInvocation{Name: "nosuch"},
			wantCode: keel.ToolNotFound,
		},
		{
			name: "denied",
			inv:  keel.ToolInvocation{Run: "run_1", Step: 3, CallID: "call_3_1", Name: "readfile", Args: json.RawMessage(`{"path":"secret.txt"}`)},
			wantHooks: []string{
				"audit before readfile run=run_1 step=3 call=call_3_1",
				"policy before readfile run=run_1 step=3 call=call_3_1",
				"telemetry after readfile deny=true by=policy",
				"policy after readfile deny=true by=policy",
				"audit after readfile deny=true by=policy",
			},
			wantCode: keel.ToolPermissionDenied,
		},
	}
	for _, tt := range tests {
		before := ran.Load()
		out, err := r.Call(ctx, tt.inv)
		hooks, after := log.take()
		if tt.wantHooks != nil {
			if diff := cmp.Diff(tt.wantHooks, hooks); diff != "" {
				t.Errorf("%s: hooks (-want +got):\n%s", tt.name, diff)
			}
		} else if len(hooks) != 6 {
			t.Errorf("%s: hooks = %q, want 3 before and 3 after", tt.name, hooks)
		}
		if len(after) != 3 {
			t.Fatalf("%s: %d After hooks, want 3", tt.name, len(after))
		}
		// Every After sees the same outcome, and it is what Call returned.
		o := after[2]
		for _, other := range after[:2] {
			if !cmp.Equal(other, o) {
				t.Errorf("%s: After hooks saw different outcomes: %+v and %+v", tt.name, other, o)
			}
		}
		if got := ran.Load() - before; (got == 1) != tt.wantRan {
			t.Errorf("%s: the tool ran %d times, want ran=%v", tt.name, got, tt.wantRan)
		}
		if !cmp.Equal(o.Build, tt.wantBuild) {
			t.Errorf("%s: outcome build = %+v, want %+v", tt.name, o.Build, tt.wantBuild)
		}
		if o.Start.IsZero() || (tt.wantRan && o.Duration <= 0) {
			t.Errorf("%s: outcome start %v, duration %v; want both set", tt.name, o.Start, o.Duration)
		}
		var te *keel.ToolError
		switch {
		case tt.wantCode == "":
			if err != nil || o.Err != nil || len(out) == 0 || string(o.Output) != string(out) {
				t.Errorf("%s: Call = %s, %v; outcome %s, %v; want the same result", tt.name, out, err, o.Output, o.Err)
			}
		case !errors.As(err, &te) || te.Code != tt.wantCode || o.Err == nil || *o.Err != *te:
			t.Errorf("%s: Call error = %v, outcome error %v; want both %s", tt.name, err, o.Err, tt.wantCode)
		}
	}
	// The caller learns who denied a call, and why.
	_, err := r.Call(ctx, keel.ToolInvocation{Name: "readfile", Args: json.RawMessage(`{"path":"secret.txt"}`)})
	if te, ok := errors.AsType[*keel.ToolError](err); !ok || !strings.Contains(te.Message, "denied by policy: the path names a secret") {
		t.Errorf("denied call error = %v, want it to say who denied it and why", err)
	}
}
