package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
)

// Plan steps run elsewhere: when a step needs what this environment does
// not have (a tool), and Config.Placer names another environment that
// declares it, the step's attempt is handed off there instead of
// becoming a local sub-agent (docs/cloud.md, "Plans that cross
// environments").
//
// The parent's journal holds the hand-off as it holds a local step:
// step.started, then step.handed_off (where, why, the trace context),
// step.accepted (the run there), step.completed_elsewhere (how it ended,
// as far as its labels let it cross) and step.finished, which the plan
// goes on from as after a local sub-agent. A goroutine of the parent
// (a waiter) asks and waits; the parent's goroutine journals what it
// learns. A parent resumed after a crash finds the hand-off in its
// journal and waits again: it asks the other side again with the same
// key, which names the same run there, so the step runs once.

// Placer places plan steps in other environments (Config.Placer). Its
// methods are called from the run's goroutines and must be safe for
// concurrent use.
type Placer interface {
	// Place decides where a step that needs need, which this
	// environment does not meet, runs: another environment that declares
	// it. Its error says what no environment offers.
	Place(ctx context.Context, need keel.StepNeed) (keel.Placement, error)
	// HandOff asks the environment env to run the step and returns the
	// run that carries it out there: the same run for the same h.Key,
	// however many times it is asked. An error wrapping
	// keel.ErrUnavailable means the step did not start there and will
	// not (refused, or no one received it); after any other error the
	// outcome is unknown and the engine asks again.
	HandOff(ctx context.Context, env string, h keel.HandOff) (keel.RunID, error)
	// Await waits until run, env's run of a step handed off, ends, and
	// returns how, as far as it may cross, with its spans under
	// parentSpan. An error (but ctx's) is tried again.
	Await(ctx context.Context, env string, run keel.RunID, parentSpan string) (keel.StepOutcome, error)
	// Cancel asks env to cancel the step handed off under key
	// (HandOff.Key) by this environment, whose run there is run, or ""
	// when its acceptance is not known (an offer may be under way): env
	// then cancels the run of key if it has one, and starts none for key
	// from then on. It returns the run's status there: cancelled, or how
	// it had ended already (asking again is harmless).
	Cancel(ctx context.Context, env string, key, run keel.RunID) (keel.RunStatus, error)
}

// handoff is a step attempt handed off, as the parent's journal says.
type handoff struct {
	data   keel.StepHandedOffData
	remote keel.RunID                       // from step.accepted
	done   *keel.StepCompletedElsewhereData // from step.completed_elsewhere
}

// remoteNote is what a waiter learned for the parent's goroutine to
// journal: the run accepted, how it ended, or why it never started.
type remoteNote struct {
	accepted keel.RunID
	outcome  *keel.StepOutcome
	failed   error
}

// waiters are a parent's hand-offs under way: one goroutine each,
// started by the parent's goroutine and stopped before it returns.
type waiters struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	live  map[keel.RunID]bool
	notes map[keel.RunID][]remoteNote
}

// retryPause is how long a waiter waits before asking again after an
// error that leaves the outcome unknown.
const retryPause = time.Second

// localTools is the set of tools this environment runs.
func (e *Engine) localTools(ctx context.Context) map[string]bool {
	out := map[string]bool{}
	for _, s := range e.cfg.Tools.Specs(ctx) {
		out[s.Name] = true
	}
	return out
}

// missing is the tools of step s this environment does not run.
func missing(s keel.PlanStep, local map[string]bool) []string {
	var out []string
	for _, t := range s.Tools {
		if !local[t] {
			out = append(out, t)
		}
	}
	return out
}

// placeable checks, when a DAG's plan or a planner's names tools this
// environment does not run, that some environment declares each step's:
// it returns the tools to count as known (nil without a Placer, or
// when every tool is here) or an error naming what no environment
// offers.
func (e *Engine) placeable(ctx context.Context, p keel.Plan, specs []keel.ToolSpec) ([]string, error) {
	if e.cfg.Placer == nil {
		return nil, nil
	}
	local := map[string]bool{}
	for _, s := range specs {
		local[s.Name] = true
	}
	var known []string
	for _, s := range p.Steps {
		if len(missing(s, local)) == 0 {
			continue
		}
		if _, err := e.cfg.Placer.Place(ctx, keel.StepNeed{Tools: s.Tools}); err != nil {
			return nil, fmt.Errorf("plan: step %q: %v: %w", s.ID, err, keel.ErrInvalid)
		}
		known = append(known, s.Tools...)
	}
	return known, nil
}

