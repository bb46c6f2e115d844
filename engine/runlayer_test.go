package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/policy"
)

// rulesText is a run's rules as a string holding the document, as keel
// run --policy sends a file: explanations name its lines.
func rulesText(doc string) json.RawMessage {
	b, _ := json.Marshal(doc)
	return b
}

// approvalsAsked returns the approval.requested events of a journal.
func approvalsAsked(t *testing.T, evs []keel.Event) []keel.ApprovalRequestData {
	t.Helper()
	var out []keel.ApprovalRequestData
	for _, ev := range evs {
		if ev.Type == keel.EventApprovalAsked {
			var d keel.ApprovalRequestData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
		}
	}
	return out
}

// TestRunRulesDecide: a run started with rules that deny write gets
// policy_denied naming its rule (run.start:LINE:COL), while another run
// of the same engine, without rules, writes; a run's allow does not
// loosen the user layer's deny nor its ask.
func TestRunRulesDecide(t *testing.T) {
	t.Parallel()
	pol := &swappable{}
	pol.set(t, 1, `{"rules": [
  {"action": "tool", "tool": "echo", "decision": "ask"},
  {"action": "tool", "tool": "write", "args": {"/n": "2"}, "decision": "deny", "reason": "not two"}
]}`)
	p := scripted.ByGoal(nil, func(goal string) []scripted.Step {
		switch goal {
		case "echo":
			return []scripted.Step{scripted.CallTools(keel.ToolCall{ID: "e1", Name: "echo", Arguments: json.RawMessage(`{"text":"hi"}`)}), scripted.Answer("echoed")}
		case "write two":
			return []scripted.Step{scripted.CallTools(keel.ToolCall{ID: "w2", Name: "write", Arguments: json.RawMessage(`{"n":2}`)}), scripted.Answer("done")}
		}
		return []scripted.Step{scripted.CallTools(keel.ToolCall{ID: "w1", Name: "write", Arguments: json.RawMessage(`{"n":1}`)}), scripted.Answer("done")}
	})
	st, eng, tools := policyHarness(t, p, pol)
	ctx := context.Background()

	denies := rulesText("{\n  \"rules\": [\n    {\"action\": \"tool\", \"tool\": \"write\", \"decision\": \"deny\", \"reason\": \"this run reads only\"}\n  ]\n}\n")
	r, err := eng.Start(ctx, engine.StartRequest{Goal: "write one", Policy: keel.RunPolicy{Rules: denies}})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunSucceeded || string(got.Policy.Rules) != string(denies) {
		t.Fatalf("run = %s %q rules %s, want succeeded with its rules stored", got.Status, got.Error, got.Policy.Rules)
	}
	res := toolResults(t, journal(t, st, r.ID))["w1"]
	if res.Error == nil || res.Error.Code != keel.ToolPolicyDenied || !strings.Contains(res.Error.Message, "rule 1 of the run layer ("+engine.RunRulesFile+":3:5): this run reads only") {
		t.Fatalf("the write of the run with rules = %+v, want policy_denied naming rule 1 of the run layer (run.start:3:5)", res.Error)
	}
	if tools.writes != 0 {
		t.Fatalf("the denied write ran")
	}
	replayMatches(t, eng, st, r.ID)

	free, err := eng.Start(ctx, engine.StartRequest{Goal: "write one more"})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, free.ID); got.Status != keel.RunSucceeded {
		t.Fatalf("run without rules = %s %q", got.Status, got.Error)
	}
	if res := toolResults(t, journal(t, st, free.ID))["w1"]; res.Error != nil || tools.writes != 1 {
		t.Fatalf("the write of the run without rules = %+v (writes %d), want it to run", res.Error, tools.writes)
	}

	// The run allows all; the user layer's deny and ask stand.
	allows := rulesText(`{"default": {"tool": "allow"}, "rules": [{"action": "tool", "decision": "allow"}]}`)
	w2, err := eng.Start(ctx, engine.StartRequest{Goal: "write two", Policy: keel.RunPolicy{Rules: allows}})
	if err != nil {
		t.Fatal(err)
	}
	waitRun(t, eng, st, w2.ID)
	if res := toolResults(t, journal(t, st, w2.ID))["w2"]; res.Error == nil || res.Error.Code != keel.ToolPolicyDenied || !strings.Contains(res.Error.Message, "user/policy.json:3:") {
		t.Fatalf("write two under a run's allow = %+v, want the user layer's deny", res.Error)
	}
	ec, err := eng.Start(ctx, engine.StartRequest{Goal: "echo", Policy: keel.RunPolicy{Rules: allows}})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, ec.ID); got.Status != keel.RunWaiting {
		t.Fatalf("echo under a run's allow = %s, want waiting on the user layer's ask", got.Status)
	}
	if asked := approvalsAsked(t, journal(t, st, ec.ID)); len(asked) != 1 || !strings.Contains(asked[0].Policy.Explanation, "user/policy.json:2:") {
		t.Fatalf("asked = %+v, want the user layer's ask", asked)
	}
}

