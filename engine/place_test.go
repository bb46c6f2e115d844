package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
)

// fakePlacer is another environment that declares the tool "far": the
// steps that need it are handed to it, and each key becomes one run
// there, whose end Await reports once release is closed (nil: at once).
type fakePlacer struct {
	release  chan struct{}
	withheld bool
	// tokens and usd are what each run there spent: its outcome says so,
	// and one model call span of its own carries it too.
	tokens int64
	usd    float64

	mu       sync.Mutex
	asked    []keel.HandOff            // every HandOff, in order
	runs     map[keel.RunID]keel.RunID // key → the run there
	accepted chan keel.RunID
	cancels  [][2]keel.RunID // every Cancel's key and run, in order
	// hold, when set, keeps every HandOff waiting until it is closed or
	// its context ends (an offer under way), once it has said so on
	// holding.
	hold, holding chan struct{}
}

func newFakePlacer() *fakePlacer {
	return &fakePlacer{runs: map[keel.RunID]keel.RunID{}, accepted: make(chan keel.RunID, 8)}
}

func (p *fakePlacer) Place(ctx context.Context, need keel.StepNeed) (keel.Placement, error) {
	for _, t := range need.Tools {
		if t != "far" && t != "echo" {
			return keel.Placement{}, fmt.Errorf("no environment declares the tool %s", t)
		}
	}
	return keel.Placement{Env: "other", Kind: "edge", Reason: "it declares the tools far"}, nil
}

