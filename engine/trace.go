package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
)

// A run's trace is a tree (see keel.Span.ParentID):
//
//	run                       the root, from the run's creation to its end
//	├── step 1                an agent run's model step …
//	│   ├── model.call        … its model call(s), retry waits,
//	│   ├── tool.call         tool calls and waits for a person
//	│   └── human.wait
//	└── step 2 …
//
// A plan or DAG run's root holds its planner's and composer's model
// calls and a step span per attempt of a plan step, which is the parent
// of that attempt's sub-agent's root span (in the sub-agent's trace).
//
// The root's ID is derived from the run's ID, and a plan step's from
// its sub-agent's, so both are known again after a restart without a
// read. A run's loop keeps its root and current step span in e.traces;
// every span it starts takes the step span, or else the root, for
// parent (newSpan). When the run resumes, its root is started again
// (the store replaces the row: it is running again, from the run's
// creation), and so is the step it was in, found in the stored trace,
// so what the step does after the restart hangs under the same span.
// The root and the open step span end with the run: appendEvent closes
// them with any change to a terminal or interrupted status.

// runTrace is what a run's loop puts its spans under.
type runTrace struct {
	root keel.Span
	step keel.Span // the open step span; ID "" between steps
}

// rootSpanID is the ID of run id's root span.
func rootSpanID(id keel.RunID) string {
	return derivedSpanID("run\x00" + string(id))
}

// planStepSpanID is the ID of the step span, in the trace of plan or DAG
// run parent, of the attempt that sub-agent child carries out.
func planStepSpanID(parent, child keel.RunID) string {
	return derivedSpanID("step\x00" + string(parent) + "\x00" + string(child))
}

// derivedSpanID is a span ID made from key, shaped like spanID's.
func derivedSpanID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "span_" + hex.EncodeToString(sum[:10])
}

// newSpan returns a span of run id's trace that starts now, with a new
// ID, under the run's open step span or else its root.
func (e *Engine) newSpan(id keel.RunID, kind keel.SpanKind, name string, step int) keel.Span {
	sp := keel.Span{ID: e.spanID(), RunID: id, Kind: kind, Name: name, Step: step, Start: e.cfg.Now(), ParentID: rootSpanID(id)}
	e.mu.Lock()
	if t := e.traces[id]; t != nil && t.step.ID != "" {
		sp.ParentID = t.step.ID
	}
	e.mu.Unlock()
	return sp
}

// openTrace starts (or, on resume, starts again) run's root span and
// keeps it for the run's loop, until closeTrace.
func (e *Engine) openTrace(ctx context.Context, run keel.Run) {
	root := keel.Span{ID: rootSpanID(run.ID), RunID: run.ID, Kind: keel.SpanRun, Name: string(run.KindOrAgent()), Start: run.CreatedAt}
	if run.ParentID != "" {
		root.ParentID = planStepSpanID(run.ParentID, run.ID)
	}
	if err := e.cfg.Store.StartSpan(context.WithoutCancel(ctx), root); err != nil {
		e.log.Warn("start the run's span", "run", run.ID, "err", err)
	}
	e.mu.Lock()
	e.traces[run.ID] = &runTrace{root: root}
	e.mu.Unlock()
}

// closeTrace forgets the trace of run id's loop, which returns; spans
// still open stay so (the run waits or paused) or were closed by
// endTrace.
func (e *Engine) closeTrace(id keel.RunID) {
	e.mu.Lock()
	delete(e.traces, id)
	e.mu.Unlock()
}

// beginStep opens the span of an agent run's model step: sp when it is
// the stored span of the step the run resumes in (started again), else a
// new one.
func (e *Engine) beginStep(ctx context.Context, id keel.RunID, step int, sp *keel.Span) {
	var s keel.Span
	if sp != nil {
		s = *sp
		s.Status, s.Error, s.Duration = keel.SpanRunning, "", 0
	} else {
		s = e.newSpan(id, keel.SpanStep, "step", step)
	}
	if err := e.cfg.Store.StartSpan(context.WithoutCancel(ctx), s); err != nil {
		e.log.Warn("start a step span", "run", id, "err", err)
	}
	e.mu.Lock()
	if t := e.traces[id]; t != nil {
		t.step = s
	}
	e.mu.Unlock()
}