// TestRunRulesRefused: rules that do not compile refuse the start with
// keel.ErrInvalid, naming policy.rules and the line and column (of the
// text sent), and no run is stored: a syntax error, an unknown field, a
// lock, a document that is not an object, one too large.
func TestRunRulesRefused(t *testing.T) {
	t.Parallel()
	pol := &swappable{}
	p, err := policy.Compile(policy.Options{}, policy.LayerFile{Layer: policy.LayerManaged, Name: "managed.json", Data: []byte(`{"cloud": false, "lock": ["cloud"]}`)})
	if err != nil {
		t.Fatal(err)
	}
	pol.cur.Store(&policy.Snapshot{Policy: p, Version: 1})
	st, eng, _ := policyHarness(t, scripted.New(nil, scripted.Answer("no")), pol)
	for _, c := range []struct {
		name  string
		rules json.RawMessage
		want  string
		is    error
	}{
		{"syntax", rulesText("{\n  \"rules\": [\n    {\"action\": \"tool\",, }\n  ]\n}"), engine.RunRulesFile + ":3:", policy.ErrSyntax},
		{"unknown field", rulesText("{\n  \"rulez\": []\n}"), engine.RunRulesFile + ":2:3", policy.ErrUnknownField},
		{"object unknown field", json.RawMessage(`{"rules": [{"action": "tool", "decision": "deny", "colour": "red"}]}`), engine.RunRulesFile + ":1:", policy.ErrUnknownField},
		{"locked", rulesText("{\n  \"cloud\": true\n}"), engine.RunRulesFile + ":2:", policy.ErrLocked},
		{"lock", rulesText(`{"lock": ["cloud"]}`), engine.RunRulesFile + ":1:", policy.ErrInvalid},
		{"not an object", json.RawMessage(`[1]`), "policy.rules", nil},
		{"too large", rulesText(`{"comment": "` + strings.Repeat("x", policy.MaxFileSize) + `"}`), "policy.rules", nil},
	} {
		_, err := eng.Start(context.Background(), engine.StartRequest{Goal: "go", Policy: keel.RunPolicy{Rules: c.rules}})
		if !errors.Is(err, keel.ErrInvalid) || !strings.Contains(err.Error(), "policy.rules") || !strings.Contains(err.Error(), c.want) || c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("%s: Start = %v, want keel.ErrInvalid naming policy.rules and %s (%v)", c.name, err, c.want, c.is)
		}
	}
	if runs, err := st.ListRuns(context.Background(), 10); err != nil || len(runs) != 0 {
		t.Fatalf("runs after refused starts = %d (%v), want none", len(runs), err)
	}
}

// TestRunRulesSurviveRestart: a run waiting on an ask of its own rules
// is approved by a new engine over the same database, with no policy of
// its own: the run's next write asks again, by its rules as stored, and
// a replay reproduces every decision.
func TestRunRulesSurviveRestart(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil,
		scripted.CallTools(keel.ToolCall{ID: "c1", Name: "write", Arguments: json.RawMessage(`{"n":1}`)}),
		scripted.CallTools(keel.ToolCall{ID: "c2", Name: "write", Arguments: json.RawMessage(`{"n":2}`)}),
		scripted.Answer("written"))
	tools := &echoTools{}
	st, first := newEngine(t, engine.Config{Model: p, Tools: tools})
	ctx := context.Background()
	rules := rulesText("{\"rules\": [\n  {\"action\": \"tool\", \"side_effects\": \"non_idempotent_write\", \"decision\": \"ask\"}\n]}")
	r, err := first.Start(ctx, engine.StartRequest{Goal: "write it", Policy: keel.RunPolicy{Rules: rules}})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, first, st, r.ID); got.Status != keel.RunWaiting {
		t.Fatalf("run = %s %q, want waiting on its rules' ask", got.Status, got.Error)
	}
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}

	second, err := engine.New(engine.Config{Store: st, Model: p, Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Close(context.Background()) })
	if _, err := second.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	approve := func(i int) {
		t.Helper()
		asked := approvalsAsked(t, journal(t, st, r.ID))
		if len(asked) != i+1 || asked[i].Policy == nil || !strings.Contains(asked[i].Policy.Explanation, "rule 1 of the run layer ("+engine.RunRulesFile+":2:3)") {
			t.Fatalf("approvals asked = %+v, want %d, the last by rule 1 of the run layer (run.start:2:3)", asked, i+1)
		}
		if _, err := second.Approve(ctx, r.ID, keel.ApprovalData{CallID: asked[i].Call.ID, ArgsSHA256: asked[i].ArgsSHA256, Approved: true}); err != nil {
			t.Fatal(err)
		}
	}
	approve(0)
	if got := waitRun(t, second, st, r.ID); got.Status != keel.RunWaiting {
		t.Fatalf("run after the first approval = %s %q, want waiting on the second write (its rules after the restart)", got.Status, got.Error)
	}
	approve(1)
	if got := waitRun(t, second, st, r.ID); got.Status != keel.RunSucceeded || tools.writes != 2 {
		t.Fatalf("run = %s %q with %d writes, want succeeded with 2", got.Status, got.Error, tools.writes)
	}
	replayMatches(t, second, st, r.ID)
}