func (p *fakePlacer) HandOff(ctx context.Context, env string, h keel.HandOff) (keel.RunID, error) {
	p.mu.Lock()
	p.asked = append(p.asked, h)
	p.mu.Unlock()
	if p.hold != nil {
		p.holding <- struct{}{}
		select {
		case <-p.hold:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.runs[h.Key]
	if !ok {
		r = keel.RunID("there-" + string(h.Key))
		p.runs[h.Key] = r
		p.accepted <- r
	}
	return r, nil
}

func (p *fakePlacer) Await(ctx context.Context, env string, run keel.RunID, parentSpan string) (keel.StepOutcome, error) {
	if p.release != nil {
		select {
		case <-p.release:
		case <-ctx.Done():
			return keel.StepOutcome{}, ctx.Err()
		}
	}
	start := time.Now().Add(-time.Second)
	root := keel.Span{ID: "span_there_root", RunID: run, Kind: keel.SpanRun, Name: "run", Start: start, Duration: time.Second, Status: keel.SpanOK}
	if p.withheld {
		return keel.StepOutcome{Status: keel.RunSucceeded, Withheld: true, Spans: []keel.Span{root}, Tokens: p.tokens, CostUSD: p.usd}, nil
	}
	tool := keel.Span{ID: "span_there_tool", RunID: run, ParentID: root.ID, Kind: keel.SpanToolCall, Name: "far", Start: start, Duration: time.Millisecond, Status: keel.SpanOK}
	call := keel.Span{ID: "span_there_call", RunID: run, ParentID: root.ID, Kind: keel.SpanModelCall, Name: "m", Step: 1, Start: start,
		Duration: time.Millisecond, Status: keel.SpanOK, PromptTokens: int(p.tokens), CostUSD: p.usd}
	return keel.StepOutcome{Status: keel.RunSucceeded, Result: "found far away", Labels: []string{"work"}, Spans: []keel.Span{root, tool, call},
		Tokens: p.tokens, CostUSD: p.usd}, nil
}

func (p *fakePlacer) Cancel(ctx context.Context, env string, key, run keel.RunID) (keel.RunStatus, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cancels = append(p.cancels, [2]keel.RunID{key, run})
	return keel.RunCancelled, nil
}

func (p *fakePlacer) handOffs() []keel.HandOff {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.asked)
}

// TestDAGStepHandedOff: a DAG step that needs a tool this environment
// does not have is handed to the environment the Placer names; the
// parent journals the hand-off, its acceptance and its end there, then
// step.finished, and the next step reads its result. No local sub-agent
// is made for it. The run's spans cross back under the hand-off span,
// itself under the step's span.
func TestDAGStepHandedOff(t *testing.T) {
	t.Parallel()
	pl := newFakePlacer()
	m := &fakeModel{}
	h := newFlowHarness(t, m.provider(), engine.Config{Placer: pl})
	run := h.dag(t, keel.PlanStep{ID: "a", Goal: "look it up", Tools: []string{"far"}},
		keel.PlanStep{ID: "b", Goal: "use it", Tools: []string{"echo"}, DependsOn: []string{"a"}})
	if run.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", run.Status, run.Error)
	}
	evs := gapless(t, h.st, run.ID)
	var cross []keel.EventType
	for _, ev := range evs {
		if ev.Type == keel.EventStepHandedOff || ev.Type == keel.EventStepAccepted || ev.Type == keel.EventStepCompletedElsewhere {
			cross = append(cross, ev.Type)
		}
	}
	if want := []keel.EventType{keel.EventStepHandedOff, keel.EventStepAccepted, keel.EventStepCompletedElsewhere}; !slices.Equal(cross, want) {
		t.Errorf("cross-environment events %v, want %v", cross, want)
	}
	finished := stepEvents(t, evs, keel.EventStepFinished)
	if len(finished) != 2 || finished[0].StepID != "a" || finished[0].Result != "found far away" || finished[0].Status != keel.RunSucceeded {
		t.Errorf("step.finished = %+v, want a's result from the other environment first", finished)
	}
	if !slices.Contains(finished[0].Labels, "work") {
		t.Errorf("step a finished with labels %v, want those of what crossed (work)", finished[0].Labels)
	}
	if ls, err := h.eng.ContextLabels(context.Background(), run.ID); err != nil || !slices.Contains(ls, "work") {
		t.Errorf("the parent's context labels = %v, %v; want work, from the result that crossed", ls, err)
	}
	if m.calls("a") != 0 || m.calls("b") != 1 {
		t.Errorf("model calls: a %d, b %d; want 0 (it ran elsewhere) and 1", m.calls("a"), m.calls("b"))
	}
	if _, err := h.st.GetRun(context.Background(), childRunID(run.ID, "a", 1)); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("a local sub-agent of a exists: %v", err)
	}
	asked := pl.handOffs()
	if len(asked) != 1 || asked[0].Key != childRunID(run.ID, "a", 1) || !slices.Equal(asked[0].Tools, []string{"far"}) ||
		!strings.HasPrefix(asked[0].Goal, "look it up") {
		t.Fatalf("hand-offs %+v, want one of step a", asked)
	}
	tp := asked[0].TraceParent
	if traceID, spanID, err := keel.ParseTraceParent(tp); err != nil || traceID != keel.TraceID(run.ID) || spanID != keel.OTelSpanID(asked[0].ParentSpan) {
		t.Errorf("traceparent %q = %s %s %v; want the run's trace and the hand-off span %s", tp, traceID, spanID, err, asked[0].ParentSpan)
	}

	spans, err := h.st.Spans(context.Background(), run.ID)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]keel.Span{}
	for _, sp := range spans {
		byID[sp.ID] = sp
	}
	hand, ok := byID[asked[0].ParentSpan]
	if !ok || hand.Kind != keel.SpanHandOff || hand.Name != "other" || hand.Status != keel.SpanOK {
		t.Fatalf("hand-off span %+v (found %v); spans %+v", hand, ok, spans)
	}
	if step := byID[hand.ParentID]; step.Kind != keel.SpanStep || step.Name != "a" {
		t.Errorf("the hand-off span's parent is %+v, want step a's span", step)
	}
	root, tool := byID["span_there_root"], byID["span_there_tool"]
	if root.ParentID != hand.ID || root.RunID != run.ID || tool.ParentID != root.ID || tool.Status != keel.SpanOK {
		t.Errorf("spans from there: root %+v, tool %+v; want the root under the hand-off span, the tool under it", root, tool)
	}
}