// launchStep starts step s's attempt d: a local sub-agent, or, when this
// environment lacks a tool the step needs and a Placer is set, a hand-off
// to the environment the Placer names. A step no environment can run
// ends at once, failed with what was missing.
func (f *flowRun) launchStep(ctx context.Context, s keel.PlanStep, d keel.StepData, policy keel.RunPolicy) error {
	if f.e.cfg.Placer == nil || len(s.Tools) == 0 {
		return f.startChild(ctx, s, d, policy)
	}
	miss := missing(s, f.e.localTools(ctx))
	if len(miss) == 0 {
		return f.startChild(ctx, s, d, policy)
	}
	need := keel.StepNeed{Tools: slices.Clone(s.Tools), Labels: policy.Labels}
	pl, err := f.e.cfg.Placer.Place(ctx, need)
	if err != nil {
		d.Status, d.Error = keel.RunFailed, fmt.Sprintf("no environment can run it (this one lacks %v): %v", miss, err)
		if err := f.appendEvent(ctx, keel.EventStepFinished, d, nil); err != nil {
			return err
		}
		f.endStepSpan(ctx, d)
		return nil
	}
	hd := keel.StepHandedOffData{StepID: s.ID, Run: d.Run, Attempt: d.Attempt, Placement: pl, Need: need,
		TraceParent: keel.TraceParent(f.top(ctx), handOffSpanID(f.run.ID, d.Run))}
	if err := f.appendEvent(ctx, keel.EventStepHandedOff, hd, nil); err != nil {
		return err
	}
	f.startHandOffSpan(ctx, hd)
	f.ensureWaiter(d, f.st.handed[d.Run], s, policy)
	return nil
}

// top is the run's top-level run, whose trace its spans are in.
func (f *flowRun) top(ctx context.Context) keel.RunID {
	id, cur := f.run.ID, f.run
	for i := 0; cur.ParentID != "" && i < 32; i++ {
		id = cur.ParentID
		next, err := f.e.cfg.Store.GetRun(ctx, cur.ParentID)
		if err != nil {
			break
		}
		cur = next
	}
	return id
}

// reconcileRemote moves the hand-off h of running step attempt d on:
// it journals what its waiter learned (accepted, ended, never started),
// journals step.finished once the step ended there, and makes sure a
// waiter asks and waits (again, after a restart).
func (f *flowRun) reconcileRemote(ctx context.Context, d keel.StepData, h *handoff) error {
	for _, n := range f.takeNotes(d.Run) {
		switch {
		case n.failed != nil:
			d.Status, d.Error = keel.RunFailed, fmt.Sprintf("handed off to %s, which did not run it: %v", h.data.Placement.Env, n.failed)
			if err := f.appendEvent(ctx, keel.EventStepFinished, d, nil); err != nil {
				return err
			}
			f.endHandOffSpan(ctx, h, d)
			f.endStepSpan(ctx, d)
			return nil
		case n.accepted != "" && h.remote == "":
			if err := f.appendEvent(ctx, keel.EventStepAccepted, keel.StepAcceptedData{StepID: d.StepID, Run: d.Run,
				Env: h.data.Placement.Env, RemoteRun: n.accepted}, nil); err != nil {
				return err
			}
		case n.outcome != nil && h.done == nil:
			o := n.outcome
			f.importSpans(ctx, h, o.Spans)
			if err := f.appendEvent(ctx, keel.EventStepCompletedElsewhere, keel.StepCompletedElsewhereData{StepID: d.StepID, Run: d.Run,
				Env: h.data.Placement.Env, RemoteRun: h.remote, Status: o.Status, Result: o.Result, Error: o.Error,
				Withheld: o.Withheld, Labels: o.Labels, Spans: len(o.Spans), Tokens: o.Tokens, CostUSD: o.CostUSD}, nil); err != nil {
				return err
			}
		}
	}
	if c := h.done; c != nil {
		// What crossed brings its labels into the parent's context.
		d.Status, d.Result, d.Error, d.Labels = c.Status, c.Result, c.Error, c.Labels
		d.Private = slices.Contains(c.Labels, keel.LabelPrivate)
		if c.Withheld && c.Status == keel.RunSucceeded {
			d.Result = fmt.Sprintf("(step %q ran on %s; its result may not leave it)", d.StepID, c.Env)
		}
		if err := f.appendEvent(ctx, keel.EventStepFinished, d, nil); err != nil {
			return err
		}
		f.endHandOffSpan(ctx, h, d)
		f.endStepSpan(ctx, d)
		return nil
	}
	if s, ok := f.st.step(d.StepID); ok {
		policy, err := f.childPolicy(ctx, s, 1)
		if err != nil && !errors.Is(err, errBudgetWait) {
			return err
		}
		policy.Labels = h.data.Need.Labels // as handed off
		f.ensureWaiter(d, h, s, policy)
	}
	return nil
}

