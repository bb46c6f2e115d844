package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
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
// The root's ID is derived from the run's ID, a model step's from the
// run's ID and the step, and a plan step's from its sub-agent's, so all
// are known again after a restart without a read. A run's loop keeps its root and current step span in e.traces;
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
	// stored is whether step has been written. A step span is written
	// once, finished, when its step ends (the common case: a step span
	// started before the step's commit and finished after it would cost
	// the writer an update of a row it just inserted, at every step), or
	// as running when the loop leaves it open (a wait, a pause) or the
	// run resumes in it.
	stored bool
	// hasher hashes the prompts of the run's model calls, each only
	// what its conversation added; used by the loop's goroutine alone.
	hasher models.PromptHasher
}

// rootSpanID is the ID of run id's root span.
func rootSpanID(id keel.RunID) string {
	return derivedSpanID("run\x00" + string(id))
}

// stepSpanID is the ID of the span of model step step of agent run id:
// known again when the run resumes, whether or not the span was written.
func stepSpanID(id keel.RunID, step int) string {
	return derivedSpanID("step\x00" + string(id) + "\x00" + strconv.Itoa(step))
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
	sp := keel.Span{ID: keel.NewSpanID(e.cfg.Now()), RunID: id, Kind: kind, Name: name, Step: step, Start: e.cfg.Now(), ParentID: rootSpanID(id)}
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
		e.log.Warn("start the run's span", logkey.Run, run.ID, logkey.Err, err)
	}
	e.mu.Lock()
	e.traces[run.ID] = &runTrace{root: root}
	e.mu.Unlock()
}

// closeTrace forgets the trace of run id's loop, which returns. Spans
// still open stay so (the run waits or paused): a step span not written
// yet is written, running.
func (e *Engine) closeTrace(ctx context.Context, id keel.RunID) {
	e.storeOpenStep(ctx, id)
	e.mu.Lock()
	delete(e.traces, id)
	e.mu.Unlock()
}

// storeOpenStep writes run id's open step span, running, unless it is
// written already: the run stops in the step (it waits, or pauses).
func (e *Engine) storeOpenStep(ctx context.Context, id keel.RunID) {
	e.mu.Lock()
	var s keel.Span
	if t := e.traces[id]; t != nil && t.step.ID != "" && !t.stored {
		s, t.stored = t.step, true
	}
	e.mu.Unlock()
	if s.ID == "" {
		return
	}
	if err := e.cfg.Store.StartSpan(context.WithoutCancel(ctx), s); err != nil {
		e.log.Warn("start a step span", logkey.Run, id, logkey.Err, err)
	}
}

// beginStep opens the span of an agent run's model step: sp when it is
// the stored span of the step the run resumes in (started again), else a
// new one, written when it ends (see runTrace.stored).
func (e *Engine) beginStep(ctx context.Context, id keel.RunID, step int, sp *keel.Span) {
	var s keel.Span
	stored := sp != nil && sp.Status != ""
	if sp != nil {
		s = *sp
		s.Status, s.Error, s.Duration = keel.SpanRunning, "", 0
	} else {
		s = keel.Span{ID: stepSpanID(id, step), RunID: id, ParentID: rootSpanID(id), Kind: keel.SpanStep, Name: "step", Step: step, Start: e.cfg.Now()}
	}
	if stored {
		if err := e.cfg.Store.StartSpan(context.WithoutCancel(ctx), s); err != nil {
			e.log.Warn("start a step span", logkey.Run, id, logkey.Err, err)
		}
	}
	e.mu.Lock()
	if t := e.traces[id]; t != nil {
		t.step, t.stored = s, stored
	}
	e.mu.Unlock()
}

// endStep closes the open step span of run id, if any, as succeeded.
func (e *Engine) endStep(ctx context.Context, id keel.RunID) {
	e.mu.Lock()
	var s keel.Span
	stored := false
	if t := e.traces[id]; t != nil {
		s, stored, t.step = t.step, t.stored, keel.Span{}
	}
	e.mu.Unlock()
	if s.ID == "" {
		return
	}
	s.Status, s.Duration = keel.SpanOK, max(0, e.cfg.Now().Sub(s.Start))
	e.finishStep(ctx, s, stored)
}

