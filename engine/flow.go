package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
)

// Orchestration: plan and DAG runs (see docs/orchestration.md).
//
// A plan or DAG run is a parent whose steps are sub-agents: agent runs of
// their own (keel.Run.ParentID, ParentStep), each with its own budget and
// tool subset. The parent's goroutine (flow) owns all of its state, which
// it keeps only as its journal: plan.proposed, step.started and
// step.finished events, plus the planner's model.result events. Every
// change is journaled first and then applied to the in-memory state by
// the same function (flowState.apply) that rebuilds the state from the
// journal on a restart, so a resumed parent is exactly where it stopped.
//
// Waiting for children: the parent subscribes to the engine's events
// (every status change of every run is published after it is stored) and
// wakes when a run whose ID has its prefix ends; it then reads its
// running children from the store. There is no polling.

// Limits of a plan, checked by Start (a DAG's plan) and on every plan the
// planner proposes.
const (
	// MaxPlanSteps is the most steps a plan may have.
	MaxPlanSteps = 32
	// MaxStepRetries is the largest per-step retry count.
	MaxStepRetries = 5
	// maxStepGoal bounds a step's goal, in bytes.
	maxStepGoal = 8 << 10
	// maxDepResult bounds how much of each dependency's result a step's
	// goal carries, in bytes.
	maxDepResult = 16 << 10
	// planRepairs is how many times the planner is asked again for a
	// plan that is well-formed JSON but not a valid plan (a cycle, an
	// unknown tool); schema violations are repaired by models.Structured.
	planRepairs = 2
	// childCancelWait bounds how long a cancelled parent waits for its
	// sub-agents to record their own cancellation.
	childCancelWait = 10 * time.Second
)

// Defaults of Config's orchestration fields.
const (
	DefaultMaxParallelSteps = 4
	DefaultMaxReplans       = 2
)

// errReplayFlow refuses to replay a plan or DAG run: a replay runs one
// loop in memory, and such a run is many runs.
var errReplayFlow = fmt.Errorf("replay of plan and dag runs is not supported (replay its sub-agents one by one): %w", keel.ErrInvalid)

// replayable reports whether run can be replayed: an error wrapping
// keel.ErrInvalid for plan and DAG runs.
func replayable(run keel.Run) error {
	if run.KindOrAgent() != keel.KindAgent {
		return errReplayFlow
	}
	return nil
}

var stepIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// childRunID is the ID of the sub-agent that makes attempt of step: the
// same on every restart, so a parent that resumes finds the child it
// started instead of starting a second one.
func childRunID(parent keel.RunID, step string, attempt int) keel.RunID {
	return keel.RunID(string(parent) + "." + step + "." + strconv.Itoa(attempt))
}

// checkKind validates a start request's kind and plan. It returns the
// plan a DAG run starts with (nil for other kinds).
func (e *Engine) checkKind(req StartRequest) (*keel.Plan, error) {
	switch req.Kind {
	case "", keel.KindAgent, keel.KindPlan:
		if req.Plan != nil {
			return nil, fmt.Errorf("a plan is given only with kind %q (a %q run's planner makes its own): %w", keel.KindDAG, keel.KindPlan, keel.ErrInvalid)
		}
		return nil, nil
	case keel.KindDAG:
		if req.Plan == nil {
			return nil, fmt.Errorf("a %q run needs a plan: %w", keel.KindDAG, keel.ErrInvalid)
		}
		p := clonePlan(*req.Plan)
		if err := validatePlan(p, e.cfg.Tools.Specs(), req.Policy.Tools); err != nil {
			return nil, err
		}
		return &p, nil
	}
	return nil, fmt.Errorf("kind %q: want %q, %q or %q: %w", req.Kind, keel.KindAgent, keel.KindPlan, keel.KindDAG, keel.ErrInvalid)
}

// validatePlan checks that p is a DAG of at most MaxPlanSteps steps with
// unique IDs, known dependencies, no cycle, tools that exist (and that the
// run may use, when allowed is not nil) and bounded sizes. Errors wrap
// keel.ErrInvalid and say what is wrong.
func validatePlan(p keel.Plan, specs []keel.ToolSpec, allowed []string) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("plan: "+format+": %w", append(a, keel.ErrInvalid)...)
	}
	if len(p.Steps) == 0 {
		return bad("it has no steps")
	}
	if len(p.Steps) > MaxPlanSteps {
		return bad("it has %d steps; at most %d", len(p.Steps), MaxPlanSteps)
	}
	index := map[string]int{}
	for i, s := range p.Steps {
		switch {
		case s.ID == "":
			return bad("step %d has no id", i+1)
		case !stepIDPattern.MatchString(s.ID):
			return bad("step id %q: use 1 to 64 letters, digits, '-' or '_'", s.ID)
		}
		if _, dup := index[s.ID]; dup {
			return bad("step id %q is used twice", s.ID)
		}
		index[s.ID] = i
	}
	for _, s := range p.Steps {
		switch {
		case strings.TrimSpace(s.Goal) == "":
			return bad("step %q has an empty goal", s.ID)
		case len(s.Goal) > maxStepGoal:
			return bad("step %q: goal longer than %d bytes", s.ID, maxStepGoal)
		case s.Retries < 0 || s.Retries > MaxStepRetries:
			return bad("step %q: retries %d out of range 0..%d", s.ID, s.Retries, MaxStepRetries)
		case s.MaxSteps < 0 || s.MaxSteps > MaxStepsLimit:
			return bad("step %q: max_steps %d out of range 0..%d", s.ID, s.MaxSteps, MaxStepsLimit)
		case s.BudgetTokens < 0:
			return bad("step %q: budget_tokens cannot be negative", s.ID)
		}
		for j, d := range s.DependsOn {
			if _, ok := index[d]; !ok {
				return bad("step %q depends on unknown step %q", s.ID, d)
			}
			if d == s.ID {
				return bad("step %q depends on itself", s.ID)
			}
			if slices.Contains(s.DependsOn[:j], d) {
				return bad("step %q lists dependency %q twice", s.ID, d)
			}
		}
		for j, t := range s.Tools {
			if !slices.ContainsFunc(specs, func(sp keel.ToolSpec) bool { return sp.Name == t }) {
				return bad("step %q names unknown tool %q", s.ID, t)
			}
			if allowed != nil && !slices.Contains(allowed, t) {
				return bad("step %q names tool %q, which the run may not use", s.ID, t)
			}
			if slices.Contains(s.Tools[:j], t) {
				return bad("step %q lists tool %q twice", s.ID, t)
			}
		}
	}
	if cycle := findCycle(p, index); cycle != nil {
		return bad("the steps form a cycle: %s", strings.Join(cycle, " → "))
	}
	return nil
}