// ensureWaiter starts the waiter of hand-off h unless it runs.
func (f *flowRun) ensureWaiter(d keel.StepData, h *handoff, s keel.PlanStep, policy keel.RunPolicy) {
	w := f.waiters
	w.mu.Lock()
	if w.live[d.Run] || w.ctx.Err() != nil {
		w.mu.Unlock()
		return
	}
	w.live[d.Run] = true
	w.mu.Unlock()
	maxSteps := s.MaxSteps
	if maxSteps == 0 {
		maxSteps = f.run.MaxSteps
	}
	req := keel.HandOff{Key: d.Run, Goal: f.childGoal(s), Model: f.run.Model, MaxSteps: maxSteps, Tools: slices.Clone(s.Tools),
		Need: h.data.Need, TraceParent: h.data.TraceParent, ParentSpan: handOffSpanID(f.run.ID, d.Run)}
	env, remote := h.data.Placement.Env, h.remote
	w.wg.Go(func() { f.await(w.ctx, env, remote, req) })
}

// await is a waiter: it hands req off to env unless the journal says
// env accepted it (remote), then waits for the run there to end, and
// posts what it learns for the parent's goroutine.
func (f *flowRun) await(ctx context.Context, env string, remote keel.RunID, req keel.HandOff) {
	p, log := f.e.cfg.Placer, f.e.log.With(logkey.Run, f.run.ID, logkey.Child, req.Key, logkey.Edge, env)
	for remote == "" {
		r, err := p.HandOff(ctx, env, req)
		switch {
		case err == nil:
			remote = r
			f.post(req.Key, remoteNote{accepted: r})
		case ctx.Err() != nil:
			return
		case errors.Is(err, keel.ErrUnavailable):
			f.post(req.Key, remoteNote{failed: err})
			return
		default:
			log.Warn("hand-off: no answer; asking again", logkey.Err, err)
			if f.e.cfg.Sleep(ctx, retryPause) != nil {
				return
			}
		}
	}
	for {
		o, err := p.Await(ctx, env, remote, req.ParentSpan)
		if err == nil {
			f.post(req.Key, remoteNote{outcome: &o})
			return
		}
		if ctx.Err() != nil {
			return
		}
		log.Warn("hand-off: waiting for the step's end", logkey.Err, err)
		if f.e.cfg.Sleep(ctx, retryPause) != nil {
			return
		}
	}
}

// post hands a waiter's note to the parent's goroutine and wakes it.
func (f *flowRun) post(key keel.RunID, n remoteNote) {
	f.waiters.mu.Lock()
	f.waiters.notes[key] = append(f.waiters.notes[key], n)
	f.waiters.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *flowRun) takeNotes(key keel.RunID) []remoteNote {
	f.waiters.mu.Lock()
	defer f.waiters.mu.Unlock()
	n := f.waiters.notes[key]
	delete(f.waiters.notes, key)
	return n
}

// startWaiters makes the parent's waiters; stop them with stopWaiters.
func (f *flowRun) startWaiters(ctx context.Context) {
	wctx, cancel := context.WithCancel(ctx)
	f.waiters = &waiters{ctx: wctx, cancel: cancel, live: map[keel.RunID]bool{}, notes: map[keel.RunID][]remoteNote{}}
}

// stopWaiters stops the waiters and waits for them.
func (f *flowRun) stopWaiters() {
	f.waiters.cancel()
	f.waiters.wg.Wait()
}

// handOffSpanID is the ID of the span of step attempt child handed off
// by parent.
func handOffSpanID(parent, child keel.RunID) string {
	return derivedSpanID("handoff\x00" + string(parent) + "\x00" + string(child))
}

