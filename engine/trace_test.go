package engine_test

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
)

// traceTree renders a run's trace as kind/status(children...), children
// in start order, and fails the test unless it is one tree: one root
// span, of kind run, and every other span's parent in the trace.
func traceTree(t *testing.T, spans []keel.Span) string {
	t.Helper()
	ids := map[string]bool{}
	for _, sp := range spans {
		if ids[sp.ID] {
			t.Errorf("span %s is in the trace twice", sp.ID)
		}
		ids[sp.ID] = true
	}
	kids := map[string][]keel.Span{}
	var roots []keel.Span
	for _, sp := range spans {
		if sp.Kind == keel.SpanRun {
			roots = append(roots, sp)
			continue
		}
		if !ids[sp.ID] || !ids[sp.ParentID] {
			t.Errorf("span %s (%s) has parent %q, which is not in the trace", sp.ID, sp.Kind, sp.ParentID)
		}
		kids[sp.ParentID] = append(kids[sp.ParentID], sp)
	}
	if len(roots) != 1 {
		t.Fatalf("trace has %d root spans, want 1: %+v", len(roots), spans)
	}
	var render func(sp keel.Span) string
	render = func(sp keel.Span) string {
		s := string(sp.Kind) + "/" + string(sp.Status)
		cs := kids[sp.ID]
		sort.SliceStable(cs, func(i, j int) bool { return cs[i].Start.Before(cs[j].Start) })
		if len(cs) == 0 {
			return s
		}
		var parts []string
		for _, c := range cs {
			parts = append(parts, render(c))
		}
		return s + "(" + strings.Join(parts, " ") + ")"
	}
	return render(roots[0])
}

func spansOf(t *testing.T, st *store.Store, id keel.RunID) []keel.Span {
	t.Helper()
	spans, err := st.Spans(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return spans
}

// TestTraceIsATree: a run with a tool call that waits for a person's
// approval has one root span, a step span per model step, and the model
// call, the wait and the tool call under their step, while it waits and
// once it ends. Each model span carries the model's digest and the
// hashes of the prompt template and of the whole prompt it was sent.
func TestTraceIsATree(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil,
		scripted.CallTools(keel.ToolCall{ID: "c1", Name: "write", Arguments: json.RawMessage(`{"n":1}`)}),
		scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
			return models.ChatResponse{Message: models.Message{Content: "done"}, ModelDigest: "d1g357"}, nil
		}))
	st, eng, _ := resumeHarness(t, p, keel.SideEffectNonIdempotentWrite)
	ctx := context.Background()
	r := startWaiting(t, eng, st)
	const waiting = "run/running(step/running(model.call/ok human.wait/running))"
	if got := traceTree(t, spansOf(t, st, r.ID)); got != waiting {
		t.Errorf("trace while waiting = %s, want %s", got, waiting)
	}
	asked := eventsOf(t, st, r.ID, keel.EventApprovalAsked)
	var d keel.ApprovalRequestData
	if len(asked) != 1 || json.Unmarshal(asked[0].Data, &d) != nil {
		t.Fatalf("approval requests = %v", asked)
	}
	if _, err := eng.Approve(ctx, r.ID, keel.ApprovalData{CallID: "c1", ArgsSHA256: d.ArgsSHA256, Approved: true}); err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunSucceeded {
		t.Fatalf("run = %s, want succeeded", got.Status)
	}
	spans := spansOf(t, st, r.ID)
	const ended = "run/ok(step/ok(model.call/ok human.wait/ok tool.call/ok) step/ok(model.call/ok))"
	if got := traceTree(t, spans); got != ended {
		t.Errorf("trace = %s, want %s", got, ended)
	}

	reqs := p.Requests()
	var model []keel.Span
	for _, sp := range spans {
		if sp.Kind == keel.SpanModelCall {
			model = append(model, sp)
		}
	}
	if len(model) != 2 || len(reqs) != 2 {
		t.Fatalf("%d model spans and %d requests, want 2 of each", len(model), len(reqs))
	}
	template, _ := models.PromptHashes(models.ChatRequest{Messages: []models.Message{{Role: models.RoleSystem, Content: engine.DefaultSystemPrompt}}})
	for i, sp := range model {
		_, full := models.PromptHashes(reqs[i])
		if sp.TemplateHash != template || sp.PromptHash != full || len(full) != 16 {
			t.Errorf("model span %d: template hash %q, prompt hash %q; want %q and %q", i+1, sp.TemplateHash, sp.PromptHash, template, full)
		}
	}
	if model[0].PromptHash == model[1].PromptHash {
		t.Errorf("both model calls have prompt hash %s, but the second was sent more", model[0].PromptHash)
	}
	if model[0].ModelDigest != "" || model[1].ModelDigest != "d1g357" {
		t.Errorf("model digests = %q, %q; want none, then the one the reply reported", model[0].ModelDigest, model[1].ModelDigest)
	}
}

// quickTools is echoTools whose "slow" tool returns at once.
type quickTools struct{ echoTools }

func (q *quickTools) Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	if inv.Name == "slow" {
		return json.RawMessage(`{"slow":"done"}`), nil
	}
	return q.echoTools.Call(ctx, inv)
}

