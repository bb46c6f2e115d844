package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/policy"
	"github.com/keel-runtime/keel/store"
)

// swappable is a policy in force that a test replaces, as the daemon's
// watcher does when a file changes.
type swappable struct {
	cur atomic.Pointer[policy.Snapshot]
}

func (s *swappable) Current() policy.Snapshot               { return *s.cur.Load() }
func (s *swappable) CurrentFor(string) policy.Snapshot      { return s.Current() }
func (s *swappable) Use(string) (release func(), err error) { return func() {}, nil }

func (s *swappable) set(t *testing.T, version uint64, file string) {
	t.Helper()
	p, err := policy.Compile(policy.Options{}, policy.LayerFile{Layer: policy.LayerUser, Name: "user/policy.json", Data: []byte(file)})
	if err != nil {
		t.Fatal(err)
	}
	s.cur.Store(&policy.Snapshot{Policy: p, Version: version})
}

const (
	denyWrite = `{"rules": [{"action": "tool", "tool": "write", "decision": "deny", "reason": "no writes here"}]}`
	askWrite  = `{"rules": [{"action": "tool", "tool": "write", "decision": "ask"}]}`
	allowAll  = `{"rules": []}`
)

func policyHarness(t *testing.T, p *scripted.Provider, pol engine.Policy) (*store.Store, *engine.Engine, *echoTools) {
	t.Helper()
	tools := &echoTools{}
	st, eng := newEngine(t, engine.Config{Model: p, Tools: tools, Policy: pol})
	return st, eng, tools
}

func eventData[T any](t *testing.T, evs []keel.Event, typ keel.EventType) (T, bool) {
	t.Helper()
	var d T
	for _, ev := range evs {
		if ev.Type == typ {
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatal(err)
			}
			return d, true
		}
	}
	return d, false
}

// TestPolicyDeniesToolCall: a call the policy denies does not run; the
// model sees a policy_denied error naming the rule and its file:line;
// the decision is journaled with the result and on the call's span; a
// replay, with the policy since changed to allow it, uses the journaled
// decision and reproduces the run.
func TestPolicyDeniesToolCall(t *testing.T) {
	t.Parallel()
	pol := &swappable{}
	pol.set(t, 3, denyWrite)
	p := scripted.New(nil, scripted.CallTool("write", `{"n":1}`), scripted.Answer("could not write"))
	st, eng, tools := policyHarness(t, p, pol)
	r, err := eng.Start(context.Background(), engine.StartRequest{Goal: "write it"})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q, want succeeded", got.Status, got.Error)
	}
	if tools.writes != 0 {
		t.Errorf("the denied tool ran %d times, want 0", tools.writes)
	}
	evs := journal(t, st, r.ID)
	if _, ok := eventData[keel.ToolCallData](t, evs, keel.EventToolCall); ok {
		t.Error("a denied call journaled a tool.call intent")
	}
	res, _ := eventData[keel.ToolResultData](t, evs, keel.EventToolResult)
	if res.Error == nil || res.Error.Code != keel.ToolPolicyDenied || !strings.Contains(res.Error.Message, "user/policy.json:1:") {
		t.Fatalf("tool.result error = %+v, want policy_denied naming user/policy.json:1", res.Error)
	}
	if pd := res.Policy; pd == nil || pd.Outcome != "deny" || pd.Version != 3 || pd.Digest == "" {
		t.Fatalf("tool.result policy = %+v, want deny at version 3 with a digest", pd)
	}
	reqs := p.Requests()
	if last := reqs[len(reqs)-1].Messages; !strings.Contains(last[len(last)-1].Content, "policy_denied") {
		t.Errorf("the model saw %q, want the policy_denied error", last[len(last)-1].Content)
	}
	spans, err := st.Spans(context.Background(), r.ID)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, sp := range spans {
		if sp.Kind == keel.SpanToolCall {
			found = sp.Status == keel.SpanError && strings.Contains(string(sp.Attrs), `"outcome":"deny"`)
		}
	}
	if !found {
		t.Errorf("no tool.call span with the deny decision: %+v", spans)
	}
	pol.set(t, 4, allowAll)
	replayMatches(t, eng, st, r.ID)
}

