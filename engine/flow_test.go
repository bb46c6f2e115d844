package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
)

// flowTools is the tool set of the orchestration tests: "echo" and
// "write" as in echoTools, and "meet", which returns only once a partner
// call is in flight at the same time (calls pair up in arrival order) or
// fails after meetTimeout, so a test of parallel steps fails instead of
// hanging when the steps run one after another.
type flowTools struct {
	mu          sync.Mutex
	calls       map[string]int
	arrived     int
	inflight    int
	maxInflight int
	timeouts    int
	changed     chan struct{} // closed and replaced on every arrival
}

const meetTimeout = 5 * time.Second

func newFlowTools() *flowTools {
	return &flowTools{calls: map[string]int{}, changed: make(chan struct{})}
}

func (t *flowTools) Specs(context.Context) []keel.ToolSpec {
	return []keel.ToolSpec{
		{Name: "echo", Description: "echo text", InputSchema: json.RawMessage(`{"type":"object"}`), SideEffects: keel.SideEffectReadOnly},
		{Name: "write", Description: "appends", InputSchema: json.RawMessage(`{"type":"object"}`), SideEffects: keel.SideEffectNonIdempotentWrite},
		{Name: "meet", Description: "waits for a partner", InputSchema: json.RawMessage(`{"type":"object"}`), SideEffects: keel.SideEffectReadOnly},
	}
}

func (t *flowTools) count(name string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.calls[name]
}

func (t *flowTools) Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	name, input := inv.Name, inv.Args
	t.mu.Lock()
	t.calls[name]++
	t.mu.Unlock()
	switch name {
	case "echo":
		return json.Marshal(map[string]string{"echoed": string(input)})
	case "write":
		return json.RawMessage(`{"written":true}`), nil
	case "meet":
		t.mu.Lock()
		t.arrived++
		n := t.arrived
		t.inflight++
		t.maxInflight = max(t.maxInflight, t.inflight)
		close(t.changed)
		t.changed = make(chan struct{})
		t.mu.Unlock()
		defer func() {
			t.mu.Lock()
			t.inflight--
			t.mu.Unlock()
		}()
		partner := (n + 1) / 2 * 2
		timeout := time.NewTimer(meetTimeout)
		defer timeout.Stop()
		for {
			t.mu.Lock()
			met, changed := t.arrived >= partner, t.changed
			t.mu.Unlock()
			if met {
				return json.RawMessage(fmt.Sprintf(`{"met":%d}`, n)), nil
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-timeout.C:
				t.mu.Lock()
				t.timeouts++
				t.mu.Unlock()
				return nil, &keel.ToolError{Code: keel.ToolTimeout, Message: "no partner arrived: the steps did not run in parallel"}
			}
		}
	}
	return nil, &keel.ToolError{Code: keel.ToolNotFound, Message: "no tool " + name}
}

// fakeModel answers the three kinds of model calls of a plan or DAG run:
// the planner's (structured output: req.Format is set), the composer's,
// and each sub-agent's (whose step it finds in the goal).
type fakeModel struct {
	plan func(n int, req models.ChatRequest) string
	step func(ctx context.Context, step string, req models.ChatRequest) (models.ChatResponse, error)

	mu        sync.Mutex
	planReqs  []models.ChatRequest
	compose   []models.ChatRequest
	stepCalls map[string]int
}

var stepInGoal = regexp.MustCompile(`\(This is step "([^"]+)" of`)

func (m *fakeModel) provider() *scripted.Provider {
	return scripted.New(nil, scripted.Repeat(scripted.ReplyFunc(m.reply)))
}

func (m *fakeModel) reply(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
	switch {
	case len(req.Format) > 0:
		m.mu.Lock()
		m.planReqs = append(m.planReqs, req)
		n := len(m.planReqs)
		m.mu.Unlock()
		return text(m.plan(n, req)), nil
	case strings.Contains(req.Messages[0].Content, "final answer of a keel run"):
		m.mu.Lock()
		m.compose = append(m.compose, req)
		m.mu.Unlock()
		return text("composed: " + req.Messages[len(req.Messages)-1].Content), nil
	}
	goal := scripted.Goal(req)
	sm := stepInGoal.FindStringSubmatch(goal)
	if sm == nil {
		return models.ChatResponse{}, fmt.Errorf("no step in goal %q", goal)
	}
	m.mu.Lock()
	if m.stepCalls == nil {
		m.stepCalls = map[string]int{}
	}
	m.stepCalls[sm[1]]++
	m.mu.Unlock()
	if m.step != nil {
		return m.step(ctx, sm[1], req)
	}
	return text("result of " + sm[1]), nil
}

func (m *fakeModel) calls(step string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stepCalls[step]
}

func text(s string) models.ChatResponse {
	return models.ChatResponse{Message: models.Message{Content: s}}
}

func callTool(name string) models.ChatResponse {
	return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{Name: name, Arguments: json.RawMessage(`{}`)}}}}
}

// lastTool returns the content of req's last message when it is a tool
// result, and whether it is.
func lastTool(req models.ChatRequest) (string, bool) {
	last := req.Messages[len(req.Messages)-1]
	return last.Content, last.Role == models.RoleTool
}

type flowHarness struct {
	st    *store.Store
	eng   *engine.Engine
	tools *flowTools
}

func newFlowHarness(t *testing.T, m engine.Model, cfg engine.Config) *flowHarness {
	t.Helper()
	st, err := openDB(context.Background(), filepath.Join(t.TempDir(), "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	h := &flowHarness{st: st, tools: newFlowTools()}
	cfg.Store, cfg.Model, cfg.Tools = st, m, h.tools
	if h.eng, err = engine.New(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.eng.Close(context.Background())
		st.Close()
	})
	return h
}

func (h *flowHarness) start(t *testing.T, req engine.StartRequest) keel.Run {
	t.Helper()
	if req.Goal == "" {
		req.Goal = "the whole task"
	}
	r, err := h.eng.Start(context.Background(), req)
	if err != nil {
		t.Fatalf("Start = %v", err)
	}
	return r
}

func (h *flowHarness) dag(t *testing.T, steps ...keel.PlanStep) keel.Run {
	t.Helper()
	r := h.start(t, engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: steps}})
	return waitRun(t, h.eng, h.st, r.ID)
}