// findCycle returns the steps of a dependency cycle of p, the first
// repeated at the end, or nil.
func findCycle(p keel.Plan, index map[string]int) []string {
	const (
		unseen = iota
		onPath
		done
	)
	state := make([]int, len(p.Steps))
	var path []string
	var visit func(i int) []string
	visit = func(i int) []string {
		state[i] = onPath
		path = append(path, p.Steps[i].ID)
		for _, d := range p.Steps[i].DependsOn {
			j := index[d]
			switch state[j] {
			case onPath:
				start := slices.Index(path, d)
				return append(slices.Clone(path[start:]), d)
			case unseen:
				if c := visit(j); c != nil {
					return c
				}
			}
		}
		path = path[:len(path)-1]
		state[i] = done
		return nil
	}
	for i := range p.Steps {
		if state[i] == unseen {
			if c := visit(i); c != nil {
				return c
			}
		}
	}
	return nil
}

func clonePlan(p keel.Plan) keel.Plan {
	out := keel.Plan{Steps: make([]keel.PlanStep, len(p.Steps))}
	for i, s := range p.Steps {
		s.Tools = slices.Clone(s.Tools)
		s.DependsOn = slices.Clone(s.DependsOn)
		out.Steps[i] = s
	}
	return out
}

// create stores a new run. A DAG run is stored with its start and its
// plan (revision 0) in the same transaction, so that no crash can leave
// it without the plan it must resume from; an agent run with its start,
// when its tools are known without waiting (see Loading), which saves
// the run a commit. *run is then as stored, and the run's loop is told
// what was journaled.
func (e *Engine) create(ctx context.Context, run *keel.Run, plan *keel.Plan) (*created, error) {
	var evs []keel.Event
	fresh := &created{}
	switch {
	case plan != nil:
		for _, ev := range []struct {
			typ  keel.EventType
			data any
		}{
			{keel.EventRunStarted, keel.RunStartedData{Goal: run.Goal, Model: run.Model, Tools: planTools(*plan), MaxSteps: run.MaxSteps}},
			{keel.EventPlanProposed, keel.PlanData{Plan: *plan}},
		} {
			raw, err := json.Marshal(ev.data)
			if err != nil {
				return nil, fmt.Errorf("encode %s: %w", ev.typ, err)
			}
			evs = append(evs, keel.Event{Type: ev.typ, Time: e.cfg.Now(), Data: raw})
		}
	case run.KindOrAgent() == keel.KindAgent && !e.toolsLoading():
		fresh.started, fresh.specs = true, toolsFor(*run, e.cfg.Tools.Specs())
		raw, err := json.Marshal(startedData(*run, fresh.specs))
		if err != nil {
			return nil, fmt.Errorf("encode %s: %w", keel.EventRunStarted, err)
		}
		evs = append(evs, keel.Event{Type: keel.EventRunStarted, Time: e.cfg.Now(), Data: raw})
	default:
		return fresh, e.cfg.Store.CreateRun(ctx, *run)
	}
	e.mu.Lock()
	o := e.ordered(run.ID)
	e.mu.Unlock()
	stored, err := e.cfg.Store.CreateRunWith(ctx, *run, evs, &keel.RunUpdate{Status: keel.RunRunning})
	e.publishInOrder(run.ID, o, stored)
	if err != nil {
		return nil, err
	}
	last := stored[len(stored)-1]
	run.Status, run.LastSeq, run.UpdatedAt = keel.RunRunning, last.Seq, last.Time
	return fresh, nil
}

// toolsLoading reports whether the engine's Tools.Specs would wait.
func (e *Engine) toolsLoading() bool {
	l, ok := e.cfg.Tools.(Loading)
	return ok && l.Loading()
}