// handOffSpan is the span of hand-off hd: under its step's span.
func (f *flowRun) handOffSpan(hd keel.StepHandedOffData, start time.Time) keel.Span {
	return keel.Span{ID: handOffSpanID(f.run.ID, hd.Run), RunID: f.run.ID, ParentID: planStepSpanID(f.run.ID, hd.Run),
		Kind: keel.SpanHandOff, Name: hd.Placement.Env, Start: start,
		Attrs: planStepAttrs(keel.StepData{StepID: hd.StepID, Run: hd.Run, Attempt: hd.Attempt})}
}

func (f *flowRun) startHandOffSpan(ctx context.Context, hd keel.StepHandedOffData) {
	if err := f.e.cfg.Store.StartSpan(context.WithoutCancel(ctx), f.handOffSpan(hd, f.e.cfg.Now())); err != nil {
		f.e.log.Warn("start a hand-off span", logkey.Run, f.run.ID, logkey.Err, err)
	}
}

// endHandOffSpan closes the hand-off span of h, which ended as d.
func (f *flowRun) endHandOffSpan(ctx context.Context, h *handoff, d keel.StepData) {
	start := f.st.handedAt[d.Run]
	sp := f.handOffSpan(h.data, start)
	sp.Status, sp.Duration = keel.SpanOK, max(0, f.e.cfg.Now().Sub(start))
	if d.Status != keel.RunSucceeded {
		sp.Status, sp.Error = keel.SpanError, string(d.Status)
		if d.Error != "" {
			sp.Error += ": " + d.Error
		}
	}
	if err := f.e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), sp); err != nil {
		f.e.log.Warn("finish a hand-off span", logkey.Run, f.run.ID, logkey.Err, err)
	}
}

// importSpans stores in the parent's trace the spans of the run that
// carried out hand-off h there, as they crossed: under the hand-off
// span, in the parent run's tree. A span whose parent did not cross
// hangs from the hand-off span.
func (f *flowRun) importSpans(ctx context.Context, h *handoff, spans []keel.Span) {
	hand := handOffSpanID(f.run.ID, h.data.Run)
	ids := map[string]bool{}
	for _, sp := range spans {
		ids[sp.ID] = true
	}
	for _, sp := range spans {
		sp.RunID = f.run.ID
		if sp.ParentID == "" || !ids[sp.ParentID] {
			sp.ParentID = hand
		}
		if sp.Status == "" || sp.Status == keel.SpanRunning {
			sp.Status = keel.SpanError
			sp.Error = "its end did not cross"
		}
		bg := context.WithoutCancel(ctx)
		if err := f.e.cfg.Store.StartSpan(bg, sp); err != nil {
			f.e.log.Warn("store a span that crossed back", logkey.Run, f.run.ID, logkey.Err, err)
			return
		}
		if err := f.e.cfg.Store.FinishSpan(bg, sp); err != nil {
			f.e.log.Warn("store a span that crossed back", logkey.Run, f.run.ID, logkey.Err, err)
			return
		}
	}
}

// cancelRemote asks the environment that runs hand-off h to cancel its
// run there, and journals what it answered (step.cancelled_elsewhere).
// A hand-off not accepted yet is cancelled by its key: an offer under
// way finds it cancelled there and starts nothing (docs/cloud.md).
func (f *flowRun) cancelRemote(ctx context.Context, d keel.StepData, h *handoff) {
	if h.done != nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, cancelRemoteWait)
	defer cancel()
	c := keel.StepCancelledElsewhereData{StepID: d.StepID, Run: d.Run, Env: h.data.Placement.Env, RemoteRun: h.remote}
	st, err := f.e.cfg.Placer.Cancel(cctx, c.Env, h.data.Run, c.RemoteRun)
	c.Status = st
	if err != nil {
		c.Error = err.Error()
		f.e.log.Warn("cancel a step's run elsewhere", logkey.Run, f.run.ID, logkey.Child, d.Run, logkey.Edge, c.Env, logkey.Err, err)
	}
	if err := f.appendEvent(ctx, keel.EventStepCancelledElsewhere, c, nil); err != nil {
		f.e.log.Warn("record a step's cancel elsewhere", logkey.Run, f.run.ID, logkey.Err, err)
	}
}

// cancelRemoteWait bounds the request to cancel a step's run elsewhere.
const cancelRemoteWait = 10 * time.Second

// remoteSpent is what the steps that ran elsewhere spent there, as their
// step.completed_elsewhere says.
func (f *flowRun) remoteSpent() (tok int64, usd float64) {
	for _, h := range f.st.handed {
		if h.done != nil {
			tok, usd = tok+h.done.Tokens, usd+h.done.CostUSD
		}
	}
	return tok, usd
}
