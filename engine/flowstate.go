package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/keel-runtime/keel"
)

// A plan or DAG run's state: what its journal says, rebuilt by replaying
// the journal through flowState.apply.

// stepResult is a step that succeeded: the goal it had and its result.
type stepResult struct {
	goal   string
	result string
	run    keel.RunID
}

// flowState is where a plan or DAG run stands according to its journal.
type flowState struct {
	started    bool // run.started is journaled
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
	handed     map[keel.RunID]*handoff  // step attempt → its hand-off to another environment (place.go)
	handedAt   map[keel.RunID]time.Time // step attempt → when its step.handed_off was journaled
}

func newFlowState() *flowState {
	return &flowState{attempts: map[string]int{}, tries: map[string]int{}, running: map[string]keel.StepData{},
		goals: map[keel.RunID]string{}, succeeded: map[string]stepResult{}, startedAt: map[keel.RunID]time.Time{},
		handed: map[keel.RunID]*handoff{}, handedAt: map[keel.RunID]time.Time{}}
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
	case keel.EventStepHandedOff:
		var d keel.StepHandedOffData
		if err := decode(&d); err != nil {
			return err
		}
		st.handed[d.Run] = &handoff{data: d}
		st.handedAt[d.Run] = ev.Time
	case keel.EventStepAccepted:
		var d keel.StepAcceptedData
		if err := decode(&d); err != nil {
			return err
		}
		if h := st.handed[d.Run]; h != nil {
			h.remote = d.RemoteRun
		}
	case keel.EventStepCompletedElsewhere:
		var d keel.StepCompletedElsewhereData
		if err := decode(&d); err != nil {
			return err
		}
		if h := st.handed[d.Run]; h != nil {
			h.done = &d
		}
	case keel.EventStepFinished:
		var d keel.StepData
		if err := decode(&d); err != nil {
			return err
		}
		if st.running[d.StepID].Run == d.Run {
			delete(st.running, d.StepID)
		}
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