// TestPolicyAskStandsOnResume: a call the policy asks about waits for a
// person; the ask is journaled with its decision, and once approved the
// call runs under that decision even though the policy now denies it.
func TestPolicyAskStandsOnResume(t *testing.T) {
	t.Parallel()
	pol := &swappable{}
	pol.set(t, 1, askWrite)
	p := scripted.New(nil, scripted.CallTools(keel.ToolCall{ID: "c1", Name: "write", Arguments: json.RawMessage(`{"n":1}`)}), scripted.Answer("written"))
	st, eng, tools := policyHarness(t, p, pol)
	ctx := context.Background()
	r := startWaiting(t, eng, st)
	asked, _ := eventData[keel.ApprovalRequestData](t, journal(t, st, r.ID), keel.EventApprovalAsked)
	if asked.Policy == nil || asked.Policy.Outcome != "ask" || asked.Policy.Version != 1 {
		t.Fatalf("approval.requested policy = %+v, want ask at version 1", asked.Policy)
	}
	pol.set(t, 2, denyWrite)
	if _, err := eng.Approve(ctx, r.ID, keel.ApprovalData{CallID: "c1", ArgsSHA256: asked.ArgsSHA256, Approved: true}); err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q, want succeeded", got.Status, got.Error)
	}
	if tools.writes != 1 {
		t.Errorf("the approved tool ran %d times, want 1", tools.writes)
	}
	call, _ := eventData[keel.ToolCallData](t, journal(t, st, r.ID), keel.EventToolCall)
	if call.Policy == nil || call.Policy.Outcome != "ask" {
		t.Errorf("tool.call policy = %+v, want the ask it ran under", call.Policy)
	}
	replayMatches(t, eng, st, r.ID)
}

// TestRequireApprovalIsPolicyShorthand: --require-approval asks through
// the policy, with the rule named as --require-approval.
func TestRequireApprovalIsPolicyShorthand(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil, scripted.CallTool("write", `{"n":1}`), scripted.Answer("done"))
	st, eng, _ := resumeHarness(t, p, keel.SideEffectNonIdempotentWrite)
	r := startWaiting(t, eng, st)
	asked, _ := eventData[keel.ApprovalRequestData](t, journal(t, st, r.ID), keel.EventApprovalAsked)
	if asked.Policy == nil || !strings.Contains(asked.Policy.Explanation, policy.RequireApprovalName) {
		t.Fatalf("approval.requested policy = %+v, want the --require-approval rule", asked.Policy)
	}
	if _, err := engine.New(engine.Config{Store: st, Model: p, Tools: &echoTools{}, RequireApproval: []keel.SideEffect{"sometimes"}}); err == nil {
		t.Error("New with an unknown side-effect class succeeded")
	}
}

// targetCounter is echoTools that counts, by tool, the calls whose paths
// and URLs the engine asks for.
type targetCounter struct {
	echoTools
	mu    sync.Mutex
	asked map[string]int
}

func (t *targetCounter) CallTargets(name string, args json.RawMessage) keel.CallTargets {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.asked == nil {
		t.asked = map[string]int{}
	}
	t.asked[name]++
	return keel.CallTargets{Paths: []string{"/secret/x"}}
}