// stepEvents decodes the step.started or step.finished events of a journal.
func stepEvents(t *testing.T, evs []keel.Event, typ keel.EventType) []keel.StepData {
	t.Helper()
	var out []keel.StepData
	for _, ev := range evs {
		if ev.Type == typ {
			var d keel.StepData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
		}
	}
	return out
}

func gapless(t *testing.T, st *store.Store, id keel.RunID) []keel.Event {
	t.Helper()
	evs := journal(t, st, id)
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			t.Fatalf("journal of %s: event %d has seq %d: %v", id, i, ev.Seq, types(evs))
		}
	}
	return evs
}

func childIDs(t *testing.T, st *store.Store, parent keel.RunID) []string {
	t.Helper()
	kids, err := st.ChildRuns(context.Background(), parent)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, k := range kids {
		out = append(out, strings.TrimPrefix(string(k.ID), string(parent)+"."))
	}
	slices.Sort(out)
	return out
}

func TestDAGStartValidation(t *testing.T) {
	t.Parallel()
	h := newFlowHarness(t, (&fakeModel{}).provider(), engine.Config{})
	s := func(id string, deps ...string) keel.PlanStep {
		return keel.PlanStep{ID: id, Goal: "do " + id, DependsOn: deps}
	}
	for _, tt := range []struct {
		name string
		req  engine.StartRequest
		want string
	}{
		{"no plan", engine.StartRequest{Kind: keel.KindDAG}, "needs a plan"},
		{"empty plan", engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{}}, "no steps"},
		{"cycle", engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{s("a", "c"), s("b", "a"), s("c", "b")}}}, "cycle: a → c → b → a"},
		{"self", engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{s("a", "a")}}}, "depends on itself"},
		{"unknown dependency", engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{s("a", "zz")}}}, `unknown step "zz"`},
		{"duplicate id", engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{s("a"), s("a")}}}, `"a" is used twice`},
		{"empty id", engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{s("")}}}, "has no id"},
		{"dotted id", engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{s("a.b")}}}, `"a.b"`},
		{"empty goal", engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{{ID: "a", Goal: " "}}}}, "empty goal"},
		{"unknown tool", engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{{ID: "a", Goal: "g", Tools: []string{"nope"}}}}}, `unknown tool "nope"`},
		{"tool outside the run's subset", engine.StartRequest{Kind: keel.KindDAG, Policy: keel.RunPolicy{Tools: []string{"echo"}},
			Plan: &keel.Plan{Steps: []keel.PlanStep{{ID: "a", Goal: "g", Tools: []string{"write"}}}}}, `"write", which the run may not use`},
		{"retries", engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{{ID: "a", Goal: "g", Retries: 99}}}}, "retries 99"},
		{"too many steps", engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: make([]keel.PlanStep, engine.MaxPlanSteps+1)}}, "at most"},
		{"plan on a plan run", engine.StartRequest{Kind: keel.KindPlan, Plan: &keel.Plan{Steps: []keel.PlanStep{s("a")}}}, "a plan is given only"},
		{"unknown kind", engine.StartRequest{Kind: "swarm"}, `kind "swarm"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.Goal = "g"
			_, err := h.eng.Start(context.Background(), tt.req)
			if !errors.Is(err, keel.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Start = %v, want ErrInvalid saying %q", err, tt.want)
			}
		})
	}
	runs, _ := h.st.ListRuns(context.Background(), 10)
	if len(runs) != 0 {
		t.Errorf("refused starts left %d runs", len(runs))
	}
}

// TestDAGParallelUnderLimit: four independent steps, two at a time. Each
// sub-agent calls "meet", which returns only when another call is in
// flight with it: the steps overlap. The journal never has more than two
// steps started and not finished.
func TestDAGParallelUnderLimit(t *testing.T) {
	t.Parallel()
	m := &fakeModel{step: func(_ context.Context, step string, req models.ChatRequest) (models.ChatResponse, error) {
		if out, ok := lastTool(req); ok {
			return text(step + " met: " + out), nil
		}
		return callTool("meet"), nil
	}}
	h := newFlowHarness(t, m.provider(), engine.Config{MaxParallelSteps: 2})
	var steps []keel.PlanStep
	for _, id := range []string{"s1", "s2", "s3", "s4"} {
		steps = append(steps, keel.PlanStep{ID: id, Goal: "meet someone", Tools: []string{"meet"}})
	}
	r := h.dag(t, steps...)
	if r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q, want succeeded", r.Status, r.Error)
	}
	h.tools.mu.Lock()
	maxIn, timeouts := h.tools.maxInflight, h.tools.timeouts
	h.tools.mu.Unlock()
	if timeouts != 0 || maxIn != 2 {
		t.Errorf("meet: %d timeouts, at most %d calls at once; want 0 timeouts and 2 at once (parallel, within the limit)", timeouts, maxIn)
	}
	evs := gapless(t, h.st, r.ID)
	open, most := 0, 0
	for _, ev := range evs {
		switch ev.Type {
		case keel.EventStepStarted:
			open++
			most = max(most, open)
		case keel.EventStepFinished:
			open--
		}
	}
	if most != 2 {
		t.Errorf("at most %d steps were running at once, want exactly the limit 2", most)
	}
	for _, id := range []string{"s1", "s2", "s3", "s4"} {
		if !strings.Contains(r.Result, "["+id+"]\n"+id+" met: ") {
			t.Errorf("result %q lacks sink %s", r.Result, id)
		}
	}
}

// TestDAGDependencies: a step starts only after the steps it depends on
// succeeded, and its goal carries their results; the run's result is its
// sinks' results, labelled.
func TestDAGDependencies(t *testing.T) {
	t.Parallel()
	m := &fakeModel{step: func(_ context.Context, step string, req models.ChatRequest) (models.ChatResponse, error) {
		if step == "c" {
			return text("c saw: " + scripted.Goal(req)), nil
		}
		return text("result of " + step), nil
	}}
	h := newFlowHarness(t, m.provider(), engine.Config{})
	r := h.dag(t,
		keel.PlanStep{ID: "a", Goal: "find a"},
		keel.PlanStep{ID: "b", Goal: "find b"},
		keel.PlanStep{ID: "c", Goal: "combine", DependsOn: []string{"a", "b"}},
		keel.PlanStep{ID: "d", Goal: "follow a", DependsOn: []string{"a"}},
	)
	if r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	evs := gapless(t, h.st, r.ID)
	if evs[0].Type != keel.EventRunStarted || evs[1].Type != keel.EventPlanProposed {
		t.Errorf("journal starts %v, want run.started, plan.proposed", types(evs[:2]))
	}
	seq := map[string]int64{}
	for _, ev := range evs {
		var d keel.StepData
		json.Unmarshal(ev.Data, &d)
		seq[string(ev.Type)+" "+d.StepID] = ev.Seq
	}
	if s := seq["step.started c"]; s < seq["step.finished a"] || s < seq["step.finished b"] {
		t.Errorf("c started at %d, before a (%d) and b (%d) finished", s, seq["step.finished a"], seq["step.finished b"])
	}
	c, err := h.st.GetRun(context.Background(), childRunID(r.ID, "c", 1))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"combine", "[a]\nresult of a", "[b]\nresult of b", "the whole task"} {
		if !strings.Contains(c.Goal, want) {
			t.Errorf("goal of c = %q, want it to carry %q", c.Goal, want)
		}
	}
	want := "[c]\nc saw: " + c.Goal + "\n\n[d]\nresult of d"
	if r.Result != want {
		t.Errorf("result = %q, want the sinks c and d: %q", r.Result, want)
	}
}

func childRunID(parent keel.RunID, step string, attempt int) keel.RunID {
	return keel.RunID(fmt.Sprintf("%s.%s.%d", parent, step, attempt))
}

// TestDAGSubAgents: a step is a run of its own, offered only its tools (a
// call of another fails), with its own budget, linked to its parent and
// step, and its result reaches the parent.
func TestDAGSubAgents(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	offered := map[string][]string{}
	m := &fakeModel{step: func(_ context.Context, step string, req models.ChatRequest) (models.ChatResponse, error) {
		var names []string
		for _, s := range req.Tools {
			names = append(names, s.Name)
		}
		mu.Lock()
		offered[step] = names
		mu.Unlock()
		if step != "echoer" {
			return text("result of " + step), nil
		}
		switch n := len(req.Messages); {
		case n == 2:
			return callTool("write"), nil // not among its tools
		case n == 4:
			return callTool("echo"), nil
		}
		out, _ := lastTool(req)
		return text("echoer got " + out), nil
	}}
	h := newFlowHarness(t, m.provider(), engine.Config{})
	r := h.start(t, engine.StartRequest{Kind: keel.KindDAG, Policy: keel.RunPolicy{BudgetTokens: 100000, Private: true}, Plan: &keel.Plan{Steps: []keel.PlanStep{
		{ID: "echoer", Goal: "echo something", Tools: []string{"echo"}, BudgetTokens: 500},
		{ID: "bare", Goal: "think"},
	}}})
	r = waitRun(t, h.eng, h.st, r.ID)
	if r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	mu.Lock()
	if fmt.Sprint(offered["echoer"]) != "[echo]" || len(offered["bare"]) != 0 {
		t.Errorf("tools offered: %v, want echoer [echo] and bare none", offered)
	}
	mu.Unlock()
	if n := h.tools.count("write"); n != 0 {
		t.Errorf("write ran %d times for a sub-agent that may not use it", n)
	}
	ctx := context.Background()
	kids, err := h.st.ChildRuns(ctx, r.ID)
	if err != nil || len(kids) != 2 {
		t.Fatalf("ChildRuns = %d runs, %v; want 2", len(kids), err)
	}
	byStep := map[string]keel.Run{}
	for _, k := range kids {
		if k.ParentID != r.ID || k.KindOrAgent() != keel.KindAgent || k.Status != keel.RunSucceeded {
			t.Errorf("child %s: parent %s kind %s status %s", k.ID, k.ParentID, k.KindOrAgent(), k.Status)
		}
		byStep[k.ParentStep] = k
	}
	echoer, bare := byStep["echoer"], byStep["bare"]
	if echoer.Policy.BudgetTokens != 500 || !echoer.Policy.Private || fmt.Sprint(echoer.Policy.Tools) != "[echo]" {
		t.Errorf("echoer policy = %+v, want its own budget 500, private, tools [echo]", echoer.Policy)
	}
	if bare.Policy.Tools == nil || len(bare.Policy.Tools) != 0 || bare.Policy.BudgetTokens <= 0 || bare.Policy.BudgetTokens > 100000 {
		t.Errorf("bare policy = %+v, want no tools (an empty, non-nil subset, as stored) and what is left of the parent's budget", bare.Policy)
	}
	var denied bool
	for _, ev := range journal(t, h.st, echoer.ID) {
		var d keel.ToolResultData
		if ev.Type == keel.EventToolResult && json.Unmarshal(ev.Data, &d) == nil && d.Name == "write" {
			denied = d.Error != nil && d.Error.Code == keel.ToolPermissionDenied
		}
	}
	if !denied {
		t.Error("the echoer's call of write was not refused as permission_denied")
	}
	fin := stepEvents(t, journal(t, h.st, r.ID), keel.EventStepFinished)
	for _, d := range fin {
		if d.StepID == "echoer" && (d.Result != echoer.Result || !strings.Contains(d.Result, "echoed")) {
			t.Errorf("step.finished echoer result %q, child result %q", d.Result, echoer.Result)
		}
	}
	if !strings.Contains(r.Result, "[echoer]\n"+echoer.Result) {
		t.Errorf("parent result %q lacks the echoer's %q", r.Result, echoer.Result)
	}
}

// TestDAGSubAgentBudgetIsItsOwn: through the model router, which enforces
// budgets, a step whose budget is too small fails while the same step
// without one succeeds.
func TestDAGSubAgentBudgetIsItsOwn(t *testing.T) {
	t.Parallel()
	local := (&fakeModel{}).provider()
	router, err := models.NewRouter(models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: local}}})
	if err != nil {
		t.Fatal(err)
	}
	h := newFlowHarness(t, router, engine.Config{})
	model := "local/" + scripted.DefaultModel.Name
	for _, tt := range []struct {
		budget int64
		status keel.RunStatus
	}{{5, keel.RunFailed}, {0, keel.RunSucceeded}} {
		r := h.start(t, engine.StartRequest{Kind: keel.KindDAG, Model: model, Plan: &keel.Plan{Steps: []keel.PlanStep{{ID: "tight", Goal: "say something long enough", BudgetTokens: tt.budget}}}})
		r = waitRun(t, h.eng, h.st, r.ID)
		if r.Status != tt.status {
			t.Errorf("budget %d: run = %s %q, want %s", tt.budget, r.Status, r.Error, tt.status)
		}
		if tt.status == keel.RunFailed && (!strings.Contains(r.Error, `"tight"`) || !strings.Contains(r.Error, "budget")) {
			t.Errorf("budget %d: reason %q, want the step and its budget named", tt.budget, r.Error)
		}
	}
}

// TestDAGStepRetries: a step that fails once succeeds on its retry, as a
// second sub-agent; without retries the run fails naming the step.
func TestDAGStepRetries(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		retries  int
		status   keel.RunStatus
		children []string
	}{
		{1, keel.RunSucceeded, []string{"flaky.1", "flaky.2"}},
		{0, keel.RunFailed, []string{"flaky.1"}},
	} {
		t.Run(fmt.Sprint("retries=", tt.retries), func(t *testing.T) {
			m := &fakeModel{}
			m.step = func(_ context.Context, step string, req models.ChatRequest) (models.ChatResponse, error) {
				if m.calls(step) == 1 {
					return models.ChatResponse{}, errors.New("flaky model")
				}
				return text("ok at last"), nil
			}
			h := newFlowHarness(t, m.provider(), engine.Config{})
			r := h.dag(t, keel.PlanStep{ID: "flaky", Goal: "try", Retries: tt.retries})
			if r.Status != tt.status {
				t.Fatalf("run = %s %q, want %s", r.Status, r.Error, tt.status)
			}
			if got := childIDs(t, h.st, r.ID); fmt.Sprint(got) != fmt.Sprint(tt.children) {
				t.Errorf("children = %v, want %v", got, tt.children)
			}
			evs := gapless(t, h.st, r.ID)
			started := stepEvents(t, evs, keel.EventStepStarted)
			if len(started) != len(tt.children) || started[len(started)-1].Attempt != len(tt.children) {
				t.Errorf("step.started = %+v, want %d attempts", started, len(tt.children))
			}
			if tt.status == keel.RunFailed && !strings.Contains(r.Error, `step "flaky" failed after 1 attempt`) {
				t.Errorf("reason = %q, want the step named", r.Error)
			}
			if tt.status == keel.RunSucceeded && r.Result != "[flaky]\nok at last" {
				t.Errorf("result = %q", r.Result)
			}
		})
	}
}

// TestPlannerReplans: the model proposes a plan (a first, invalid one is
// refused and repaired); a step fails; the planner revises the plan with
// the failure and the results so far; the succeeded step is reused, not
// run again; the answer is composed from the results.
func TestPlannerReplans(t *testing.T) {
	t.Parallel()
	m := &fakeModel{
		plan: func(n int, req models.ChatRequest) string {
			switch n {
			case 1:
				return `{"steps":[{"id":"a","goal":"x","depends_on":["b"]},{"id":"b","goal":"y","depends_on":["a"]}]}`
			case 2:
				return `{"steps":[{"id":"gather","goal":"gather facts","tools":["echo"]},{"id":"risky","goal":"the risky way","depends_on":["gather"]}]}`
			}
			return `{"steps":[{"id":"gather","goal":"gather facts","tools":["echo"]},{"id":"safe","goal":"the safe way","depends_on":["gather"]}]}`
		},
		step: func(_ context.Context, step string, req models.ChatRequest) (models.ChatResponse, error) {
			switch step {
			case "risky":
				return models.ChatResponse{}, errors.New("the risky way broke")
			case "gather":
				return text("facts: 42"), nil
			}
			return text("safe done"), nil
		},
	}
	h := newFlowHarness(t, m.provider(), engine.Config{})
	r := h.start(t, engine.StartRequest{Kind: keel.KindPlan, Goal: "answer the question"})
	if r.Kind != keel.KindPlan {
		t.Errorf("Start returned kind %q", r.Kind)
	}
	r = waitRun(t, h.eng, h.st, r.ID)
	if r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	evs := gapless(t, h.st, r.ID)
	var plans []keel.PlanData
	models_ := 0
	for _, ev := range evs {
		switch ev.Type {
		case keel.EventPlanProposed:
			var d keel.PlanData
			json.Unmarshal(ev.Data, &d)
			plans = append(plans, d)
		case keel.EventModelResult:
			models_++
		}
	}
	if len(plans) != 2 || plans[0].Revision != 0 || plans[1].Revision != 1 || !strings.Contains(plans[1].Reason, `step "risky" failed`) {
		t.Fatalf("plans = %+v, want revision 0, then 1 with the failure as its reason", plans)
	}
	if models_ != 3 {
		t.Errorf("%d model.result events, want 3 (two accepted plans and the answer; the refused plan is not journaled)", models_)
	}
	if got := childIDs(t, h.st, r.ID); fmt.Sprint(got) != "[gather.1 risky.1 safe.1]" {
		t.Errorf("children = %v, want gather run once, then risky, then safe", got)
	}
	if m.calls("gather") != 1 {
		t.Errorf("gather asked the model %d times, want 1", m.calls("gather"))
	}
	m.mu.Lock()
	planReqs, compose := m.planReqs, m.compose
	m.mu.Unlock()
	if len(planReqs) != 3 {
		t.Fatalf("planner asked %d times, want 3", len(planReqs))
	}
	first := planReqs[0].Messages[1].Content
	if !strings.Contains(first, "answer the question") || !strings.Contains(first, "- echo: echo text") || !strings.Contains(string(planReqs[0].Format), `"enum":["echo","write","meet"]`) {
		t.Errorf("planner request = %q (schema %s), want the goal and the tools to choose from", first, planReqs[0].Format)
	}
	if !strings.Contains(planReqs[1].Messages[len(planReqs[1].Messages)-1].Content, "cycle") {
		t.Errorf("the repair request does not say what was wrong: %+v", planReqs[1].Messages)
	}
	replan := planReqs[2].Messages[len(planReqs[2].Messages)-1].Content
	if !strings.Contains(replan, "the risky way broke") || !strings.Contains(replan, "facts: 42") {
		t.Errorf("re-plan request = %q, want the failure and the results so far", replan)
	}
	if len(compose) != 1 || !strings.Contains(r.Result, "facts: 42") || !strings.Contains(r.Result, "safe done") || !strings.HasPrefix(r.Result, "composed: ") {
		t.Errorf("result = %q, want the composed answer from every result", r.Result)
	}
}

// TestPlannerReplanBound: a planner whose steps keep failing stops after
// Config.MaxReplans re-plans, naming the step.
func TestPlannerReplanBound(t *testing.T) {
	t.Parallel()
	m := &fakeModel{
		plan: func(int, models.ChatRequest) string { return `{"steps":[{"id":"x","goal":"always fails"}]}` },
		step: func(context.Context, string, models.ChatRequest) (models.ChatResponse, error) {
			return models.ChatResponse{}, errors.New("nope")
		},
	}
	h := newFlowHarness(t, m.provider(), engine.Config{})
	r := h.start(t, engine.StartRequest{Kind: keel.KindPlan, Goal: "impossible"})
	r = waitRun(t, h.eng, h.st, r.ID)
	if r.Status != keel.RunFailed || !strings.Contains(r.Error, `step "x" failed`) || !strings.Contains(r.Error, "no re-plans left: 2") {
		t.Fatalf("run = %s %q, want failed naming step x after 2 re-plans", r.Status, r.Error)
	}
	evs := gapless(t, h.st, r.ID)
	var revs []int
	for _, ev := range evs {
		if ev.Type == keel.EventPlanProposed {
			var d keel.PlanData
			json.Unmarshal(ev.Data, &d)
			revs = append(revs, d.Revision)
		}
	}
	if fmt.Sprint(revs) != "[0 1 2]" {
		t.Errorf("plan revisions %v, want [0 1 2]", revs)
	}
	if got := childIDs(t, h.st, r.ID); fmt.Sprint(got) != "[x.1 x.2 x.3]" {
		t.Errorf("children = %v", got)
	}
}

// TestDAGResumeAfterShutdown: the daemon stops while one step's
// sub-agent is in its model call and another step has finished; the next
// engine on the same store resumes the parent and that sub-agent: the
// finished step is not run again, the started one gets no second
// sub-agent, and every journal is gapless.
func TestDAGResumeAfterShutdown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := openDB(ctx, filepath.Join(dir, "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	blocked := make(chan struct{}, 1)
	m1 := &fakeModel{step: func(ctx context.Context, step string, req models.ChatRequest) (models.ChatResponse, error) {
		if step == "slow" {
			select {
			case blocked <- struct{}{}:
			default:
			}
			<-ctx.Done()
			return models.ChatResponse{}, ctx.Err()
		}
		return text("result of " + step), nil
	}}
	eng1, err := engine.New(engine.Config{Store: st, Model: m1.provider(), Tools: newFlowTools()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := eng1.Start(ctx, engine.StartRequest{Kind: keel.KindDAG, Goal: "survive a restart", Plan: &keel.Plan{Steps: []keel.PlanStep{
		{ID: "fast", Goal: "quick"}, {ID: "slow", Goal: "takes long"}, {ID: "last", Goal: "sum up", DependsOn: []string{"fast", "slow"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow step never reached its model")
	}
	waitUntil(t, eng1, func() bool { return len(stepEvents(t, journal(t, st, r.ID), keel.EventStepFinished)) == 1 })
	if err := eng1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[keel.RunID]keel.RunStatus{r.ID: keel.RunInterrupted, childRunID(r.ID, "slow", 1): keel.RunInterrupted, childRunID(r.ID, "fast", 1): keel.RunSucceeded} {
		if got, _ := st.GetRun(ctx, id); got.Status != want {
			t.Fatalf("after Close %s is %s, want %s", id, got.Status, want)
		}
	}

	m2 := &fakeModel{}
	eng2, err := engine.New(engine.Config{Store: st, Model: m2.provider(), Tools: newFlowTools()})
	if err != nil {
		t.Fatal(err)
	}
	defer eng2.Close(ctx)
	if n, err := eng2.Recover(ctx); err != nil || n != 0 {
		t.Fatalf("Recover = %d, %v", n, err)
	}
	if n, err := eng2.Resume(ctx); err != nil || n != 2 {
		t.Fatalf("Resume = %d, %v; want the parent and the slow step's sub-agent", n, err)
	}
	got := waitRun(t, eng2, st, r.ID)
	if got.Status != keel.RunSucceeded || got.Result != "[last]\nresult of last" {
		t.Fatalf("resumed run = %s %q %q", got.Status, got.Result, got.Error)
	}
	if m2.calls("fast") != 0 || m2.calls("slow") != 1 {
		t.Errorf("after the restart the model was asked for fast %d times and slow %d times; want 0 and 1", m2.calls("fast"), m2.calls("slow"))
	}
	if kids := childIDs(t, st, r.ID); fmt.Sprint(kids) != "[fast.1 last.1 slow.1]" {
		t.Errorf("children = %v, want one per step", kids)
	}
	evs := gapless(t, st, r.ID)
	started := stepEvents(t, evs, keel.EventStepStarted)
	if len(started) != 3 {
		t.Errorf("step.started events %+v, want 3", started)
	}
	if !slices.Contains(types(evs), keel.EventRunResumed) {
		t.Errorf("parent journal %v has no run.resumed", types(evs))
	}
	for _, k := range []string{"fast", "slow", "last"} {
		gapless(t, st, childRunID(r.ID, k, 1))
	}
}

// blockingSteps is a model whose sub-agents wait in their model call
// until released (or cancelled); started receives each step as it waits.
func blockingSteps(release <-chan struct{}) (*fakeModel, chan string) {
	started := make(chan string, 16)
	return &fakeModel{step: func(ctx context.Context, step string, req models.ChatRequest) (models.ChatResponse, error) {
		started <- step
		select {
		case <-release:
			return text("result of " + step), nil
		case <-ctx.Done():
			return models.ChatResponse{}, ctx.Err()
		}
	}}, started
}

func receive(t *testing.T, ch <-chan string, n int) []string {
	t.Helper()
	var out []string
	for len(out) < n {
		select {
		case s := <-ch:
			out = append(out, s)
		case <-time.After(10 * time.Second):
			t.Fatalf("got %v, waited for %d", out, n)
		}
	}
	slices.Sort(out)
	return out
}

// TestDAGCancelStopsChildren: cancelling the parent cancels its running
// sub-agents, and the parent journals their endings before its own.
func TestDAGCancelStopsChildren(t *testing.T) {
	t.Parallel()
	m, started := blockingSteps(make(chan struct{}))
	h := newFlowHarness(t, m.provider(), engine.Config{})
	ctx := context.Background()
	r := h.start(t, engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{{ID: "a", Goal: "wait"}, {ID: "b", Goal: "wait too"}}}})
	receive(t, started, 2)
	if _, err := h.eng.Cancel(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	got := waitRun(t, h.eng, h.st, r.ID)
	if got.Status != keel.RunCancelled {
		t.Fatalf("parent = %s, want cancelled", got.Status)
	}
	for _, k := range []string{"a", "b"} {
		if c, _ := h.st.GetRun(ctx, childRunID(r.ID, k, 1)); c.Status != keel.RunCancelled {
			t.Errorf("sub-agent %s = %s, want cancelled", k, c.Status)
		}
	}
	evs := gapless(t, h.st, r.ID)
	fin := stepEvents(t, evs, keel.EventStepFinished)
	if len(fin) != 2 || fin[0].Status != keel.RunCancelled || evs[len(evs)-1].Type != keel.EventRunCancelled {
		t.Errorf("parent journal %v (finished %+v), want both steps cancelled, then run.cancelled", types(evs), fin)
	}
}

// TestDAGPauseStopsNewSteps: a paused parent starts no new step; the
// sub-agent already running finishes; after Unpause the next step runs.
func TestDAGPauseStopsNewSteps(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	m, started := blockingSteps(release)
	h := newFlowHarness(t, m.provider(), engine.Config{})
	ctx := context.Background()
	r := h.start(t, engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{{ID: "a", Goal: "first"}, {ID: "b", Goal: "then", DependsOn: []string{"a"}}}}})
	receive(t, started, 1)
	if _, err := h.eng.Pause(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	close(release)
	got := waitRun(t, h.eng, h.st, r.ID)
	if got.Status != keel.RunPaused {
		t.Fatalf("parent = %s %q, want paused", got.Status, got.Error)
	}
	a := waitRun(t, h.eng, h.st, childRunID(r.ID, "a", 1))
	if a.Status != keel.RunSucceeded {
		t.Errorf("the running sub-agent = %s, want it to finish", a.Status)
	}
	if _, err := h.st.GetRun(ctx, childRunID(r.ID, "b", 1)); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("step b started while its parent was paused (%v)", err)
	}
	// A DAG run's steps are its sub-agents: words and tool calls for it
	// are refused with a pointer to them, not journaled for nobody.
	if _, err := h.eng.Say(ctx, r.ID, "hello"); !errors.Is(err, keel.ErrInvalid) || !strings.Contains(err.Error(), "sub-agent") {
		t.Errorf("Say to a DAG run = %v, want ErrInvalid naming its sub-agents", err)
	}
	if _, err := h.eng.TakeOver(ctx, r.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := h.eng.RunTool(ctx, r.ID, "echo", nil); !errors.Is(err, keel.ErrInvalid) {
		t.Errorf("RunTool on a DAG run = %v, want ErrInvalid", err)
	}
	if _, err := h.eng.HandBack(ctx, r.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := h.eng.Unpause(ctx, r.ID); err != nil && !errors.Is(err, keel.ErrConflict) {
		t.Fatal(err)
	}
	got = waitRun(t, h.eng, h.st, r.ID)
	if got.Status != keel.RunSucceeded || got.Result != "[b]\nresult of b" {
		t.Fatalf("after unpause = %s %q %q", got.Status, got.Result, got.Error)
	}
	evs := gapless(t, h.st, r.ID)
	if !slices.Contains(types(evs), keel.EventRunPaused) || !slices.Contains(types(evs), keel.EventRunResumed) {
		t.Errorf("journal %v, want run.paused and run.resumed", types(evs))
	}
}

// TestDAGChildWaitsForApproval: a sub-agent that waits for a person's
// approval leaves its parent running (blocked, not failed); once approved
// the sub-agent and then the parent finish.
func TestDAGChildWaitsForApproval(t *testing.T) {
	t.Parallel()
	m := &fakeModel{step: func(_ context.Context, step string, req models.ChatRequest) (models.ChatResponse, error) {
		if out, ok := lastTool(req); ok {
			return text("wrote: " + out), nil
		}
		return callTool("write"), nil
	}}
	h := newFlowHarness(t, m.provider(), engine.Config{RequireApproval: []keel.SideEffect{keel.SideEffectNonIdempotentWrite}})
	ctx := context.Background()
	r := h.start(t, engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{{ID: "w", Goal: "write it", Tools: []string{"write"}}}}})
	child := childRunID(r.ID, "w", 1)
	waitUntil(t, h.eng, func() bool { c, _ := h.st.GetRun(ctx, child); return c.Status == keel.RunWaiting })
	time.Sleep(50 * time.Millisecond)
	if p, _ := h.st.GetRun(ctx, r.ID); p.Status != keel.RunRunning {
		t.Fatalf("parent = %s %q while its sub-agent waits, want running", p.Status, p.Error)
	}
	var asked keel.ApprovalRequestData
	for _, ev := range journal(t, h.st, child) {
		if ev.Type == keel.EventApprovalAsked {
			json.Unmarshal(ev.Data, &asked)
		}
	}
	if _, err := h.eng.Approve(ctx, child, keel.ApprovalData{CallID: asked.Call.ID, ArgsSHA256: asked.ArgsSHA256, Approved: true}); err != nil {
		t.Fatal(err)
	}
	got := waitRun(t, h.eng, h.st, r.ID)
	if got.Status != keel.RunSucceeded || !strings.Contains(got.Result, `wrote: {"written":true}`) {
		t.Errorf("parent = %s %q %q", got.Status, got.Result, got.Error)
	}
}

// TestReplayRefusesFlow: a finished DAG run is not replayed as if it were
// one loop: replay refuses it, or (until Replay checks the kind first)
// replays to a failure that says so; it never creates a run.
func TestReplayRefusesFlow(t *testing.T) {
	t.Parallel()
	h := newFlowHarness(t, (&fakeModel{}).provider(), engine.Config{})
	r := h.dag(t, keel.PlanStep{ID: "a", Goal: "g"})
	if r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s", r.Status)
	}
	evs, err := h.eng.Replay(context.Background(), r.ID)
	switch {
	case err != nil:
		if !errors.Is(err, keel.ErrInvalid) || !strings.Contains(err.Error(), "replay of plan and dag runs is not supported") {
			t.Errorf("Replay = %v", err)
		}
	case len(evs) == 0 || !strings.Contains(string(evs[len(evs)-1].Data), "replay of plan and dag runs is not supported"):
		t.Errorf("Replay = %v, want a refusal", types(evs))
	}
	if kids := childIDs(t, h.st, r.ID); len(kids) != 1 {
		t.Errorf("children after replay = %v", kids)
	}
}

// TestFlowResumeReusesJournal: a parent resumed from a journal written by
// a daemon that died between two of its writes goes on from it: a plan
// reply journaled before its plan.proposed is used without asking the
// planner again; a step.started whose sub-agent was never created gets
// that sub-agent, under the journaled ID, not a second attempt.
func TestFlowResumeReusesJournal(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		kind     keel.RunKind
		journal  []any // event type, data pairs
		planned  int   // planner calls wanted
		children string
	}{
		{"plan reply journaled, plan not", keel.KindPlan, []any{
			keel.EventModelResult, keel.ModelResultData{Step: 1, Model: scripted.DefaultModel.Name, Content: `{"steps":[{"id":"only","goal":"the one step"}]}`},
		}, 0, "[only.1]"},
		{"step started, sub-agent not created", keel.KindDAG, []any{
			keel.EventPlanProposed, keel.PlanData{Plan: keel.Plan{Steps: []keel.PlanStep{{ID: "a", Goal: "first"}, {ID: "b", Goal: "second", DependsOn: []string{"a"}}}}},
			keel.EventStepStarted, keel.StepData{StepID: "a", Run: "run_j.a.1", Attempt: 1},
		}, 0, "[a.1 b.1]"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := &fakeModel{plan: func(int, models.ChatRequest) string { return `{"steps":[{"id":"other","goal":"not this"}]}` }}
			h := newFlowHarness(t, m.provider(), engine.Config{})
			ctx := context.Background()
			now := time.Now()
			if err := h.st.CreateRun(ctx, keel.Run{ID: "run_j", Kind: tt.kind, Goal: "resume me", Model: scripted.DefaultModel.Name, Status: keel.RunQueued, MaxSteps: 4, CreatedAt: now, UpdatedAt: now}); err != nil {
				t.Fatal(err)
			}
			app := func(typ keel.EventType, data any, upd *keel.RunUpdate) {
				raw, _ := json.Marshal(data)
				if _, err := h.st.Append(ctx, "run_j", typ, now, raw, upd); err != nil {
					t.Fatal(err)
				}
			}
			app(keel.EventRunStarted, keel.RunStartedData{Goal: "resume me"}, &keel.RunUpdate{Status: keel.RunRunning})
			for i := 0; i < len(tt.journal); i += 2 {
				app(tt.journal[i].(keel.EventType), tt.journal[i+1], nil)
			}
			app(keel.EventRunInterrupted, keel.RunEndData{Status: keel.RunInterrupted}, &keel.RunUpdate{Status: keel.RunInterrupted})
			if n, err := h.eng.Resume(ctx); err != nil || n != 1 {
				t.Fatalf("Resume = %d, %v", n, err)
			}
			r := waitRun(t, h.eng, h.st, "run_j")
			if r.Status != keel.RunSucceeded {
				t.Fatalf("run = %s %q", r.Status, r.Error)
			}
			m.mu.Lock()
			planned := len(m.planReqs)
			m.mu.Unlock()
			if planned != tt.planned {
				t.Errorf("planner asked %d times, want %d", planned, tt.planned)
			}
			if got := childIDs(t, h.st, "run_j"); fmt.Sprint(got) != tt.children {
				t.Errorf("children = %v, want %s", got, tt.children)
			}
			gapless(t, h.st, "run_j")
		})
	}
}

// TestDAGCancelPausedParent: cancelling a parent that paused (so no
// goroutine of its own runs it) still cancels the sub-agent it left
// running.
func TestDAGCancelPausedParent(t *testing.T) {
	t.Parallel()
	blocked, release := make(chan struct{}, 1), make(chan struct{})
	m := &fakeModel{step: func(ctx context.Context, step string, req models.ChatRequest) (models.ChatResponse, error) {
		switch step {
		case "long":
			blocked <- struct{}{}
			<-ctx.Done()
			return models.ChatResponse{}, ctx.Err()
		case "quick":
			select {
			case <-release:
			case <-ctx.Done():
				return models.ChatResponse{}, ctx.Err()
			}
		}
		return text("result of " + step), nil
	}}
	h := newFlowHarness(t, m.provider(), engine.Config{})
	ctx := context.Background()
	r := h.start(t, engine.StartRequest{Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{
		{ID: "long", Goal: "never ends"}, {ID: "quick", Goal: "ends"}, {ID: "next", Goal: "after quick", DependsOn: []string{"quick"}},
	}}})
	select {
	case <-blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("the long step never started")
	}
	if _, err := h.eng.Pause(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	close(release) // quick ends, next would start: the parent pauses there
	if got := waitRun(t, h.eng, h.st, r.ID); got.Status != keel.RunPaused {
		t.Fatalf("parent = %s %q, want paused", got.Status, got.Error)
	}
	long := childRunID(r.ID, "long", 1)
	if c, _ := h.st.GetRun(ctx, long); c.Status != keel.RunRunning {
		t.Fatalf("long = %s, want still running while its parent is paused", c.Status)
	}
	if got, err := h.eng.Cancel(ctx, r.ID); err != nil || got.Status != keel.RunCancelled {
		t.Fatalf("Cancel(paused parent) = %s, %v", got.Status, err)
	}
	if c := waitRun(t, h.eng, h.st, long); c.Status != keel.RunCancelled {
		t.Errorf("long = %s after its parent was cancelled, want cancelled", c.Status)
	}
}

// crashAfterFirstWrite is a store that takes one write and then fails
// every later one, as if the daemon died right after that write.
type crashAfterFirstWrite struct {
	*store.Store
	mu     sync.Mutex
	writes int
}

func (c *crashAfterFirstWrite) write() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes++
	if c.writes > 1 {
		return errors.New("the daemon died")
	}
	return nil
}

func (c *crashAfterFirstWrite) CreateRun(ctx context.Context, r keel.Run) error {
	if err := c.write(); err != nil {
		return err
	}
	return c.Store.CreateRun(ctx, r)
}

func (c *crashAfterFirstWrite) CreateRunWith(ctx context.Context, r keel.Run, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error) {
	if err := c.write(); err != nil {
		return nil, err
	}
	return c.Store.CreateRunWith(ctx, r, evs, upd)
}

func (c *crashAfterFirstWrite) Append(ctx context.Context, id keel.RunID, typ keel.EventType, at time.Time, data json.RawMessage, upd *keel.RunUpdate) (keel.Event, error) {
	if err := c.write(); err != nil {
		return keel.Event{}, err
	}
	return c.Store.Append(ctx, id, typ, at, data, upd)
}

func (c *crashAfterFirstWrite) AppendAll(ctx context.Context, id keel.RunID, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error) {
	if err := c.write(); err != nil {
		return nil, err
	}
	return c.Store.AppendAll(ctx, id, evs, upd)
}

// TestDAGRunIsStoredWithItsPlan: a DAG run resumes from the plan in its
// journal, so the run is never stored without it. With the daemon dying
// right after the first write of Start, the run is either not there or
// there with its plan.
func TestDAGRunIsStoredWithItsPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := openDB(ctx, filepath.Join(t.TempDir(), "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	eng, err := engine.New(engine.Config{Store: &crashAfterFirstWrite{Store: st}, Model: scripted.New(nil), Tools: newFlowTools()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := eng.Start(ctx, engine.StartRequest{Kind: keel.KindDAG, Goal: "g", Plan: &keel.Plan{Steps: []keel.PlanStep{{ID: "a", Goal: "do a"}}}})
	if err != nil {
		t.Fatalf("Start = %v", err)
	}
	eng.Close(ctx)
	evs, err := st.Events(ctx, r.ID, 0)
	if err != nil {
		t.Fatalf("the run Start returned is not stored: %v", err)
	}
	if len(evs) < 2 || evs[0].Type != keel.EventRunStarted || evs[1].Type != keel.EventPlanProposed {
		t.Errorf("a DAG run stored by one write has journal %v, want it to begin with run.started and plan.proposed", types(evs))
	}
}

// TestDAGSubAgentsShareTheBudget: sub-agents running together never hold
// more than the parent's budget has left. Steps starting together share
// it equally; a step that finds it all held by a running sibling (one
// that named a budget as big as the run's) waits until that sibling ends
// and gives back what it did not spend.
func TestDAGSubAgentsShareTheBudget(t *testing.T) {
	t.Parallel()
	const budget = 900
	for _, tt := range []struct {
		name    string
		steps   []keel.PlanStep
		first   []string // the sub-agents running while the others block
		budgets map[string]int64
	}{
		{"shared", []keel.PlanStep{{ID: "a", Goal: "a"}, {ID: "b", Goal: "b"}, {ID: "c", Goal: "c"}},
			[]string{"a.1", "b.1", "c.1"}, map[string]int64{"a": 300, "b": 300, "c": 300}},
		{"held", []keel.PlanStep{{ID: "big", Goal: "big", BudgetTokens: budget}, {ID: "x", Goal: "x"}, {ID: "y", Goal: "y"}},
			[]string{"big.1"}, map[string]int64{"big": budget}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			release := make(chan struct{})
			// The sub-agents that start later spend nothing until all of
			// them have started: what they are given depends on what the
			// others spent meanwhile.
			started := make(chan struct{})
			m := &fakeModel{step: func(ctx context.Context, step string, req models.ChatRequest) (models.ChatResponse, error) {
				wait := started
				if _, first := tt.budgets[step]; first {
					wait = release // running until the test has looked
				}
				select {
				case <-wait:
				case <-ctx.Done():
					return models.ChatResponse{}, ctx.Err()
				}
				return text("result of " + step), nil
			}}
			h := newFlowHarness(t, m.provider(), engine.Config{MaxParallelSteps: 4})
			ctx := context.Background()
			r := h.start(t, engine.StartRequest{Kind: keel.KindDAG, Policy: keel.RunPolicy{BudgetTokens: budget}, Plan: &keel.Plan{Steps: tt.steps}})
			waitUntil(t, h.eng, func() bool { return len(childIDs(t, h.st, r.ID)) >= len(tt.first) })
			time.Sleep(50 * time.Millisecond) // room for a wrong start
			if got := childIDs(t, h.st, r.ID); fmt.Sprint(got) != fmt.Sprint(tt.first) {
				t.Fatalf("sub-agents running = %v, want %v", got, tt.first)
			}
			kids, err := h.st.ChildRuns(ctx, r.ID)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range kids {
				if want := tt.budgets[k.ParentStep]; k.Policy.BudgetTokens != want {
					t.Errorf("sub-agent %s has a budget of %d tokens, want %d", k.ID, k.Policy.BudgetTokens, want)
				}
			}
			// started closes once every sub-agent has been created: a
			// sub-agent's creation publishes its run.started.
			var once sync.Once
			parent := r.ID // r is assigned below while this still runs
			allStarted := func(keel.Event) {
				if kids, err := h.st.ChildRuns(ctx, parent); err != nil || len(kids) == len(tt.steps) {
					once.Do(func() { close(started) })
				}
			}
			defer h.eng.Subscribe(allStarted)()
			close(release)
			allStarted(keel.Event{})
			r = waitRun(t, h.eng, h.st, r.ID)
			if r.Status != keel.RunSucceeded {
				t.Fatalf("run = %s %q", r.Status, r.Error)
			}
			kids, err = h.st.ChildRuns(ctx, r.ID)
			if err != nil {
				t.Fatal(err)
			}
			if len(kids) != len(tt.steps) {
				t.Fatalf("%d sub-agents ran, want %d", len(kids), len(tt.steps))
			}
			if tt.name == "held" {
				// x and y start together once big has ended, and share
				// what it did not spend.
				left := budget - spentTokens(t, h.st, keel.RunID(string(r.ID)+".big.1"))
				want := map[string]int64{"big": budget, "x": left / 2, "y": left - left/2}
				for _, k := range kids {
					if k.Policy.BudgetTokens != want[k.ParentStep] {
						t.Errorf("%s has %d tokens, want %d (of %d left when big ended)", k.ID, k.Policy.BudgetTokens, want[k.ParentStep], left)
					}
				}
			}
		})
	}
}

func spentTokens(t *testing.T, st *store.Store, id keel.RunID) int64 {
	t.Helper()
	spans, err := st.Spans(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var tok int64
	for _, sp := range spans {
		if sp.Kind == keel.SpanModelCall {
			tok += int64(sp.PromptTokens + sp.CompletionTokens)
		}
	}
	return tok
}