// planTools is every tool some step of plan may use, sorted.
func planTools(plan keel.Plan) []string {
	out := []string{}
	for _, s := range plan.Steps {
		for _, t := range s.Tools {
			if !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	slices.Sort(out)
	return out
}

// stepResult is a step that succeeded: the goal it had and its result.
type stepResult struct {
	goal   string
	result string
	run    keel.RunID
}

// flowState is where a plan or DAG run stands according to its journal.
type flowState struct {
	started    bool // run.started is journaled
	private    bool // a sub-agent read private data: so does the run
	lastSeq    int64
	modelSteps int                   // model.result events (planner and composer)
	pending    *keel.ModelResultData // a model.result no plan.proposed followed yet
	hasPlan    bool
	plan       keel.Plan // the plan in force, of revision revision
	revision   int
	attempts   map[string]int           // step ID → highest attempt started, across revisions
	tries      map[string]int           // step ID → attempts started under this revision
	running    map[string]keel.StepData // step ID → the sub-agent carrying it out now
	goals      map[keel.RunID]string    // sub-agent → the goal of the step it carries out
	succeeded  map[string]stepResult    // step ID → its latest success, across revisions
	failed     string                   // the first step of this revision that failed after its retries
	failErr    string
	children   []keel.RunID             // every sub-agent started, in order
	startedAt  map[keel.RunID]time.Time // sub-agent → when its step.started was journaled
}

func newFlowState() *flowState {
	return &flowState{attempts: map[string]int{}, tries: map[string]int{}, running: map[string]keel.StepData{},
		goals: map[keel.RunID]string{}, succeeded: map[string]stepResult{}, startedAt: map[keel.RunID]time.Time{}}
}

// restoreFlow rebuilds a plan or DAG run's state from its journal.
func (e *Engine) restoreFlow(ctx context.Context, id keel.RunID) (*flowState, error) {
	evs, err := e.cfg.Store.Events(ctx, id, 0)
	if err != nil {
		return nil, fmt.Errorf("read journal: %w", err)
	}
	st := newFlowState()
	for _, ev := range evs {
		if err := st.apply(ev); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// apply moves the state past one journaled event. It is the only place
// the state changes, live and on restore alike.
func (st *flowState) apply(ev keel.Event) error {
	st.lastSeq = ev.Seq
	decode := func(v any) error {
		if err := json.Unmarshal(ev.Data, v); err != nil {
			return fmt.Errorf("journal event %d: %w", ev.Seq, err)
		}
		return nil
	}
	switch ev.Type {
	case keel.EventRunStarted:
		st.started = true
	case keel.EventModelResult:
		var d keel.ModelResultData
		if err := decode(&d); err != nil {
			return err
		}
		st.modelSteps, st.pending = d.Step, &d
	case keel.EventPlanProposed:
		var d keel.PlanData
		if err := decode(&d); err != nil {
			return err
		}
		st.hasPlan, st.plan, st.revision, st.pending = true, d.Plan, d.Revision, nil
		st.tries, st.failed, st.failErr = map[string]int{}, "", ""
	case keel.EventStepStarted:
		var d keel.StepData
		if err := decode(&d); err != nil {
			return err
		}
		st.attempts[d.StepID] = max(st.attempts[d.StepID], d.Attempt)
		st.tries[d.StepID]++
		st.running[d.StepID] = d
		if s, ok := st.step(d.StepID); ok {
			st.goals[d.Run] = s.Goal
		}
		st.children = append(st.children, d.Run)
		st.startedAt[d.Run] = ev.Time
	case keel.EventStepFinished:
		var d keel.StepData
		if err := decode(&d); err != nil {
			return err
		}
		if st.running[d.StepID].Run == d.Run {
			delete(st.running, d.StepID)
		}
		st.private = st.private || d.Private
		if d.Status == keel.RunSucceeded {
			st.succeeded[d.StepID] = stepResult{goal: st.goals[d.Run], result: d.Result, run: d.Run}
			break
		}
		s, _ := st.step(d.StepID)
		if st.failed == "" && (d.Status == keel.RunCancelled || st.tries[d.StepID] > s.Retries) {
			st.failed, st.failErr = d.StepID, d.Error
		}
	}
	return nil
}

// step returns the step of the plan in force with the given ID.
func (st *flowState) step(id string) (keel.PlanStep, bool) {
	for _, s := range st.plan.Steps {
		if s.ID == id {
			return s, true
		}
	}
	return keel.PlanStep{}, false
}

// done reports whether step s of the plan in force has succeeded: under
// this revision, or under an earlier one with the same ID and goal.
func (st *flowState) done(s keel.PlanStep) bool {
	r, ok := st.succeeded[s.ID]
	return ok && r.goal == s.Goal
}

// ready returns the steps that may start now, in plan order, and whether
// every step of the plan has succeeded.
func (st *flowState) ready() (ready []keel.PlanStep, allDone bool) {
	allDone = true
	for _, s := range st.plan.Steps {
		if st.done(s) {
			continue
		}
		allDone = false
		if _, busy := st.running[s.ID]; busy {
			continue
		}
		deps := true
		for _, d := range s.DependsOn {
			if ds, _ := st.step(d); !st.done(ds) {
				deps = false
				break
			}
		}
		if deps {
			ready = append(ready, s)
		}
	}
	return ready, allDone
}

// flowRun carries what one execution of a parent's goroutine works with.
type flowRun struct {
	e    *Engine
	run  keel.Run
	st   *flowState
	wake chan struct{} // a sub-agent of the run ended
}

// appendEvent journals an event of the parent and applies it to its state.
func (f *flowRun) appendEvent(ctx context.Context, typ keel.EventType, data any, upd *keel.RunUpdate) error {
	ev, err := f.e.appendEvent(ctx, f.run.ID, typ, data, upd)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	return f.st.apply(ev)
}

// flow drives a plan or DAG run to an end, from what its journal holds.
// Like loop, it returns when the run ended, paused or was interrupted,
// having journaled exactly one event that says so.
func (e *Engine) flow(ctx context.Context, run keel.Run) {
	if _, replaying := e.cfg.Store.(*memStore); replaying {
		e.end(ctx, run.ID, errReplayFlow)
		return
	}
	log := e.log.With("run", run.ID, "kind", run.KindOrAgent())
	if !run.Policy.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadlineCause(ctx, run.Policy.Deadline, errDeadline)
		defer cancel()
	}
	f := &flowRun{e: e, run: run, wake: make(chan struct{}, 1)}
	prefix := string(run.ID) + "."
	unsub := e.Subscribe(func(ev keel.Event) {
		switch ev.Type {
		case keel.EventRunSucceeded, keel.EventRunFailed, keel.EventRunCancelled:
			if strings.HasPrefix(string(ev.RunID), prefix) {
				select {
				case f.wake <- struct{}{}:
				default:
				}
			}
		}
	})
	defer unsub()

	var err error
	if f.st, err = e.restoreFlow(ctx, run.ID); err != nil {
		log.Error("restore run", "err", err)
		e.end(ctx, run.ID, err)
		return
	}
	if f.st.private {
		f.run.Policy.Private = true
	}
	if err := f.begin(ctx); err != nil {
		log.Error("journal run start", "err", err)
		return
	}
	for _, d := range f.st.running {
		f.startStepSpan(ctx, d) // again: open while their sub-agents go on
	}
	result, stop, err := f.drive(ctx)
	switch {
	case stop:
		return // paused; its event is journaled
	case err == nil:
		e.end(ctx, run.ID, nil, result)
		return
	}
	if ctx.Err() != nil && !errors.Is(context.Cause(ctx), errShutdown) {
		// Cancelled, or past the deadline: the sub-agents stop too. On
		// shutdown they are interrupted with the parent, and resumed.
		f.stopChildren(ctx)
	}
	e.end(ctx, run.ID, err)
}

// begin journals run.started for a new run, run.resumed for one that
// goes on from its journal.
func (f *flowRun) begin(ctx context.Context) error {
	if !f.st.started {
		names := []string{}
		if f.run.Kind == keel.KindPlan {
			for _, s := range toolsFor(f.run, f.e.cfg.Tools.Specs()) {
				names = append(names, s.Name)
			}
		}
		return f.appendEvent(ctx, keel.EventRunStarted,
			keel.RunStartedData{Goal: f.run.Goal, Model: f.run.Model, Tools: names, MaxSteps: f.run.MaxSteps},
			&keel.RunUpdate{Status: keel.RunRunning})
	}
	cur, err := f.e.cfg.Store.GetRun(ctx, f.run.ID)
	if err != nil {
		return err
	}
	if cur.Status == keel.RunRunning {
		return nil // just started by Start (a DAG run's plan is journaled there)
	}
	return f.appendEvent(ctx, keel.EventRunResumed, keel.RunResumedData{FromSeq: f.st.lastSeq, Step: f.st.modelSteps},
		&keel.RunUpdate{Status: keel.RunRunning})
}

// drive runs the plan: it starts ready steps up to the concurrency limit,
// waits for sub-agents to end, retries and re-plans, and returns the
// run's result; stop true when the run paused.
func (f *flowRun) drive(ctx context.Context) (result string, stop bool, err error) {
	st, run := f.st, f.run
	for {
		if err := ctx.Err(); err != nil {
			return "", false, context.Cause(ctx)
		}
		if !st.hasPlan {
			if run.Kind != keel.KindPlan {
				return "", false, errors.New("the run has no plan: the daemon stopped before it was journaled; start it again")
			}
			if err := f.propose(ctx, ""); err != nil {
				return "", errors.Is(err, errPausedFlow), ignorePause(err)
			}
			continue
		}
		if err := f.reconcile(ctx); err != nil {
			return "", false, err
		}
		if st.failed != "" {
			why := fmt.Sprintf("step %q failed after %d attempt(s): %s", st.failed, st.tries[st.failed], st.failErr)
			if run.Kind != keel.KindPlan || st.revision >= f.e.cfg.MaxReplans {
				if run.Kind == keel.KindPlan {
					why += fmt.Sprintf(" (no re-plans left: %d made)", st.revision)
				}
				f.stopChildren(ctx)
				return "", false, errors.New(why)
			}
			if len(st.running) == 0 {
				// Every sibling has ended, so the planner sees all the results.
				if err := f.propose(ctx, why); err != nil {
					return "", errors.Is(err, errPausedFlow), ignorePause(err)
				}
				continue
			}
		} else {
			ready, allDone := st.ready()
			if allDone && len(st.running) == 0 {
				return f.answer(ctx)
			}
			free := f.e.cfg.MaxParallelSteps - len(st.running)
			if len(ready) > 0 && free > 0 {
				if f.e.paused(ctx, run.ID) {
					return "", true, nil
				}
				batch := ready[:min(free, len(ready))]
				started := 0
				for i, s := range batch {
					// What the parent's budget has left is shared among the
					// steps starting together.
					err := f.startStep(ctx, s, len(batch)-i)
					if errors.Is(err, errBudgetWait) {
						break // until a running sub-agent ends
					}
					if err != nil {
						return "", false, err
					}
					started++
				}
				if started > 0 {
					continue
				}
			}
		}
		select {
		case <-f.wake:
		case <-ctx.Done():
		}
	}
}

// startStep journals step.started and starts the sub-agent, with a
// share of 1/share of what the parent's budget has left (see
// childPolicy). It returns errBudgetWait, having journaled nothing, when
// the running sub-agents hold all of it.
func (f *flowRun) startStep(ctx context.Context, s keel.PlanStep, share int) error {
	policy, err := f.childPolicy(ctx, s, share)
	if err != nil {
		return err
	}
	attempt := f.st.attempts[s.ID] + 1
	d := keel.StepData{StepID: s.ID, Run: childRunID(f.run.ID, s.ID, attempt), Attempt: attempt}
	if err := f.appendEvent(ctx, keel.EventStepStarted, d, nil); err != nil {
		return err
	}
	f.startStepSpan(ctx, d)
	return f.startChild(ctx, s, d, policy)
}

// startChild creates and launches the sub-agent d names, unless it
// exists already (a parent resumed between the two), in which case the
// parent attaches to it: an interrupted child is resumed by Resume like
// every interrupted run, a waiting or paused one goes on when a person
// says so.
func (f *flowRun) startChild(ctx context.Context, s keel.PlanStep, d keel.StepData, policy keel.RunPolicy) error {
	maxSteps := s.MaxSteps
	if maxSteps == 0 {
		maxSteps = f.run.MaxSteps
	}
	now := f.e.cfg.Now()
	child := keel.Run{ID: d.Run, Kind: keel.KindAgent, Goal: f.childGoal(s), Model: f.run.Model, Status: keel.RunQueued,
		MaxSteps: maxSteps, Policy: policy, CreatedAt: now, UpdatedAt: now, ParentID: f.run.ID, ParentStep: s.ID}
	if err := f.e.cfg.Store.CreateRun(context.WithoutCancel(ctx), child); err != nil {
		if errors.Is(err, keel.ErrConflict) {
			return nil // it exists: attach
		}
		return fmt.Errorf("start the sub-agent of step %q: %w", s.ID, err)
	}
	if err := f.e.launch(child); err != nil {
		// Closing: the child stays queued; the next daemon marks it
		// interrupted and resumes it.
		return fmt.Errorf("start the sub-agent of step %q: %w", s.ID, err)
	}
	return nil
}

// errBudgetWait says a step cannot start yet: the running sub-agents
// were given all that the parent's budget has left. It starts when one of
// them ends and gives back what it did not spend.
var errBudgetWait = errors.New("the running sub-agents hold what is left of the run's budget")

// childPolicy is a sub-agent's policy: the parent's, with the step's tool
// subset (none when the step names none) and a budget taken from what the
// parent's budget has left, less what the running sub-agents may still
// spend: the step's own budget if it names one and it fits, else 1/share
// of that. So sub-agents running together never hold more than the
// parent has left. It returns errBudgetWait when nothing is left but
// running sub-agents hold some.
func (f *flowRun) childPolicy(ctx context.Context, s keel.PlanStep, share int) (keel.RunPolicy, error) {
	p := f.run.Policy
	p.Tools = append([]string{}, s.Tools...) // non-nil: an empty subset is no tools
	p.BudgetTokens, p.BudgetUSD = s.BudgetTokens, 0
	if f.run.Policy.BudgetTokens <= 0 && f.run.Policy.BudgetUSD <= 0 {
		return p, nil
	}
	share = max(share, 1)
	tok, usd := f.spent(ctx)
	heldTok, heldUSD, err := f.held(ctx)
	if err != nil {
		return p, err
	}
	if lim := f.run.Policy.BudgetTokens; lim > 0 {
		if lim-tok <= 0 {
			return p, fmt.Errorf("the run's token budget (%d) is spent; step %q cannot start", lim, s.ID)
		}
		left := lim - tok - heldTok
		if left <= 0 {
			return p, errBudgetWait
		}
		if s.BudgetTokens > 0 {
			p.BudgetTokens = min(s.BudgetTokens, left)
		} else {
			p.BudgetTokens = max(1, left/int64(share))
		}
	}
	if lim := f.run.Policy.BudgetUSD; lim > 0 {
		if usd >= lim {
			return p, fmt.Errorf("the run's budget of $%g is spent; step %q cannot start", lim, s.ID)
		}
		left := lim - usd - heldUSD
		if left <= 0 {
			return p, errBudgetWait
		}
		p.BudgetUSD = left / float64(share)
	}
	return p, nil
}

// held is what the running sub-agents may still spend: each one's budget
// less what it spent.
func (f *flowRun) held(ctx context.Context) (tokens int64, usd float64, err error) {
	for _, d := range f.st.running {
		child, err := f.e.cfg.Store.GetRun(ctx, d.Run)
		if errors.Is(err, keel.ErrNotFound) {
			continue // not created yet: it holds nothing
		}
		if err != nil {
			return 0, 0, err
		}
		if child.Status.Terminal() {
			continue
		}
		t, u := f.e.spent(ctx, d.Run)
		tokens += max(0, child.Policy.BudgetTokens-t)
		usd += max(0, child.Policy.BudgetUSD-u)
	}
	return tokens, usd, nil
}

// spent is what the parent's model calls and all its sub-agents spent.
func (f *flowRun) spent(ctx context.Context) (int64, float64) {
	tok, usd := f.e.spent(ctx, f.run.ID)
	for _, c := range f.st.children {
		t, u := f.e.spent(ctx, c)
		tok, usd = tok+t, usd+u
	}
	return tok, usd
}

// childGoal is a sub-agent's goal: its step's goal, the task it is part
// of, and the results of the steps it depends on.
func (f *flowRun) childGoal(s keel.PlanStep) string {
	var b strings.Builder
	b.WriteString(s.Goal)
	fmt.Fprintf(&b, "\n\n(This is step %q of a larger task: %s)", s.ID, clipText(f.run.Goal, maxStepGoal))
	if len(s.DependsOn) > 0 {
		b.WriteString("\n\nResults of the steps this one depends on:")
		for _, d := range s.DependsOn {
			fmt.Fprintf(&b, "\n\n[%s]\n%s", d, clipText(f.st.succeeded[d].result, maxDepResult))
		}
	}
	return b.String()
}

func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + " […]"
}

// reconcile journals step.finished for every running sub-agent that has
// ended, and starts again a sub-agent that a step.started names but that
// was never created (the daemon stopped between the two).
func (f *flowRun) reconcile(ctx context.Context) error {
	ids := make([]string, 0, len(f.st.running))
	for id := range f.st.running {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		d := f.st.running[id]
		child, err := f.e.cfg.Store.GetRun(ctx, d.Run)
		if errors.Is(err, keel.ErrNotFound) {
			s, ok := f.st.step(id)
			if !ok {
				return fmt.Errorf("step %q of sub-agent %s is not in the plan", id, d.Run)
			}
			policy, err := f.childPolicy(ctx, s, 1)
			if errors.Is(err, errBudgetWait) {
				continue // until a running sub-agent ends
			}
			if err != nil {
				return err
			}
			if err := f.startChild(ctx, s, d, policy); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		if !child.Status.Terminal() {
			continue
		}
		d.Status, d.Result, d.Error = child.Status, child.Result, child.Error
		if d.Private, err = f.e.journalPrivate(ctx, child.ID); err != nil {
			return err
		}
		if err := f.appendEvent(ctx, keel.EventStepFinished, d, nil); err != nil {
			return err
		}
		f.endStepSpan(ctx, d)
		if d.Private {
			f.run.Policy.Private = true // its synthesis and later sub-agents too
		}
	}
	return nil
}

// stopChildren cancels the running sub-agents and waits, a bounded time,
// for them to record their ending, which it journals as step.finished.
func (f *flowRun) stopChildren(ctx context.Context) {
	if len(f.st.running) == 0 {
		return
	}
	bg := context.WithoutCancel(ctx)
	for _, d := range f.st.running {
		if _, err := f.e.Cancel(bg, d.Run); err != nil && !errors.Is(err, keel.ErrConflict) && !errors.Is(err, keel.ErrNotFound) {
			f.e.log.Warn("cancel sub-agent", "run", f.run.ID, "child", d.Run, "err", err)
		}
	}
	t := time.NewTimer(childCancelWait)
	defer t.Stop()
	for len(f.st.running) > 0 {
		n := len(f.st.running)
		if err := f.reconcile(bg); err != nil {
			f.e.log.Warn("record sub-agent endings", "run", f.run.ID, "err", err)
			return
		}
		if len(f.st.running) == 0 {
			return
		}
		if len(f.st.running) < n {
			continue
		}
		select {
		case <-f.wake:
		case <-t.C:
			f.e.log.Warn("sub-agents did not end in time after cancel", "run", f.run.ID, "left", len(f.st.running))
			return
		}
	}
}

// cancelChildren cancels the sub-agents of a plan or DAG run that nothing
// runs (paused, or interrupted): Cancel calls it after cancelling such a
// run, whose goroutine is not there to do it.
func (e *Engine) cancelChildren(ctx context.Context, id keel.RunID) {
	st, err := e.restoreFlow(ctx, id)
	if err != nil {
		e.log.Warn("cancel sub-agents", "run", id, "err", err)
		return
	}
	for _, d := range st.running {
		if _, err := e.Cancel(ctx, d.Run); err != nil && !errors.Is(err, keel.ErrConflict) && !errors.Is(err, keel.ErrNotFound) {
			e.log.Warn("cancel sub-agent", "run", id, "child", d.Run, "err", err)
		}
	}
}

// answer is the run's result once every step succeeded: for a DAG run the
// results of its sinks (the steps nothing depends on), labelled by step
// ID; for a plan run, one more model step composes it from all results.
func (f *flowRun) answer(ctx context.Context) (string, bool, error) {
	if f.run.Kind != keel.KindPlan {
		var parts []string
		for _, s := range f.st.plan.Steps {
			if !slices.ContainsFunc(f.st.plan.Steps, func(o keel.PlanStep) bool { return slices.Contains(o.DependsOn, s.ID) }) {
				parts = append(parts, fmt.Sprintf("[%s]\n%s", s.ID, f.st.succeeded[s.ID].result))
			}
		}
		return strings.Join(parts, "\n\n"), false, nil
	}
	if p := f.st.pending; p != nil {
		return p.Content, false, nil // composed before the daemon stopped
	}
	if f.e.paused(ctx, f.run.ID) {
		return "", true, nil
	}
	msgs := []models.Message{
		{Role: models.RoleSystem, Content: composePrompt},
		{Role: models.RoleUser, Content: "Goal: " + f.run.Goal + "\n\n" + f.resultsText(), Private: f.run.Policy.Private},
	}
	resp, err := f.e.modelStep(ctx, f.run, f.st.modelSteps+1, models.ChatRequest{Model: f.run.Model, Messages: msgs,
		AllowCloud: f.run.Policy.AllowCloud, Private: f.run.Policy.Private, Budget: f.budget(ctx)}, nil, false)
	if err != nil {
		return "", false, fmt.Errorf("compose the answer: %w", err)
	}
	return resp.Message.Content, false, nil
}

// resultsText lists the results of the plan's steps that succeeded.
func (f *flowRun) resultsText() string {
	var b strings.Builder
	b.WriteString("Results of the steps:")
	for _, s := range f.st.plan.Steps {
		if f.st.done(s) {
			fmt.Fprintf(&b, "\n\n[%s] %s\n%s", s.ID, s.Goal, clipText(f.st.succeeded[s.ID].result, maxDepResult))
		}
	}
	return b.String()
}

func (f *flowRun) budget(ctx context.Context) *models.Budget {
	tok, usd := f.spent(ctx)
	return models.NewBudget("run", models.Limits{Tokens: f.run.Policy.BudgetTokens, CostUSD: f.run.Policy.BudgetUSD}, tok, usd)
}

const plannerPrompt = "You are the planner of a keel run. Break the goal into a small plan of steps. " +
	"Each step is carried out by a separate agent that sees only its own goal, the results of the steps it depends on, " +
	"and the tools you list for it (none when you list none). Steps that do not depend on each other run in parallel. " +
	"Give each step a short id (letters, digits, '-' or '_'), a goal that says exactly what to do and what to report, " +
	"the tools it needs, and the ids of the steps whose results it needs in depends_on. Reply with only the JSON plan."

const composePrompt = "You write the final answer of a keel run from the results of the steps that carried it out. " +
	"Answer the goal directly, using the results; do not describe the steps."

// propose asks the planner for a plan (why empty) or a revised plan after
// a failed step (why says which and how), journals the accepted reply as
// a model.result and the plan as plan.proposed. A reply journaled before
// the daemon stopped is used instead of asking again.
func (f *flowRun) propose(ctx context.Context, why string) error {
	specs := toolsFor(f.run, f.e.cfg.Tools.Specs())
	revision := 0
	if f.st.hasPlan {
		revision = f.st.revision + 1
	}
	var plan keel.Plan
	if p := f.st.pending; p != nil {
		if err := json.Unmarshal([]byte(p.Content), &plan); err != nil {
			return fmt.Errorf("the journaled plan of model step %d: %w", p.Step, err)
		}
		if err := validatePlan(plan, f.e.cfg.Tools.Specs(), f.run.Policy.Tools); err != nil {
			return fmt.Errorf("the journaled plan of model step %d: %w", p.Step, err)
		}
	} else {
		if f.e.paused(ctx, f.run.ID) {
			return errPausedFlow
		}
		var err error
		if plan, err = f.askPlanner(ctx, specs, why); err != nil {
			return err
		}
	}
	return f.appendEvent(ctx, keel.EventPlanProposed, keel.PlanData{Plan: plan, Revision: revision, Reason: why}, nil)
}

// errPausedFlow is not an error: the run paused before a planner step.
var errPausedFlow = errors.New("paused")

func ignorePause(err error) error {
	if errors.Is(err, errPausedFlow) {
		return nil
	}
	return err
}

// askPlanner makes one journaled model step whose reply is a valid plan.
func (f *flowRun) askPlanner(ctx context.Context, specs []keel.ToolSpec, why string) (keel.Plan, error) {
	var catalog strings.Builder
	if len(specs) == 0 {
		catalog.WriteString("\n\nNo tools are available: every step works from its goal and its dependencies' results.")
	} else {
		catalog.WriteString("\n\nTools the steps may use:")
		for _, s := range specs {
			fmt.Fprintf(&catalog, "\n- %s: %s", s.Name, s.Description)
		}
	}
	private := f.run.Policy.Private
	msgs := []models.Message{
		{Role: models.RoleSystem, Content: plannerPrompt + fmt.Sprintf(" Use at most %d steps.", MaxPlanSteps)},
		{Role: models.RoleUser, Content: "Goal: " + f.run.Goal + catalog.String(), Private: private},
	}
	if why != "" {
		prev, _ := json.Marshal(f.st.plan)
		msgs = append(msgs, models.Message{Role: models.RoleUser, Private: private, Content: fmt.Sprintf(
			"The plan so far (revision %d) was:\n%s\n\n%s\n\nThe run stopped at: %s.\n\n"+
				"Propose a revised plan for the whole goal. A step whose id and goal are exactly those of a step that succeeded "+
				"is not run again: its result is reused.", f.st.revision, prev, f.resultsText(), why)})
	}
	schemaJSON := planSchema(specs)
	step := f.st.modelSteps + 1
	chat := &spanChatter{f: f, step: step}
	req := models.ChatRequest{Model: f.run.Model, Messages: msgs, AllowCloud: f.run.Policy.AllowCloud, Private: private, Budget: f.budget(ctx)}
	for attempt := 0; ; attempt++ {
		res, err := models.Structured(ctx, chat, req, schemaJSON, models.DefaultRepairs)
		if err != nil {
			return keel.Plan{}, fmt.Errorf("planner: model %s: %w", f.run.Model, err)
		}
		var plan keel.Plan
		problem := ""
		if err := json.Unmarshal(res.Value, &plan); err != nil {
			problem = err.Error()
		} else if err := validatePlan(plan, f.e.cfg.Tools.Specs(), f.run.Policy.Tools); err != nil {
			problem = strings.TrimSuffix(err.Error(), ": "+keel.ErrInvalid.Error())
		}
		if problem == "" {
			// The accepted reply is journaled before it is used.
			if err := f.appendEvent(ctx, keel.EventModelResult, keel.ModelResultData{Step: step, Model: res.Response.Model,
				Content: string(res.Value), PromptTokens: res.Usage.PromptTokens, CompletionTokens: res.Usage.CompletionTokens,
				DurationMS: chat.took.Milliseconds()}, nil); err != nil {
				return keel.Plan{}, err
			}
			return plan, nil
		}
		if attempt >= planRepairs {
			return keel.Plan{}, fmt.Errorf("planner: %d plans were not valid; the last: %s", attempt+1, problem)
		}
		req.Messages = append(slices.Clone(req.Messages),
			models.Message{Role: models.RoleAssistant, Content: string(res.Value)},
			models.Message{Role: models.RoleUser, Content: "That plan is not valid: " + problem + ". Reply again with a corrected plan, only JSON."})
	}
}

// stepSpan is the span of the plan step attempt d: the parent of its
// sub-agent's root span.
func (f *flowRun) stepSpan(d keel.StepData) keel.Span {
	return keel.Span{ID: planStepSpanID(f.run.ID, d.Run), RunID: f.run.ID, ParentID: rootSpanID(f.run.ID), Kind: keel.SpanStep,
		Name: d.StepID, Start: f.st.startedAt[d.Run], Attrs: planStepAttrs(d)}
}

// startStepSpan opens the span of plan step attempt d, or opens it again
// when the run resumes with its sub-agent still going.
func (f *flowRun) startStepSpan(ctx context.Context, d keel.StepData) {
	if err := f.e.cfg.Store.StartSpan(context.WithoutCancel(ctx), f.stepSpan(d)); err != nil {
		f.e.log.Warn("start a step span", "run", f.run.ID, "err", err)
	}
}

// endStepSpan closes the span of plan step attempt d, which ended as its
// sub-agent did.
func (f *flowRun) endStepSpan(ctx context.Context, d keel.StepData) {
	sp := f.stepSpan(d)
	sp.Status, sp.Duration = keel.SpanOK, max(0, f.e.cfg.Now().Sub(sp.Start))
	if d.Status != keel.RunSucceeded {
		sp.Status, sp.Error = keel.SpanError, string(d.Status)
		if d.Error != "" {
			sp.Error += ": " + d.Error
		}
	}
	if err := f.e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), sp); err != nil {
		f.e.log.Warn("finish a step span", "run", f.run.ID, "err", err)
	}
}

// spanChatter makes each of the planner's model calls a trace span, so
// what it spends counts against the run's budget across restarts. The
// accepted reply is journaled by askPlanner, once.
type spanChatter struct {
	f    *flowRun
	step int
	took time.Duration
}

func (c *spanChatter) Chat(ctx context.Context, req models.ChatRequest, _ func(models.Delta)) (models.ChatResponse, error) {
	e, run := c.f.e, c.f.run
	sp := e.newSpan(run.ID, keel.SpanModelCall, run.Model, c.step)
	if err := e.cfg.Store.StartSpan(context.WithoutCancel(ctx), sp); err != nil {
		return models.ChatResponse{}, fmt.Errorf("journal: %w", err)
	}
	start := time.Now()
	resp, err := e.cfg.Model.Chat(ctx, req, nil)
	sp.Duration, sp.Status = time.Since(start), keel.SpanOK
	c.took += sp.Duration
	if err != nil {
		sp.Status, sp.Error = keel.SpanError, err.Error()
	}
	sp.PromptTokens, sp.CompletionTokens = resp.Usage.PromptTokens, resp.Usage.CompletionTokens
	sp.Provider, sp.CostUSD, sp.TTFT, sp.Retries, sp.FinishReason = resp.Meta.Provider, resp.Meta.CostUSD, resp.Meta.FirstByte, resp.Meta.Retries, resp.FinishReason
	e.modelCallInfo(run.ID, &sp, req, resp)
	if resp.Model != "" && resp.Model != sp.Name {
		sp.Name = resp.Model
	}
	// No event records what a planner call spent: its span does, so it
	// commits with the next write.
	if ferr := e.cfg.Store.FinishSpanWithNext(context.WithoutCancel(ctx), sp); ferr != nil {
		return models.ChatResponse{}, fmt.Errorf("journal: %w", ferr)
	}
	return resp, err
}

// planSchema is the JSON Schema of a keel.Plan the planner must reply
// with; a step's tools are limited to those the run may use.
func planSchema(specs []keel.ToolSpec) json.RawMessage {
	tools := map[string]any{"type": "array", "maxItems": 0}
	if len(specs) > 0 {
		names := make([]string, len(specs))
		for i, s := range specs {
			names[i] = s.Name
		}
		tools = map[string]any{"type": "array", "uniqueItems": true, "items": map[string]any{"type": "string", "enum": names}}
	}
	step := map[string]any{
		"type":                 "object",
		"additionalProperties": false,
		"required":             []string{"id", "goal"},
		"properties": map[string]any{
			"id":            map[string]any{"type": "string", "pattern": stepIDPattern.String()},
			"goal":          map[string]any{"type": "string", "minLength": 1, "maxLength": maxStepGoal},
			"tools":         tools,
			"depends_on":    map[string]any{"type": "array", "uniqueItems": true, "items": map[string]any{"type": "string"}},
			"retries":       map[string]any{"type": "integer", "minimum": 0, "maximum": MaxStepRetries},
			"max_steps":     map[string]any{"type": "integer", "minimum": 0, "maximum": MaxStepsLimit},
			"budget_tokens": map[string]any{"type": "integer", "minimum": 0},
		},
	}
	b, _ := json.Marshal(map[string]any{
		"type":                 "object",
		"additionalProperties": false,
		"required":             []string{"steps"},
		"properties": map[string]any{
			"steps": map[string]any{"type": "array", "minItems": 1, "maxItems": MaxPlanSteps, "items": step},
		},
	})
	return b
}