// TestDAGChildInheritsRunRules: a sub-agent keeps its run's own rules:
// the write of a DAG run's step waits on the parent's rule (named as
// run.start), though the engine asks for nothing itself.
func TestDAGChildInheritsRunRules(t *testing.T) {
	t.Parallel()
	m := &fakeModel{step: func(_ context.Context, step string, req models.ChatRequest) (models.ChatResponse, error) {
		if out, ok := lastTool(req); ok {
			return text("wrote: " + out), nil
		}
		return callTool("write"), nil
	}}
	h := newFlowHarness(t, m.provider(), engine.Config{})
	ctx := context.Background()
	rules := rulesText("{\"rules\": [\n  {\"action\": \"tool\", \"tool\": \"write\", \"decision\": \"ask\"}\n]}")
	r := h.start(t, engine.StartRequest{Kind: keel.KindDAG, Policy: keel.RunPolicy{Rules: rules},
		Plan: &keel.Plan{Steps: []keel.PlanStep{{ID: "w", Goal: "write it", Tools: []string{"write"}}}}})
	child := childRunID(r.ID, "w", 1)
	waitUntil(t, h.eng, func() bool { c, _ := h.st.GetRun(ctx, child); return c.Status == keel.RunWaiting })
	c, err := h.st.GetRun(ctx, child)
	if err != nil {
		t.Fatal(err)
	}
	if string(c.Policy.Rules) != string(rules) {
		t.Errorf("the sub-agent's rules = %s, want its parent's %s", c.Policy.Rules, rules)
	}
	asked := approvalsAsked(t, journal(t, h.st, child))
	if len(asked) != 1 || asked[0].Policy == nil || !strings.Contains(asked[0].Policy.Explanation, "rule 1 of the run layer ("+engine.RunRulesFile+":2:3)") {
		t.Fatalf("the sub-agent's approvals = %+v, want one asked by its parent's rule", asked)
	}
	if _, err := h.eng.Cancel(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	waitRun(t, h.eng, h.st, r.ID)
}

// TestRunRulesWarnings: the warnings of a run's rules (a rule that can
// never match) come back with the start, naming run.start:LINE:COL, and
// are not stored.
func TestRunRulesWarnings(t *testing.T) {
	t.Parallel()
	st, eng, _ := policyHarness(t, scripted.New(nil, scripted.Answer("done")), nil)
	rules := rulesText("{\"rules\": [\n  {\"action\": \"tool\", \"path\": \"relative/x\", \"decision\": \"deny\"}\n]}")
	r, err := eng.Start(context.Background(), engine.StartRequest{Goal: "go", Policy: keel.RunPolicy{Rules: rules}})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Warnings) == 0 {
		t.Error("no warnings, want the rule that can never match")
	}
	for _, w := range r.Warnings {
		if !strings.HasPrefix(w, engine.RunRulesFile+":2:") {
			t.Errorf("warning %q, want it to name %s:2", w, engine.RunRulesFile)
		}
	}
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunSucceeded || got.Warnings != nil {
		t.Errorf("stored run = %s with warnings %q, want succeeded with none stored", got.Status, got.Warnings)
	}
}

// TestRunRulesCompiledOnce: a run's policy is compiled once per policy
// in force and rules, whatever slice holds the rules (a run read back
// from the store), and is its own: another run's rules, or none, give
// another policy; a change of the policy in force compiles it again.
func TestRunRulesCompiledOnce(t *testing.T) { // not parallel: AllocsPerRun
	pol := &swappable{}
	pol.set(t, 1, allowAll)
	_, eng, _ := policyHarness(t, scripted.New(nil), pol)
	rules := rulesText(`{"rules": [{"action": "tool", "tool": "write", "decision": "deny"}]}`)
	run := keel.Run{Policy: keel.RunPolicy{Rules: rules}}
	first, _ := eng.PolicyOf(run)
	again, _ := eng.PolicyOf(keel.Run{Policy: keel.RunPolicy{Rules: append(json.RawMessage{}, rules...)}})
	if first == nil || first != again {
		t.Fatalf("PolicyOf twice = %p, %p; want one compiled policy", first, again)
	}
	if n := testing.AllocsPerRun(100, func() { eng.PolicyOf(run) }); n != 0 {
		t.Errorf("finding a run's compiled policy allocates %v times, want 0", n)
	}
	if d := first.Decide(&policy.Action{Kind: policy.KindTool, Tool: "write"}); d.Outcome != policy.Deny {
		t.Errorf("the run's policy decides write %s, want deny", d.Outcome)
	}
	if none, _ := eng.PolicyOf(keel.Run{}); none == first {
		t.Error("a run without rules got the policy of one with rules")
	}
	pol.set(t, 2, allowAll)
	if next, v := eng.PolicyOf(run); next == first || v != 2 {
		t.Errorf("after a change of the policy in force: %p version %d, want a new policy at version 2", next, v)
	}
}