// TestDAGHandOffWithheld: a step whose run elsewhere may not let its
// result cross succeeds here without it; its spans cross as a stub.
func TestDAGHandOffWithheld(t *testing.T) {
	t.Parallel()
	pl := newFakePlacer()
	pl.withheld = true
	m := &fakeModel{}
	h := newFlowHarness(t, m.provider(), engine.Config{Placer: pl})
	run := h.dag(t, keel.PlanStep{ID: "a", Goal: "read the diary", Tools: []string{"far"}})
	if run.Status != keel.RunSucceeded || strings.Contains(run.Result, "found") || !strings.Contains(run.Result, "may not leave") {
		t.Fatalf("run = %s %q %q, want succeeded without the result", run.Status, run.Result, run.Error)
	}
	for _, ev := range journal(t, h.st, run.ID) {
		if ev.Type == keel.EventStepCompletedElsewhere {
			var d keel.StepCompletedElsewhereData
			json.Unmarshal(ev.Data, &d)
			if !d.Withheld || d.Result != "" || d.Spans != 1 {
				t.Errorf("step.completed_elsewhere = %+v, want withheld, one stub span", d)
			}
		}
	}
}

// TestDAGStepNobodyCanRun: with a Placer, a plan naming a tool no
// environment declares is refused at its start, naming the tool; without
// one, a tool not here is refused as before.
func TestDAGStepNobodyCanRun(t *testing.T) {
	t.Parallel()
	for _, pl := range []engine.Placer{newFakePlacer(), nil} {
		h := newFlowHarness(t, (&fakeModel{}).provider(), engine.Config{Placer: pl})
		_, err := h.eng.Start(context.Background(), engine.StartRequest{Kind: keel.KindDAG, Goal: "g",
			Plan: &keel.Plan{Steps: []keel.PlanStep{{ID: "a", Goal: "x", Tools: []string{"nowhere"}}}}})
		if !errors.Is(err, keel.ErrInvalid) || !strings.Contains(err.Error(), "nowhere") {
			t.Errorf("placer %v: Start = %v, want invalid naming the tool", pl != nil, err)
		}
	}
}