// TestTraceTreeSurvivesAResume: a run stopped during a tool call and
// resumed by the next engine keeps one tree: its root and the step it
// was in are opened again, not duplicated, and the call run again hangs
// under the same step as the one cut off.
func TestTraceTreeSurvivesAResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	p := scripted.New(nil, scripted.CallTool("slow", `{}`))
	tools := &echoTools{slowEntered: make(chan struct{}, 1)}
	eng, err := engine.New(engine.Config{Store: st, Model: p, Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	r, err := eng.Start(ctx, engine.StartRequest{Goal: "wait"})
	if err != nil {
		t.Fatal(err)
	}
	waitSlow(t, tools) // its span starts before the call
	if err := eng.Close(ctx); err != nil {
		t.Fatal(err)
	}
	const cut = "run/error(step/error(model.call/ok tool.call/error))"
	if got := traceTree(t, spansOf(t, st, r.ID)); got != cut {
		t.Errorf("trace after shutdown = %s, want %s", got, cut)
	}

	eng2, err := engine.New(engine.Config{Store: st, Model: scripted.New(nil, scripted.Answer("done")), Tools: &quickTools{}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng2.Close(ctx)
	if n, err := eng2.Resume(ctx); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v; want 1", n, err)
	}
	if got := waitRun(t, eng2, st, r.ID); got.Status != keel.RunSucceeded {
		t.Fatalf("resumed run = %s (%s), want succeeded", got.Status, got.Error)
	}
	const resumed = "run/ok(step/ok(model.call/ok tool.call/error tool.call/ok) step/ok(model.call/ok))"
	spans := spansOf(t, st, r.ID)
	if got := traceTree(t, spans); got != resumed {
		t.Errorf("trace after resume = %s, want %s", got, resumed)
	}
	for _, sp := range spans {
		if sp.Kind == keel.SpanRun && !sp.Start.Equal(r.CreatedAt) {
			t.Errorf("root span starts at %v, want the run's creation %v", sp.Start, r.CreatedAt)
		}
	}
}

// TestTraceOfDAGRun: a DAG run's trace has a root span and a step span
// per sub-agent, and each sub-agent's root span names that step span as
// its parent.
func TestTraceOfDAGRun(t *testing.T) {
	t.Parallel()
	m := &fakeModel{}
	h := newFlowHarness(t, m.provider(), engine.Config{})
	r := h.dag(t, keel.PlanStep{ID: "a", Goal: "first"}, keel.PlanStep{ID: "b", Goal: "second", DependsOn: []string{"a"}})
	if r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s (%s), want succeeded", r.Status, r.Error)
	}
	spans := spansOf(t, h.st, r.ID)
	if got, want := traceTree(t, spans), "run/ok(step/ok step/ok)"; got != want {
		t.Errorf("DAG run's trace = %s, want %s", got, want)
	}
	steps := map[keel.RunID]keel.Span{}
	for _, sp := range spans {
		if sp.Kind == keel.SpanStep {
			var a struct {
				Run keel.RunID `json:"run"`
			}
			if err := json.Unmarshal(sp.Attrs, &a); err != nil {
				t.Fatalf("step span attrs %s: %v", sp.Attrs, err)
			}
			steps[a.Run] = sp
		}
	}
	for _, child := range []keel.RunID{childRunID(r.ID, "a", 1), childRunID(r.ID, "b", 1)} {
		step, ok := steps[child]
		if !ok {
			t.Errorf("no step span names sub-agent %s: %v", child, steps)
			continue
		}
		cs := spansOf(t, h.st, child)
		if got, want := traceTree(t, cs), "run/ok(step/ok(model.call/ok))"; got != want {
			t.Errorf("trace of %s = %s, want %s", child, got, want)
		}
		for _, sp := range cs {
			if sp.Kind == keel.SpanRun && sp.ParentID != step.ID {
				t.Errorf("root span of %s has parent %q, want the parent's step span %s", child, sp.ParentID, step.ID)
			}
		}
	}
}

// TestTraceStepLostInACrash: a crash lost the span of the step the run
// was in (it is written when the step ends) but not the model call's
// under it; the resumed run writes the step span with the ID its
// children name, so the trace is one tree again.
func TestTraceStepLostInACrash(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil, scripted.Answer("done"))
	st, eng, _ := resumeHarness(t, p)
	ctx := context.Background()
	id := keel.RunID("run_cut")
	interrupted(t, st, id, keel.ToolCall{ID: "c1", Name: "echo", Arguments: json.RawMessage(`{"text":"x"}`)}, true)
	model := keel.Span{ID: "span_model", RunID: id, ParentID: engine.StepSpanID(id, 1), Kind: keel.SpanModelCall, Name: "scripted", Step: 1, Start: time.Now()}
	if err := st.StartSpan(ctx, model); err != nil {
		t.Fatal(err)
	}
	model.Status = keel.SpanOK
	if err := st.FinishSpan(ctx, model); err != nil {
		t.Fatal(err)
	}
	if n, err := eng.Resume(ctx); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v; want 1", n, err)
	}
	if got := waitRun(t, eng, st, id); got.Status != keel.RunSucceeded {
		t.Fatalf("resumed run = %s (%s), want succeeded", got.Status, got.Error)
	}
	spans := spansOf(t, st, id)
	if got, want := traceTree(t, spans), "run/ok(step/ok(model.call/ok tool.call/ok) step/ok(model.call/ok))"; got != want {
		t.Errorf("trace = %s, want %s", got, want)
	}
	for _, sp := range spans {
		if sp.Kind == keel.SpanStep && sp.Step == 1 && !sp.Start.Equal(model.Start) {
			t.Errorf("step 1 starts at %v, want with its first span, %v", sp.Start, model.Start)
		}
	}
}