// endStep closes the open step span of run id, if any, as succeeded.
func (e *Engine) endStep(ctx context.Context, id keel.RunID) {
	e.mu.Lock()
	var s keel.Span
	if t := e.traces[id]; t != nil {
		s, t.step = t.step, keel.Span{}
	}
	e.mu.Unlock()
	if s.ID == "" {
		return
	}
	s.Status, s.Duration = keel.SpanOK, max(0, e.cfg.Now().Sub(s.Start))
	if err := e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), s); err != nil {
		e.log.Warn("finish a step span", "run", id, "err", err)
	}
}

// resumedStep returns the stored span of model step step of run id,
// the step a resumed run goes on with; nil when the trace has none (it
// was lost in a crash, or the run predates step spans).
func (e *Engine) resumedStep(ctx context.Context, id keel.RunID, step int) *keel.Span {
	spans, err := e.cfg.Store.Spans(ctx, id)
	if err != nil {
		e.log.Warn("read the trace to resume", "run", id, "err", err)
		return nil
	}
	for i := len(spans) - 1; i >= 0; i-- {
		if sp := spans[i]; sp.Kind == keel.SpanStep && sp.Step == step {
			return &sp
		}
	}
	return nil
}

// endTrace closes the root and open step span of run id when upd moves
// it to a terminal or interrupted status: as ok when it succeeded, else
// as failed with the reason. A run whose loop is not running (cancelled
// while waiting, paused or interrupted) has every span still open in its
// trace closed.
func (e *Engine) endTrace(ctx context.Context, id keel.RunID, upd *keel.RunUpdate) {
	if upd == nil || !upd.Status.Terminal() && upd.Status != keel.RunInterrupted {
		return
	}
	status, why := keel.SpanOK, ""
	if upd.Status != keel.RunSucceeded {
		status, why = keel.SpanError, string(upd.Status)
		if upd.Error != "" {
			why += ": " + upd.Error
		}
	}
	now := e.cfg.Now()
	ctx = context.WithoutCancel(ctx)
	e.mu.Lock()
	t := e.traces[id]
	var open []keel.Span
	if t != nil {
		open = []keel.Span{t.step, t.root}
		t.step = keel.Span{}
	}
	e.mu.Unlock()
	if t == nil {
		if upd.Status == keel.RunInterrupted {
			return // Recover closed them (closeSpans)
		}
		spans, err := e.cfg.Store.Spans(ctx, id)
		if err != nil {
			e.log.Warn("read the trace to close", "run", id, "err", err)
			return
		}
		open = spans
	}
	for _, sp := range open {
		if sp.ID == "" || t == nil && sp.Status != keel.SpanRunning {
			continue
		}
		sp.Status, sp.Error, sp.Duration = status, why, max(0, now.Sub(sp.Start))
		if sp.Kind != keel.SpanRun && sp.Kind != keel.SpanStep {
			sp.Status = keel.SpanError // a wait or call the run's end cut off
		}
		if err := e.cfg.Store.FinishSpan(ctx, sp); err != nil {
			e.log.Warn("close a span", "run", id, "span", sp.ID, "err", err)
		}
	}
}

// modelCallInfo records on a model call's span what served it: the
// model's digest and the hashes of the prompt it was sent.
func modelCallInfo(sp *keel.Span, req models.ChatRequest, resp models.ChatResponse) {
	sp.ModelDigest = resp.ModelDigest
	sp.TemplateHash, sp.PromptHash = models.PromptHashes(req)
}

// planStepAttrs is the attributes of a plan step's span: the sub-agent
// that carries it out and which attempt it is.
func planStepAttrs(d keel.StepData) json.RawMessage {
	b, _ := json.Marshal(struct {
		Run     keel.RunID `json:"run"`
		Attempt int        `json:"attempt"`
	}{d.Run, d.Attempt})
	return b
}