// TestDAGHandOffResumes: the parent's engine closes while the step runs
// elsewhere (accepted there); the next engine resumes the parent, which
// waits for the same run there instead of handing the step off again,
// and the plan finishes: the step ran once.
func TestDAGHandOffResumes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := openDB(ctx, filepath.Join(t.TempDir(), "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pl := newFakePlacer()
	pl.release = make(chan struct{})
	m := &fakeModel{}
	eng1, err := engine.New(engine.Config{Store: st, Model: m.provider(), Tools: newFlowTools(), Placer: pl})
	if err != nil {
		t.Fatal(err)
	}
	r, err := eng1.Start(ctx, engine.StartRequest{Kind: keel.KindDAG, Goal: "survive a restart", Plan: &keel.Plan{Steps: []keel.PlanStep{
		{ID: "far", Goal: "far away", Tools: []string{"far"}}, {ID: "last", Goal: "sum up", DependsOn: []string{"far"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-pl.accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("the step was never handed off")
	}
	waitUntil(t, eng1, func() bool {
		return slices.Contains(types(journal(t, st, r.ID)), keel.EventStepAccepted)
	})
	if err := eng1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := st.GetRun(ctx, r.ID); got.Status != keel.RunInterrupted {
		t.Fatalf("after Close the parent is %s, want interrupted", got.Status)
	}

	eng2, err := engine.New(engine.Config{Store: st, Model: m.provider(), Tools: newFlowTools(), Placer: pl})
	if err != nil {
		t.Fatal(err)
	}
	defer eng2.Close(ctx)
	if _, err := eng2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := eng2.Resume(ctx); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v; want the parent", n, err)
	}
	close(pl.release)
	got := waitRun(t, eng2, st, r.ID)
	if got.Status != keel.RunSucceeded {
		t.Fatalf("resumed run = %s %q", got.Status, got.Error)
	}
	if asked := pl.handOffs(); len(asked) != 1 {
		t.Errorf("the step was handed off %d times, want once (the resumed parent waits for the run there)", len(asked))
	}
	evs := gapless(t, st, r.ID)
	count := map[keel.EventType]int{}
	for _, ev := range evs {
		count[ev.Type]++
	}
	if count[keel.EventStepHandedOff] != 1 || count[keel.EventStepAccepted] != 1 || count[keel.EventStepCompletedElsewhere] != 1 || count[keel.EventStepFinished] != 2 {
		t.Errorf("journal %v: want one hand-off, acceptance and completion, two steps finished", types(evs))
	}
}

// TestDAGCancelEndsHandOff: cancelling a parent whose step runs
// elsewhere ends the step here at once (step.finished, cancelled), and
// the parent is cancelled; the waiter stops.
func TestDAGCancelEndsHandOff(t *testing.T) {
	t.Parallel()
	pl := newFakePlacer()
	pl.release = make(chan struct{}) // never released
	h := newFlowHarness(t, (&fakeModel{}).provider(), engine.Config{Placer: pl})
	r := h.start(t, engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{{ID: "far", Goal: "far away", Tools: []string{"far"}}}}})
	waitUntil(t, h.eng, func() bool { return slices.Contains(types(journal(t, h.st, r.ID)), keel.EventStepAccepted) })
	if _, err := h.eng.Cancel(context.Background(), r.ID); err != nil {
		t.Fatal(err)
	}
	got := waitRun(t, h.eng, h.st, r.ID)
	if got.Status != keel.RunCancelled {
		t.Fatalf("parent = %s, want cancelled", got.Status)
	}
	evs := journal(t, h.st, r.ID)
	finished := stepEvents(t, evs, keel.EventStepFinished)
	if len(finished) != 1 || finished[0].Status != keel.RunCancelled || !strings.Contains(finished[0].Error, "other") {
		t.Errorf("step.finished = %+v, want far cancelled here, naming where it runs", finished)
	}
	// The run there was asked to stop, and the parent's journal says so,
	// before the step's end.
	there := keel.RunID("there-" + string(childRunID(r.ID, "far", 1)))
	pl.mu.Lock()
	cancels := slices.Clone(pl.cancels)
	pl.mu.Unlock()
	if !slices.Equal(cancels, [][2]keel.RunID{{childRunID(r.ID, "far", 1), there}}) {
		t.Errorf("cancels sent %v, want one, of %s", cancels, there)
	}
	var c []keel.StepCancelledElsewhereData
	for _, ev := range evs {
		switch ev.Type {
		case keel.EventStepCancelledElsewhere:
			var d keel.StepCancelledElsewhereData
			json.Unmarshal(ev.Data, &d)
			c = append(c, d)
		case keel.EventStepFinished:
			if len(c) == 0 {
				t.Errorf("step.finished before step.cancelled_elsewhere: %v", types(evs))
			}
		}
	}
	if len(c) != 1 || c[0].RemoteRun != there || c[0].Env != "other" || c[0].Status != keel.RunCancelled || c[0].Error != "" {
		t.Errorf("step.cancelled_elsewhere = %+v, want one, of %s on other, cancelled", c, there)
	}
}

// TestDAGCancelBeforeAccepted: a parent cancelled while its step's
// offer is under way (no answer yet) asks the environment to cancel the
// step by its key, with no run to name, and journals the answer; the
// step ends here, cancelled.
func TestDAGCancelBeforeAccepted(t *testing.T) {
	t.Parallel()
	pl := newFakePlacer()
	pl.hold, pl.holding = make(chan struct{}), make(chan struct{}, 8) // never answered
	h := newFlowHarness(t, (&fakeModel{}).provider(), engine.Config{Placer: pl})
	r := h.start(t, engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{{ID: "far", Goal: "far away", Tools: []string{"far"}}}}})
	select {
	case <-pl.holding:
	case <-time.After(30 * time.Second):
		t.Fatal("the step was not offered within 30 s")
	}
	if _, err := h.eng.Cancel(context.Background(), r.ID); err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, h.eng, h.st, r.ID); got.Status != keel.RunCancelled {
		t.Fatalf("parent = %s, want cancelled", got.Status)
	}
	key := childRunID(r.ID, "far", 1)
	pl.mu.Lock()
	cancels := slices.Clone(pl.cancels)
	pl.mu.Unlock()
	if !slices.Equal(cancels, [][2]keel.RunID{{key, ""}}) {
		t.Errorf("cancels sent %v, want one, of step %s with no run", cancels, key)
	}
	evs := journal(t, h.st, r.ID)
	var c []keel.StepCancelledElsewhereData
	for _, ev := range evs {
		if ev.Type == keel.EventStepCancelledElsewhere {
			var d keel.StepCancelledElsewhereData
			json.Unmarshal(ev.Data, &d)
			c = append(c, d)
		}
	}
	if len(c) != 1 || c[0].Run != key || c[0].RemoteRun != "" || c[0].Status != keel.RunCancelled {
		t.Errorf("step.cancelled_elsewhere = %+v, want one, of step %s, no run there, cancelled; journal %v", c, key, types(evs))
	}
	if f := stepEvents(t, evs, keel.EventStepFinished); len(f) != 1 || f[0].Status != keel.RunCancelled {
		t.Errorf("step.finished = %+v, want far cancelled", f)
	}
}

