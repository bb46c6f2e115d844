package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/internal/dbtest"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoTools is a hand-written tool runner: "echo" returns its input
// wrapped, "slow" waits for cancellation. Input must be an object with a
// string "text", like a schema check would demand.
type echoTools struct {
	mu     sync.Mutex
	calls  int
	writes int // executions of "write", which is not idempotent
	// slowEntered, when not nil, is sent to (if it has room) each time
	// "slow" is entered.
	slowEntered chan struct{}
}

func (t *echoTools) Specs(context.Context) []keel.ToolSpec {
	return []keel.ToolSpec{
		{Name: "echo", Description: "echo text", InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`), SideEffects: keel.SideEffectReadOnly},
		{Name: "slow", Description: "waits", InputSchema: json.RawMessage(`{"type":"object"}`), SideEffects: keel.SideEffectReadOnly},
		{Name: "write", Description: "appends", InputSchema: json.RawMessage(`{"type":"object"}`), SideEffects: keel.SideEffectNonIdempotentWrite},
	}
}

func (t *echoTools) Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	name, input := inv.Name, inv.Args
	t.mu.Lock()
	t.calls++
	t.mu.Unlock()
	if inv.Run == "" || inv.Step < 1 || inv.CallID == "" {
		return nil, fmt.Errorf("tool called without saying who calls: %+v", inv)
	}
	switch name {
	case "echo":
		var in struct {
			Text *string `json:"text"`
		}
		if json.Unmarshal(input, &in) != nil || in.Text == nil {
			return nil, &keel.ToolError{Code: keel.ToolInvalidInput, Message: "text is required", Path: "/text"}
		}
		return json.Marshal(map[string]string{"echoed": *in.Text})
	case "slow":
		select {
		case t.slowEntered <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return nil, ctx.Err()
	case "write":
		t.mu.Lock()
		t.writes++
		t.mu.Unlock()
		if strings.Contains(string(input), `"crash"`) {
			return nil, &keel.ToolError{Code: keel.ToolCrashed, Message: "crashed after writing"}
		}
		return json.RawMessage(`{"written":` + string(input) + `}`), nil
	}
	return nil, &keel.ToolError{Code: keel.ToolNotFound, Message: "no tool " + name}
}

type harness struct {
	eng   *engine.Engine
	st    *store.Store
	model *scripted.Provider
	tools *echoTools

	mu     sync.Mutex
	events map[keel.RunID][]keel.Event
}

func newHarness(t *testing.T, p *scripted.Provider) *harness {
	t.Helper()
	h := newHarnessWith(t, p)
	h.model = p
	return h
}

// openDB opens a store on path at synchronous=NORMAL. The engine's tests
// check what is journaled, and in what order, not what survives a power
// cut: the store's own tests do that, and cmd/keel's crash tests kill the
// real daemon, which runs at FULL. At FULL each commit waits for an fsync
// (about 7 ms on the 2-core CI machine), which made up some 10 s of this
// package's 18 s. A new database is copied from a migrated one
// (dbtest.Seed): migrating each cost ~0.3 s of CPU under -race.
func openDB(ctx context.Context, path string) (*store.Store, error) {
	if err := dbtest.Seed(path); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	return store.OpenWith(ctx, path, store.Options{Synchronous: "NORMAL"})
}

// openStore opens a store on a new database file, closed when the test
// ends.
func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := openDB(context.Background(), filepath.Join(t.TempDir(), "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// newEngine opens an engine with cfg over a store on a new database file
// (cfg.Store is set to it); both are closed when the test ends.
func newEngine(t *testing.T, cfg engine.Config) (*store.Store, *engine.Engine) {
	t.Helper()
	st := openStore(t)
	cfg.Store = st
	eng, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(context.Background()) })
	return st, eng
}

// newHarnessWith runs the engine over any model layer, such as a Router.
func newHarnessWith(t *testing.T, p engine.Model) *harness {
	t.Helper()
	st, err := openDB(context.Background(), filepath.Join(t.TempDir(), "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{st: st, tools: &echoTools{}, events: map[keel.RunID][]keel.Event{}}
	h.eng, err = engine.New(engine.Config{Store: st, Model: p, Tools: h.tools, DefaultMaxSteps: 4})
	if err != nil {
		t.Fatal(err)
	}
	unsub := h.eng.Subscribe(func(ev keel.Event) {
		h.mu.Lock()
		h.events[ev.RunID] = append(h.events[ev.RunID], ev)
		h.mu.Unlock()
	})
	t.Cleanup(func() {
		unsub()
		if err := h.eng.Close(context.Background()); err != nil {
			t.Error(err)
		}
		st.Close()
	})
	return h
}

func (h *harness) runToEnd(t *testing.T, goal string) keel.Run {
	t.Helper()
	return h.runWith(t, engine.StartRequest{Goal: goal})
}

func (h *harness) runWith(t *testing.T, req engine.StartRequest) keel.Run {
	t.Helper()
	ctx := context.Background()
	goal := req.Goal
	r, err := h.eng.Start(ctx, req)
	if err != nil {
		t.Fatalf("Start(%q) = %v", goal, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := h.eng.Wait(wctx, r.ID); err != nil {
		t.Fatalf("run %s did not end: %v", r.ID, err)
	}
	r, err = h.st.GetRun(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func types(evs []keel.Event) []keel.EventType {
	var out []keel.EventType
	for _, ev := range evs {
		out = append(out, ev.Type)
	}
	return out
}

func journal(t *testing.T, st *store.Store, id keel.RunID) []keel.Event {
	t.Helper()
	evs, err := st.Events(context.Background(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func eqTypes(a, b []keel.EventType) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

func TestToolThenAnswer(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil, scripted.CallTool("echo", `{"text":"hello wasm"}`), scripted.Answer("the tool said hello wasm"))
	h := newHarness(t, p)
	r := h.runToEnd(t, "say hello")
	if r.Status != keel.RunSucceeded || r.Result != "the tool said hello wasm" {
		t.Fatalf("run = %s %q (%s), want succeeded with the answer", r.Status, r.Result, r.Error)
	}
	evs := journal(t, h.st, r.ID)
	want := []keel.EventType{keel.EventRunStarted, keel.EventModelResult, keel.EventToolCall, keel.EventToolResult, keel.EventModelResult, keel.EventRunSucceeded}
	if !eqTypes(types(evs), want) {
		t.Fatalf("journal = %v, want %v", types(evs), want)
	}
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			t.Errorf("event %d has seq %d", i, ev.Seq)
		}
	}
	// The tool's output reached the model in the second request.
	reqs := p.Requests()
	if len(reqs) != 2 {
		t.Fatalf("model got %d requests, want 2", len(reqs))
	}
	last := reqs[1].Messages[len(reqs[1].Messages)-1]
	if last.Role != models.RoleTool || last.Content != `{"echoed":"hello wasm"}` || last.ToolName != "echo" {
		t.Errorf("last message of 2nd request = %+v, want the echo tool's output", last)
	}
	if len(reqs[0].Tools) != 3 {
		t.Errorf("first request offered %d tools, want 3", len(reqs[0].Tools))
	}
	// Every live subscriber saw the journaled events in order, plus deltas.
	h.mu.Lock()
	var live []keel.Event
	for _, ev := range h.events[r.ID] {
		if ev.Seq > 0 {
			live = append(live, ev)
		}
	}
	h.mu.Unlock()
	if !eqTypes(types(live), want) {
		t.Errorf("published = %v, want %v", types(live), want)
	}
	spans, err := h.st.Spans(context.Background(), r.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range spans {
		if s.Kind == keel.SpanModelCall && s.PromptTokens == 0 {
			t.Errorf("model span %s has no prompt tokens", s.ID)
		}
	}
	if got, want := traceTree(t, spans), "run/ok(step/ok(model.call/ok tool.call/ok) step/ok(model.call/ok))"; got != want {
		t.Errorf("trace = %s, want %s", got, want)
	}
}

func TestToolErrorGoesBackToModel(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil, scripted.CallTool("echo", `{"wrong":1}`), scripted.Answer("sorry"))
	h := newHarness(t, p)
	r := h.runToEnd(t, "bad args")
	if r.Status != keel.RunSucceeded {
		t.Fatalf("status = %s (%s), want succeeded: a tool error is the model's to handle", r.Status, r.Error)
	}
	evs := journal(t, h.st, r.ID)
	var res keel.ToolResultData
	if err := json.Unmarshal(evs[3].Data, &res); err != nil {
		t.Fatal(err)
	}
	if res.Error == nil || res.Error.Code != keel.ToolInvalidInput || res.Error.Path != "/text" {
		t.Errorf("tool.result = %+v, want invalid_input at /text", res)
	}
	last := p.Requests()[1].Messages
	if got := last[len(last)-1].Content; !strings.Contains(got, "invalid_input") {
		t.Errorf("model saw %q, want the classified error", got)
	}
}

func TestEndings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		steps  []scripted.Step
		status keel.RunStatus
		reason string
	}{
		{"step limit", []scripted.Step{scripted.Repeat(scripted.CallTool("echo", `{"text":"again"}`))}, keel.RunFailed, "step limit reached: 4"},
		{"model error", []scripted.Step{scripted.Fail(fmt.Errorf("boom: %w", models.ErrUnavailable))}, keel.RunFailed, "boom"},
		{"direct answer", []scripted.Step{scripted.Answer("42")}, keel.RunSucceeded, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, scripted.New(nil, tt.steps...))
			r := h.runToEnd(t, "goal")
			if r.Status != tt.status || !strings.Contains(r.Error, tt.reason) {
				t.Errorf("run = %s %q, want %s containing %q", r.Status, r.Error, tt.status, tt.reason)
			}
			evs := journal(t, h.st, r.ID)
			if last := evs[len(evs)-1]; !keel.RunStatus(strings.TrimPrefix(string(last.Type), "run.")).Terminal() {
				t.Errorf("last event %s is not terminal", last.Type)
			}
		})
	}
}

func TestStartValidation(t *testing.T) {
	t.Parallel()
	h := newHarness(t, scripted.New(nil))
	ctx := context.Background()
	if _, err := h.eng.Start(ctx, engine.StartRequest{Goal: "  "}); !errors.Is(err, keel.ErrInvalid) {
		t.Errorf("Start(empty goal) = %v, want ErrInvalid", err)
	}
	if _, err := h.eng.Start(ctx, engine.StartRequest{Goal: "x", MaxSteps: -1}); !errors.Is(err, keel.ErrInvalid) {
		t.Errorf("Start(max_steps -1) = %v, want ErrInvalid", err)
	}
	if _, err := h.eng.Start(ctx, engine.StartRequest{Goal: "x", Model: "nope"}); !errors.Is(err, keel.ErrModelUnavailable) {
		t.Errorf("Start(unknown model) = %v, want ErrModelUnavailable", err)
	}
	if _, err := h.eng.Cancel(ctx, "run_missing"); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("Cancel(unknown) = %v, want ErrNotFound", err)
	}
}

func TestCancelStopsModelAndTool(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		steps []scripted.Step
	}{
		{"while the model streams", []scripted.Step{scripted.Block()}},
		{"while a tool runs", []scripted.Step{scripted.CallTool("slow", `{}`)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, scripted.New(nil, tt.steps...))
			h.tools.slowEntered = make(chan struct{}, 1)
			ctx := context.Background()
			r, err := h.eng.Start(ctx, engine.StartRequest{Goal: "wait"})
			if err != nil {
				t.Fatal(err)
			}
			// Wait until the run is blocked in the model or the tool.
			if tt.name == "while a tool runs" {
				waitSlow(t, h.tools)
			} else {
				waitRequests(t, h.model, 1)
			}
			if _, err := h.eng.Cancel(ctx, r.ID); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := h.eng.Wait(wctx, r.ID); err != nil {
				t.Fatal("cancel did not stop the run promptly")
			}
			got, _ := h.st.GetRun(ctx, r.ID)
			if got.Status != keel.RunCancelled {
				t.Errorf("status = %s, want cancelled", got.Status)
			}
			if _, err := h.eng.Cancel(ctx, r.ID); !errors.Is(err, keel.ErrConflict) {
				t.Errorf("second Cancel = %v, want ErrConflict", err)
			}
		})
	}
}

func TestShutdownInterruptsAndRecoverMarksLeftovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := openDB(ctx, filepath.Join(dir, "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p := scripted.New(nil, scripted.Block())
	eng, err := engine.New(engine.Config{Store: st, Model: p, Tools: &echoTools{}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := eng.Start(ctx, engine.StartRequest{Goal: "long"})
	if err != nil {
		t.Fatal(err)
	}
	waitRequests(t, p, 1)
	if err := eng.Close(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := st.GetRun(ctx, r.ID)
	if got.Status != keel.RunInterrupted {
		t.Errorf("after Close status = %s, want interrupted", got.Status)
	}
	if _, err := eng.Start(ctx, engine.StartRequest{Goal: "late"}); !errors.Is(err, keel.ErrUnavailable) {
		t.Errorf("Start after Close = %v, want ErrUnavailable", err)
	}

	// A crash leaves a run "running" in the store; Recover marks it.
	now := time.Now()
	crashed := keel.Run{ID: "run_crashed", Goal: "g", Model: "scripted", Status: keel.RunQueued, MaxSteps: 2, CreatedAt: now, UpdatedAt: now}
	if err := st.CreateRun(ctx, crashed); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Append(ctx, crashed.ID, keel.EventRunStarted, now, json.RawMessage(`{}`), &keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		t.Fatal(err)
	}
	// It was killed during a model call: the call's span is open.
	if err := st.StartSpan(ctx, keel.Span{ID: "span_cut", RunID: crashed.ID, Kind: keel.SpanModelCall, Name: "scripted", Step: 1, Start: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	eng2, _ := engine.New(engine.Config{Store: st, Model: p, Tools: &echoTools{}})
	defer eng2.Close(ctx)
	n, err := eng2.Recover(ctx)
	if err != nil || n != 1 {
		t.Fatalf("Recover = %d, %v; want 1 run", n, err)
	}
	evs := journal(t, st, crashed.ID)
	if len(evs) != 2 || evs[1].Type != keel.EventRunInterrupted || evs[1].Seq != 2 {
		t.Errorf("journal after Recover = %v", types(evs))
	}
	// The span the crash cut off is closed, as failed, with the interruption.
	if spans, err := st.Spans(ctx, crashed.ID); err != nil || len(spans) != 1 || spans[0].Status != keel.SpanError || !strings.Contains(spans[0].Error, "daemon stopped") {
		t.Errorf("spans after Recover = %+v, %v; want the cut-off model call closed as failed", spans, err)
	}
	// An interrupted run can be cancelled for good.
	if c, err := eng2.Cancel(ctx, crashed.ID); err != nil || c.Status != keel.RunCancelled {
		t.Errorf("Cancel(interrupted) = %s, %v; want cancelled", c.Status, err)
	}
}

func TestManyConcurrentRuns(t *testing.T) {
	t.Parallel()
	p := scripted.ByGoal(nil, func(goal string) []scripted.Step {
		return []scripted.Step{scripted.CallTool("echo", fmt.Sprintf(`{"text":%q}`, goal)), scripted.Answer("done " + goal)}
	})
	h := newHarness(t, p)
	const n = 50
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			goal := fmt.Sprint("goal-", i)
			r := h.runToEnd(t, goal)
			if r.Status != keel.RunSucceeded || r.Result != "done "+goal {
				t.Errorf("run %s = %s %q", goal, r.Status, r.Result)
			}
			evs := journal(t, h.st, r.ID)
			var res keel.ToolResultData
			json.Unmarshal(evs[3].Data, &res)
			if string(res.Output) != fmt.Sprintf(`{"echoed":%q}`, goal) {
				t.Errorf("run %s tool output %s: runs crossed", goal, res.Output)
			}
		}()
	}
	wg.Wait()
}

// waitRequests waits until model p has received n requests.
func waitRequests(t *testing.T, p *scripted.Provider, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.WaitRequests(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// waitSlow waits until tools' "slow" has been entered; tools.slowEntered
// must have been made before the call.
func waitSlow(t *testing.T, tools *echoTools) {
	t.Helper()
	select {
	case <-tools.slowEntered:
	case <-time.After(30 * time.Second):
		t.Fatal("the slow tool was not called within 30s")
	}
}

// waitUntil waits until cond holds, checking it now and again after
// each event eng publishes: cond must turn true with (or before) a
// journal write of one of eng's runs.
func waitUntil(t *testing.T, eng *engine.Engine, cond func() bool) {
	t.Helper()
	changed := make(chan struct{}, 1)
	defer eng.Subscribe(func(keel.Event) {
		select {
		case changed <- struct{}{}:
		default:
		}
	})()
	timeout := time.After(30 * time.Second)
	for !cond() {
		select {
		case <-changed:
		case <-timeout:
			t.Fatal("condition not reached in 30s")
		}
	}
}

// TestRunPolicyThroughRouter: a run's policy reaches the model layer.
// Cloud only when the run allows it, never for a private run, the run's
// budget enforced, and the serving provider and cost on the span.
func TestRunPolicyThroughRouter(t *testing.T) {
	t.Parallel()
	local := scripted.New(nil, scripted.Repeat(scripted.Answer("local answer")))
	cloud := scripted.New(nil, scripted.Repeat(scripted.Answer("cloud answer")))
	r, err := models.NewRouter(models.RouterConfig{
		Providers: map[string]models.ProviderConfig{
			"local": {Provider: local},
			"cloud": {Provider: cloud, Cloud: true, Prices: map[string]models.Price{scripted.DefaultModel.Name: {InputPerMTok: 1000, OutputPerMTok: 1000}}},
		},
		Routes: []models.Route{{Name: "default",
			Targets:  []models.Target{{Provider: "cloud", Model: scripted.DefaultModel.Name}},
			Fallback: []models.Target{{Provider: "local", Model: scripted.DefaultModel.Name}}}},
		AllowCloud: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, r)

	run := h.runWith(t, engine.StartRequest{Goal: "g1", Model: "default", Policy: keel.RunPolicy{AllowCloud: true}})
	spans := modelSpans(t, h.st, run.ID)
	if run.Result != "cloud answer" || len(spans) != 1 || spans[0].Provider != "cloud" || spans[0].CostUSD <= 0 {
		t.Errorf("cloud-allowed run: result %q, spans %+v; want the cloud's answer with its cost on the span", run.Result, spans)
	}
	sent := len(cloud.Requests())

	run = h.runWith(t, engine.StartRequest{Goal: "g2", Model: "default", Policy: keel.RunPolicy{AllowCloud: true, Private: true}})
	spans = modelSpans(t, h.st, run.ID)
	if run.Result != "local answer" || len(spans) != 1 || spans[0].Provider != "local" || !strings.Contains(string(spans[0].Attrs), "policy_denied") {
		t.Errorf("private run: result %q, spans %+v; want the local answer, the refused cloud attempt in the span", run.Result, spans)
	}
	run = h.runWith(t, engine.StartRequest{Goal: "g3", Model: "default"})
	if run.Result != "local answer" {
		t.Errorf("run without allow_cloud: result %q, want the local answer", run.Result)
	}
	if n := len(cloud.Requests()); n != sent {
		t.Errorf("the cloud received %d more requests from runs that did not allow it", n-sent)
	}

	run = h.runWith(t, engine.StartRequest{Goal: "g4", Model: "local/" + scripted.DefaultModel.Name, Policy: keel.RunPolicy{BudgetTokens: 5}})
	if run.Status != keel.RunFailed || !strings.Contains(run.Error, "budget") {
		t.Errorf("run over its budget: %s %q, want failed naming the budget", run.Status, run.Error)
	}
}

// onDisk is a tool runner that, when a call arrives, notes which events
// of the calling run are already committed.
type onDisk struct {
	echoTools
	st *store.Store

	mu   sync.Mutex
	seen [][]keel.EventType // at each call: the journal's types
}

func (o *onDisk) Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	evs, err := o.st.Events(ctx, inv.Run, 0)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	o.seen = append(o.seen, types(evs))
	o.mu.Unlock()
	return o.echoTools.Call(ctx, inv)
}

// TestResultsAreOnDiskBeforeUse: the engine holds a model result to
// commit it with the next event, but never lets it out before it is
// committed. A tool that must not run twice starts only once the model
// result that asked for it and the call's intent are on disk. A
// read-only tool may run first: the step (model result, intent, tool
// result) is then one commit, which a crash loses whole. Either way,
// when the model is asked again, all of the step is on disk.
func TestResultsAreOnDiskBeforeUse(t *testing.T) {
	t.Parallel()
	all := []keel.EventType{keel.EventRunStarted, keel.EventModelResult, keel.EventToolCall, keel.EventToolResult}
	for _, tc := range []struct {
		tool          string
		whenToolStart []keel.EventType
	}{
		{"write", all[:3]}, // not idempotent
		{"echo", all[:1]},  // read-only
	} {
		t.Run(tc.tool, func(t *testing.T) {
			ctx := context.Background()
			st := openStore(t)
			tools := &onDisk{st: st}
			var atSecond []keel.EventType
			p := scripted.New(nil,
				scripted.CallTool(tc.tool, `{"text":"once"}`),
				scripted.Answer("done"))
			eng, err := engine.New(engine.Config{Store: st, Model: &peek{Model: p, st: st, seen: &atSecond}, Tools: tools, DefaultMaxSteps: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer eng.Close(ctx)
			r, err := eng.Start(ctx, engine.StartRequest{Goal: "call once"})
			if err != nil {
				t.Fatal(err)
			}
			waitRun(t, eng, st, r.ID)
			if got := journal(t, st, r.ID); got[len(got)-1].Type != keel.EventRunSucceeded {
				t.Fatalf("journal = %v, want a succeeded run", types(got))
			}
			if len(tools.seen) != 1 || !eqTypes(tools.seen[0], tc.whenToolStart) {
				t.Errorf("when the tool ran, the journal on disk was %v, want %v", tools.seen, tc.whenToolStart)
			}
			if !eqTypes(atSecond, all) {
				t.Errorf("when the model was asked again, the journal on disk was %v, want %v", atSecond, all)
			}
		})
	}
}

// peek is a model that, at its second call, notes the calling run's
// committed journal.
type peek struct {
	engine.Model
	st    *store.Store
	calls int
	seen  *[]keel.EventType
}

func (p *peek) Chat(ctx context.Context, req models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
	p.calls++
	if p.calls == 2 {
		runs, err := p.st.ListRuns(ctx, 1)
		if err != nil || len(runs) != 1 {
			return models.ChatResponse{}, fmt.Errorf("list runs: %v", err)
		}
		evs, err := p.st.Events(ctx, runs[0].ID, 0)
		if err != nil {
			return models.ChatResponse{}, err
		}
		*p.seen = types(evs)
	}
	return p.Model.Chat(ctx, req, onDelta)
}

// TestReadOnlyStepIsOneCommit: a step that calls a read-only tool costs
// one commit (an fsync), one that calls a tool that must not run twice
// two: its intent is on disk before the tool starts.
func TestReadOnlyStepIsOneCommit(t *testing.T) {
	t.Parallel()
	const steps = 6
	for _, tc := range []struct {
		tool    string
		perStep int64
	}{{"echo", 1}, {"write", 2}} {
		t.Run(tc.tool, func(t *testing.T) {
			ctx := context.Background()
			st := openStore(t)
			script := make([]scripted.Step, 0, steps+1)
			for range steps {
				script = append(script, scripted.CallTool(tc.tool, `{"text":"x"}`))
			}
			eng, err := engine.New(engine.Config{Store: st, Model: scripted.New(nil, append(script, scripted.Answer("done"))...), Tools: &echoTools{}, DefaultMaxSteps: steps + 1})
			if err != nil {
				t.Fatal(err)
			}
			defer eng.Close(ctx)
			before := st.Commits()
			r, err := eng.Start(ctx, engine.StartRequest{Goal: "count commits"})
			if err != nil {
				t.Fatal(err)
			}
			waitRun(t, eng, st, r.ID)
			// The run's creation and start, a commit per step, the answer
			// with the run's end; a lazy span flush may add one or two.
			got := st.Commits() - before
			if lo, hi := steps*tc.perStep+2, steps*tc.perStep+5; got < lo || got > hi {
				t.Errorf("%d steps calling %s took %d commits, want %d to %d", steps, tc.tool, got, lo, hi)
			}
		})
	}
}

// loadingTools are echoTools whose Specs wait until loaded is closed, as
// the daemon's do while tools compile.
type loadingTools struct {
	echoTools
	loaded chan struct{}
}

func (t *loadingTools) Loading() bool {
	select {
	case <-t.loaded:
		return false
	default:
		return true
	}
}

func (t *loadingTools) Specs(context.Context) []keel.ToolSpec {
	<-t.loaded
	return t.echoTools.Specs(context.Background())
}

// TestStartJournalsTheStartWithTheCreation: when the tools are known
// without waiting, Start stores the run with its run.started, listing
// them, in one commit, and returns it running; while they load, Start
// does not wait for them: the run is returned queued and its loop
// journals run.started once they are there.
func TestStartJournalsTheStartWithTheCreation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := &writeCounter{Store: openStore(t)}
	tools := &loadingTools{loaded: make(chan struct{})}
	// The second run's model waits until its Start's commits are counted:
	// its loop's own journal writes must not be counted with them. (Its
	// trace spans commit on a timer, whenever it fires: writeCounter
	// counts only the commits a journal write makes.)
	counted := make(chan struct{})
	model := scripted.New(nil, scripted.Repeat(scripted.ReplyFunc(func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
		if scripted.Goal(req) == "loaded" {
			<-counted
		}
		return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
	})))
	eng, err := engine.New(engine.Config{Store: st, Model: model, Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)

	started := make(chan keel.Run, 1)
	go func() {
		r, err := eng.Start(ctx, engine.StartRequest{Goal: "while loading"})
		if err != nil {
			t.Error(err)
		}
		started <- r
	}()
	var loading keel.Run
	select {
	case loading = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("Start waited for the tools to load")
	}
	if loading.Status != keel.RunQueued || loading.LastSeq != 0 {
		t.Errorf("run started while tools load: status %s, last seq %d; want queued, 0", loading.Status, loading.LastSeq)
	}
	close(tools.loaded)
	if r := waitRun(t, eng, st.Store, loading.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run started while tools load ended %s (%s)", r.Status, r.Error)
	}

	// The first run's trace commits just after its end: settle it first.
	if err := st.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := eng.Start(ctx, engine.StartRequest{Goal: "loaded"})
	if err != nil {
		t.Fatal(err)
	}
	if got := st.journalCommits(r.ID); got != 1 {
		t.Errorf("Start took %d commits, want 1", got)
	}
	close(counted)
	if r.Status != keel.RunRunning || r.LastSeq != 1 {
		t.Errorf("run started with tools loaded: status %s, last seq %d; want running, 1", r.Status, r.LastSeq)
	}
	waitRun(t, eng, st.Store, r.ID)
	for _, id := range []keel.RunID{loading.ID, r.ID} {
		evs, err := st.Events(ctx, id, 0)
		if err != nil {
			t.Fatal(err)
		}
		var data keel.RunStartedData
		if evs[0].Type != keel.EventRunStarted || json.Unmarshal(evs[0].Data, &data) != nil || strings.Join(data.Tools, ",") != "echo,slow,write" {
			t.Errorf("run %s starts with %s %s, want run.started listing echo, slow and write", id, evs[0].Type, evs[0].Data)
		}
		if n := slices.IndexFunc(evs[1:], func(ev keel.Event) bool { return ev.Type == keel.EventRunStarted }); n >= 0 {
			t.Errorf("run %s journals run.started twice", id)
		}
	}
}

// writeCounter is the real store, counting per run the commits that
// the writes of its journal (CreateRun, CreateRunWith, Append,
// AppendAll) make: the store's commit count across each such call. The
// trace spans, which commit on a timer or with whatever write comes
// next, are not counted unless a journal write carries them. Its
// caller must keep other runs from committing meanwhile.
type writeCounter struct {
	*store.Store
	mu      sync.Mutex
	commits map[keel.RunID]int64
}

func (w *writeCounter) count(id keel.RunID, write func() error) error {
	w.mu.Lock() // one journal write at a time, so each counts its own
	defer w.mu.Unlock()
	before := w.Store.Commits()
	err := write()
	if w.commits == nil {
		w.commits = map[keel.RunID]int64{}
	}
	w.commits[id] += w.Store.Commits() - before
	return err
}

// journalCommits is how many commits the writes of run id's journal
// have made so far.
func (w *writeCounter) journalCommits(id keel.RunID) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.commits[id]
}

func (w *writeCounter) CreateRun(ctx context.Context, r keel.Run) error {
	return w.count(r.ID, func() error { return w.Store.CreateRun(ctx, r) })
}

func (w *writeCounter) CreateRunWith(ctx context.Context, r keel.Run, evs []keel.Event, upd *keel.RunUpdate) (stored []keel.Event, err error) {
	err = w.count(r.ID, func() error { stored, err = w.Store.CreateRunWith(ctx, r, evs, upd); return err })
	return stored, err
}

func (w *writeCounter) Append(ctx context.Context, id keel.RunID, typ keel.EventType, at time.Time, data json.RawMessage, upd *keel.RunUpdate) (ev keel.Event, err error) {
	err = w.count(id, func() error { ev, err = w.Store.Append(ctx, id, typ, at, data, upd); return err })
	return ev, err
}

func (w *writeCounter) AppendAll(ctx context.Context, id keel.RunID, evs []keel.Event, upd *keel.RunUpdate) (stored []keel.Event, err error) {
	err = w.count(id, func() error { stored, err = w.Store.AppendAll(ctx, id, evs, upd); return err })
	return stored, err
}

// classTools are echoTools that also say each tool's side effects on
// their own, and count how often they list their specs.
type classTools struct {
	echoTools
	specs atomic.Int64
}

func (t *classTools) Specs(context.Context) []keel.ToolSpec {
	t.specs.Add(1)
	return t.echoTools.Specs(context.Background())
}

func (t *classTools) SideEffects(name string) (keel.SideEffect, bool) {
	for _, s := range t.echoTools.Specs(context.Background()) {
		if s.Name == name {
			return s.SideEffects, true
		}
	}
	return "", false
}

// TestToolStepsAskOneToolsClass: with Tools that say one tool's side
// effects (SideEffecter), tool steps ask that instead of listing every
// spec: a run of six read-only calls lists the specs once, at its start,
// and still commits each step once.
func TestToolStepsAskOneToolsClass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	const steps = 6
	script := make([]scripted.Step, 0, steps+1)
	for range steps {
		script = append(script, scripted.CallTool("echo", `{"text":"x"}`))
	}
	tools := &classTools{}
	eng, err := engine.New(engine.Config{Store: st, Model: scripted.New(nil, append(script, scripted.Answer("done"))...), Tools: tools, DefaultMaxSteps: steps + 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	before := st.Commits()
	r, err := eng.Start(ctx, engine.StartRequest{Goal: "ask classes"})
	if err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng, st, r.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run ended %s (%s)", r.Status, r.Error)
	}
	if n := tools.specs.Load(); n != 1 {
		t.Errorf("a run of %d tool steps listed the specs %d times, want 1", steps, n)
	}
	if got := st.Commits() - before; got < steps+2 || got > steps+5 {
		t.Errorf("%d read-only steps took %d commits, want %d to %d", steps, got, steps+2, steps+5)
	}
}

// modelSpans returns the model call spans of a run's trace.
func modelSpans(t *testing.T, st *store.Store, id keel.RunID) []keel.Span {
	t.Helper()
	var out []keel.Span
	for _, sp := range spansOf(t, st, id) {
		if sp.Kind == keel.SpanModelCall {
			out = append(out, sp)
		}
	}
	return out
}