// TestCallTargetsOnlyWhenNeeded: the engine asks a tool call's paths and
// URLs only when a path or url rule could look at them: with a path
// rule for echo, a call of write is decided (and denied by its own rule)
// without asking, a call of echo asks once and is denied by the path
// rule.
func TestCallTargetsOnlyWhenNeeded(t *testing.T) {
	t.Parallel()
	pol := &swappable{}
	pol.set(t, 1, `{"rules": [
		{"action": "tool", "tool": "echo", "path": "/secret/**", "decision": "deny", "reason": "secret"},
		{"action": "tool", "tool": "write", "decision": "deny", "reason": "no writes"}]}`)
	p := scripted.New(nil, scripted.CallTools(
		keel.ToolCall{ID: "w", Name: "write", Arguments: json.RawMessage(`{"n":1}`)},
		keel.ToolCall{ID: "e", Name: "echo", Arguments: json.RawMessage(`{"text":"hi"}`)}), scripted.Answer("done"))
	tools := &targetCounter{}
	st, eng := newEngine(t, engine.Config{Model: p, Tools: tools, Policy: pol})
	r, err := eng.Start(context.Background(), engine.StartRequest{Goal: "write and echo"})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q, want succeeded", got.Status, got.Error)
	}
	tools.mu.Lock()
	asked := maps.Clone(tools.asked)
	tools.mu.Unlock()
	if asked["write"] != 0 || asked["echo"] != 1 {
		t.Errorf("CallTargets asked %v, want echo once and write never", asked)
	}
	for _, ev := range journal(t, st, r.ID) {
		if ev.Type != keel.EventToolResult {
			continue
		}
		var res keel.ToolResultData
		if err := json.Unmarshal(ev.Data, &res); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"w": "no writes", "e": "secret"}[res.CallID]
		if res.Error == nil || res.Error.Code != keel.ToolPolicyDenied || !strings.Contains(res.Error.Message, want) {
			t.Errorf("call %s error = %+v, want policy_denied: %s", res.CallID, res.Error, want)
		}
	}
}

// TestAllowJournaledOncePerPolicy: an allow a rule made is journaled with
// the first call it lets run under a policy, and again after the policy
// changes, but not with every call (it is on every call's span); a
// replay still reproduces the run.
func TestAllowJournaledOncePerPolicy(t *testing.T) {
	t.Parallel()
	const allowWrite = `{"rules": [{"action": "tool", "tool": "write", "decision": "allow", "reason": "writes are fine"}]}`
	const allowWrite2 = `{"rules": [{"action": "tool", "tool": "write", "decision": "allow", "reason": "writes are still fine"}]}`
	pol := &swappable{}
	pol.set(t, 1, allowWrite)
	write := func(n int) keel.ToolCall {
		return keel.ToolCall{ID: fmt.Sprintf("w%d", n), Name: "write", Arguments: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}
	}
	p := scripted.New(nil,
		scripted.AnswerFunc(func(models.ChatRequest) (models.ChatResponse, error) {
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{write(1)}}}, nil
		}),
		scripted.AnswerFunc(func(models.ChatRequest) (models.ChatResponse, error) {
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{write(2)}}}, nil
		}),
		scripted.AnswerFunc(func(models.ChatRequest) (models.ChatResponse, error) {
			pol.set(t, 2, allowWrite2) // the policy file changed
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{write(3)}}}, nil
		}),
		scripted.Answer("written"))
	st, eng, tools := policyHarness(t, p, pol)
	r, err := eng.Start(context.Background(), engine.StartRequest{Goal: "write thrice"})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q, want succeeded", got.Status, got.Error)
	}
	if tools.writes != 3 {
		t.Fatalf("write ran %d times, want 3", tools.writes)
	}
	journaled := map[string]uint64{}
	for _, ev := range journal(t, st, r.ID) {
		var d keel.ToolCallData
		if ev.Type != keel.EventToolCall || json.Unmarshal(ev.Data, &d) != nil {
			continue
		}
		if d.Policy != nil {
			if d.Policy.Outcome != "allow" || d.Policy.Digest == "" {
				t.Errorf("call %s journaled %+v, want an allow with its digest", d.Call.ID, d.Policy)
			}
			journaled[d.Call.ID] = d.Policy.Version
		}
	}
	if want := map[string]uint64{"w1": 1, "w3": 2}; !maps.Equal(journaled, want) {
		t.Errorf("allow decisions journaled by call (version) = %v, want %v: the first under each policy", journaled, want)
	}
	spans, err := st.Spans(context.Background(), r.ID)
	if err != nil {
		t.Fatal(err)
	}
	onSpans := 0
	for _, sp := range spans {
		if sp.Kind == keel.SpanToolCall && strings.Contains(string(sp.Attrs), `"outcome":"allow"`) {
			onSpans++
		}
	}
	if onSpans != 3 {
		t.Errorf("%d tool spans carry the allow decision, want all 3", onSpans)
	}
	replayMatches(t, eng, st, r.ID)
}