// TestDAGHandOffSpendsBudget: what a step's run elsewhere spent counts in
// the parent's budget, once (its outcome, not again from its model call
// span that crossed back), withheld or not: the next step is given what
// is left.
func TestDAGHandOffSpendsBudget(t *testing.T) {
	t.Parallel()
	for _, withheld := range []bool{false, true} {
		t.Run(fmt.Sprintf("withheld=%v", withheld), func(t *testing.T) {
			t.Parallel()
			handOffSpendsBudget(t, withheld)
		})
	}
}

func handOffSpendsBudget(t *testing.T, withheld bool) {
	pl := newFakePlacer()
	pl.tokens, pl.usd, pl.withheld = 600, 0.25, withheld
	h := newFlowHarness(t, (&fakeModel{}).provider(), engine.Config{Placer: pl})
	r := h.start(t, engine.StartRequest{Kind: keel.KindDAG, Policy: keel.RunPolicy{BudgetTokens: 1000, BudgetUSD: 1},
		Plan: &keel.Plan{Steps: []keel.PlanStep{{ID: "a", Goal: "far away", Tools: []string{"far"}},
			{ID: "b", Goal: "sum up", Tools: []string{"echo"}, DependsOn: []string{"a"}}}}})
	got := waitRun(t, h.eng, h.st, r.ID)
	if got.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", got.Status, got.Error)
	}
	for _, ev := range journal(t, h.st, r.ID) {
		if ev.Type == keel.EventStepCompletedElsewhere {
			var d keel.StepCompletedElsewhereData
			json.Unmarshal(ev.Data, &d)
			if d.Tokens != 600 || d.CostUSD != 0.25 {
				t.Errorf("step.completed_elsewhere spent %d tokens, $%g; want 600, $0.25", d.Tokens, d.CostUSD)
			}
		}
	}
	b, err := h.st.GetRun(context.Background(), childRunID(r.ID, "b", 1))
	if err != nil {
		t.Fatal(err)
	}
	if b.Policy.BudgetTokens != 400 || b.Policy.BudgetUSD != 0.75 {
		t.Errorf("step b was given %d tokens, $%g; want what a left: 400, $0.75", b.Policy.BudgetTokens, b.Policy.BudgetUSD)
	}
}
