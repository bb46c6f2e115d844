package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/policy"
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

// childRunID is the ID of the sub-agent that makes attempt of step: the
// same on every restart, so a parent that resumes finds the child it
// started instead of starting a second one.
func childRunID(parent keel.RunID, step string, attempt int) keel.RunID {
	return keel.RunID(string(parent) + "." + step + "." + strconv.Itoa(attempt))
}

// flowRun carries what one execution of a parent's goroutine works with.
type flowRun struct {
	e    *Engine
	run  keel.Run
	st   *flowState
	wake chan struct{} // a sub-agent of the run ended, or a waiter learned something
	// waiters are the hand-offs under way (place.go).
	waiters *waiters
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
	log := e.log.With(logkey.Run, run.ID, logkey.Kind, run.KindOrAgent())
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
	f.startWaiters(ctx)
	defer f.stopWaiters()

	var err error
	if f.st, err = e.restoreFlow(ctx, run.ID); err != nil {
		log.Error("restore run", logkey.Err, err)
		e.end(ctx, run.ID, err)
		return
	}
	if err := f.begin(ctx); err != nil {
		log.Error("journal run start", logkey.Err, err)
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
			for _, s := range f.e.toolsFor(ctx, f.run, f.e.cfg.Tools.Specs(ctx)) {
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
	return f.launchStep(ctx, s, d, policy)
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
		MaxSteps: maxSteps, Policy: policy, CreatedAt: now, UpdatedAt: now, ParentID: f.run.ID, ParentStep: s.ID, Workspace: f.run.Workspace}
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
		if h := f.st.handed[d.Run]; h != nil {
			if err := f.reconcileRemote(ctx, d, h); err != nil {
				return err
			}
			continue
		}
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
			if err := f.launchStep(ctx, s, d, policy); err != nil {
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
		// Its result derives from its context: the parent's gains its
		// labels.
		labels, err := f.e.ContextLabels(ctx, child.ID)
		if err != nil {
			return err
		}
		d.Labels, d.Private = labels, slices.Contains(labels, string(policy.Private))
		if err := f.appendEvent(ctx, keel.EventStepFinished, d, nil); err != nil {
			return err
		}
		f.endStepSpan(ctx, d)
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
	// A step handed off ends here, and its run there is asked to stop
	// (step.cancelled_elsewhere).
	for _, d := range f.st.running {
		if h := f.st.handed[d.Run]; h != nil {
			f.cancelRemote(bg, d, h)
			d.Status, d.Error = keel.RunCancelled, "cancelled here; its run on "+h.data.Placement.Env+" was asked to stop"
			if err := f.appendEvent(bg, keel.EventStepFinished, d, nil); err != nil {
				f.e.log.Warn("record a hand-off's end", logkey.Run, f.run.ID, logkey.Err, err)
				return
			}
			f.endHandOffSpan(bg, h, d)
			f.endStepSpan(bg, d)
		}
	}
	for _, d := range f.st.running {
		if _, err := f.e.Cancel(bg, d.Run); err != nil && !errors.Is(err, keel.ErrConflict) && !errors.Is(err, keel.ErrNotFound) {
			f.e.log.Warn("cancel sub-agent", logkey.Run, f.run.ID, logkey.Child, d.Run, logkey.Err, err)
		}
	}
	t := time.NewTimer(childCancelWait)
	defer t.Stop()
	for len(f.st.running) > 0 {
		n := len(f.st.running)
		if err := f.reconcile(bg); err != nil {
			f.e.log.Warn("record sub-agent endings", logkey.Run, f.run.ID, logkey.Err, err)
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
			f.e.log.Warn("sub-agents did not end in time after cancel", logkey.Run, f.run.ID, logkey.Left, len(f.st.running))
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
		e.log.Warn("cancel sub-agents", logkey.Run, id, logkey.Err, err)
		return
	}
	for _, d := range st.running {
		if h := st.handed[d.Run]; h != nil {
			// Its run elsewhere is asked to stop; the parent's journal
			// is closed, so nothing is journaled.
			if h.done == nil && e.cfg.Placer != nil {
				cctx, cancel := context.WithTimeout(ctx, cancelRemoteWait)
				if _, err := e.cfg.Placer.Cancel(cctx, h.data.Placement.Env, h.data.Run, h.remote); err != nil {
					e.log.Warn("cancel a step's run elsewhere", logkey.Run, id, logkey.Child, d.Run, logkey.Edge, h.data.Placement.Env, logkey.Err, err)
				}
				cancel()
			}
			continue
		}
		if _, err := e.Cancel(ctx, d.Run); err != nil && !errors.Is(err, keel.ErrConflict) && !errors.Is(err, keel.ErrNotFound) {
			e.log.Warn("cancel sub-agent", logkey.Run, id, logkey.Child, d.Run, logkey.Err, err)
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
	// The goal and the steps' results carry the context's labels.
	labels := labelNames(f.e.labelsNow(ctx, f.run))
	msgs := []models.Message{
		{Role: models.RoleSystem, Content: composePrompt},
		{Role: models.RoleUser, Content: "Goal: " + f.run.Goal + "\n\n" + f.resultsText(), Labels: labels},
	}
	resp, err := f.e.modelStep(ctx, f.run, f.st.modelSteps+1, models.ChatRequest{Model: f.run.Model, Messages: msgs,
		AllowCloud: f.run.Policy.AllowCloud, Labels: labels, Budget: f.budget(ctx)}, nil, false)
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
		f.e.log.Warn("start a step span", logkey.Run, f.run.ID, logkey.Err, err)
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
		f.e.log.Warn("finish a step span", logkey.Run, f.run.ID, logkey.Err, err)
	}
}