// finishStep writes the end of step span s: its update, or the whole
// span when it was not written yet.
func (e *Engine) finishStep(ctx context.Context, s keel.Span, stored bool) {
	ctx = context.WithoutCancel(ctx)
	var err error
	if !stored {
		open := s
		open.Status, open.Error, open.Duration = keel.SpanRunning, "", 0
		err = e.cfg.Store.StartSpan(ctx, open)
	}
	if err == nil {
		err = e.cfg.Store.FinishSpan(ctx, s)
	}
	if err != nil {
		e.log.Warn("finish a step span", logkey.Run, s.RunID, logkey.Err, err)
	}
}

// resumedStep returns the span of model step step of run id, the step a
// resumed run goes on with: as stored, or, when it was never written (a
// crash cut the step), made again with the ID its spans name and the
// start of the first of them (Status ""); nil when the step has no span
// and no spans.
func (e *Engine) resumedStep(ctx context.Context, id keel.RunID, step int) *keel.Span {
	spans, err := e.cfg.Store.Spans(ctx, id)
	if err != nil {
		e.log.Warn("read the trace to resume", logkey.Run, id, logkey.Err, err)
		return nil
	}
	want := stepSpanID(id, step)
	var made *keel.Span
	for i := len(spans) - 1; i >= 0; i-- {
		sp := spans[i]
		switch {
		case sp.ID == want:
			return &sp
		case sp.ParentID == want:
			made = &keel.Span{ID: want, RunID: id, ParentID: rootSpanID(id), Kind: keel.SpanStep, Name: "step", Step: step, Start: sp.Start}
		}
	}
	return made
}

// endTrace closes the root and open step span of run id when upd moves
// it to a terminal or interrupted status: as ok when it succeeded, else
// as failed with the reason. A run whose loop is not running (cancelled
// while waiting, paused or interrupted) has every span still open in its
// trace closed.
func (e *Engine) endTrace(ctx context.Context, id keel.RunID, upd *keel.RunUpdate) {
	if upd != nil && (upd.Status == keel.RunWaiting || upd.Status == keel.RunPaused) {
		e.storeOpenStep(ctx, id) // to commit with the wait
		return
	}
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
	stepStored := false
	if t != nil {
		open = []keel.Span{t.step, t.root}
		stepStored, t.step = t.stored, keel.Span{}
	}
	e.mu.Unlock()
	if t == nil {
		if upd.Status == keel.RunInterrupted {
			return // Recover closed them (closeSpans)
		}
		spans, err := e.cfg.Store.Spans(ctx, id)
		if err != nil {
			e.log.Warn("read the trace to close", logkey.Run, id, logkey.Err, err)
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
		if t != nil && sp.Kind == keel.SpanStep {
			e.finishStep(ctx, sp, stepStored)
			continue
		}
		if err := e.cfg.Store.FinishSpan(ctx, sp); err != nil {
			e.log.Warn("close a span", logkey.Run, id, logkey.Span, sp.ID, logkey.Err, err)
		}
	}
}

// endModelSpan fills a model call's span of run id, started at start,
// from the call's request, response and error: its duration and status,
// what it spent (tokens, cost, retries, time to first byte), how it
// ended, what served it (provider, the model a route chose, the model's
// digest) and the hashes of the prompt it was sent. It is called by the
// run's loop goroutine.
func (e *Engine) endModelSpan(id keel.RunID, sp *keel.Span, start time.Time, req models.ChatRequest, resp models.ChatResponse, err error) {
	sp.Duration, sp.Status = e.cfg.Now().Sub(start), keel.SpanOK
	if err != nil {
		sp.Status, sp.Error = keel.SpanError, err.Error()
	}
	sp.PromptTokens, sp.CompletionTokens = resp.Usage.PromptTokens, resp.Usage.CompletionTokens
	sp.Provider, sp.CostUSD, sp.TTFT, sp.Retries, sp.FinishReason = resp.Meta.Provider, resp.Meta.CostUSD, resp.Meta.FirstByte, resp.Meta.Retries, resp.FinishReason
	if resp.Model != "" && resp.Model != sp.Name {
		sp.Name = resp.Model // the model a route chose
	}
	sp.ModelDigest = resp.ModelDigest
	e.mu.Lock()
	t := e.traces[id]
	e.mu.Unlock()
	if t == nil {
		sp.TemplateHash, sp.PromptHash = models.PromptHashes(req)
		return
	}
	sp.TemplateHash, sp.PromptHash = t.hasher.Hashes(req)
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
