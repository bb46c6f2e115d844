package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/policy"
)

// created is what Start hands the loop of a run it just created: it has
// journaled nothing, or only its run.started (started), so there is
// nothing to read back, not its journal, not what it spent.
type created struct {
	started bool
	specs   []keel.ToolSpec // the run's tools, when started
	// untrack stops tracking the run's labels, which Start made live
	// before it created the run (trackFresh); the loop calls it.
	untrack func()
}

// loop drives one run to an end, starting from what its journal holds,
// or from nothing for a run Start just created (fresh not nil). It
// returns when the run reached a terminal state, waits for a human, or
// was interrupted by shutdown; every exit path journals exactly one
// event that says so.
func (e *Engine) loop(ctx context.Context, run keel.Run, fresh *created) {
	e.openTrace(ctx, run)
	defer e.closeTrace(ctx, run.ID)
	var release func()
	var err error
	if fresh != nil && fresh.untrack != nil {
		release = fresh.untrack // nothing to read back
	} else {
		release, err = e.trackLabels(ctx, run)
	}
	if err != nil {
		e.log.Error("restore run", logkey.Run, run.ID, logkey.Err, err)
		e.end(ctx, run.ID, err)
		return
	}
	defer release()
	if run.KindOrAgent() != keel.KindAgent {
		e.flow(ctx, run)
		return
	}
	log := e.log.With(logkey.Run, run.ID)
	ctx, cancelDeadline := withDeadline(ctx, run)
	defer cancelDeadline()
	j := e.newJournal(run)
	if fresh == nil {
		j, err = e.restore(ctx, run)
	}
	if err != nil {
		log.Error("restore run", logkey.Err, err)
		e.end(ctx, run.ID, err)
		return
	}
	if fresh == nil {
		e.notedInJournal(run.ID, j.policyDigest)
	}
	var specs []keel.ToolSpec
	switch {
	case fresh != nil && fresh.started:
		specs = fresh.specs
	case j.fresh:
		specs = e.toolsFor(ctx, run, e.cfg.Tools.Specs(ctx))
		_, err = e.appendEvent(ctx, run.ID, keel.EventRunStarted, startedData(run, specs), &keel.RunUpdate{Status: keel.RunRunning})
	default:
		specs = e.toolsFor(ctx, run, e.cfg.Tools.Specs(ctx))
		_, err = e.appendEvent(ctx, run.ID, keel.EventRunResumed, keel.RunResumedData{FromSeq: j.lastSeq, Step: j.step},
			&keel.RunUpdate{Status: keel.RunRunning})
	}
	if err != nil {
		log.Error("journal run start", logkey.Err, err)
		return
	}
	var tokens int64
	var usd float64
	if fresh == nil {
		tokens, usd = e.spent(ctx, run.ID)
	}
	budget := models.NewBudget("run", models.Limits{Tokens: run.Policy.BudgetTokens, CostUSD: run.Policy.BudgetUSD}, tokens, usd)
	msgs := j.msgs
	unread := j.unread // read by the next model step
	if j.answer != nil {
		e.end(ctx, run.ID, nil, *j.answer)
		return
	}
	// A resumed run goes on under the span of the step it was in: the
	// last journaled step, while it has calls without a result, else
	// the next, which a stop may have cut before its model result.
	var resumed *keel.Span
	if fresh == nil && !j.fresh {
		at := j.step + 1
		if len(j.pending) > 0 {
			at = j.step
		}
		resumed = e.resumedStep(ctx, run.ID, at)
	}
	if len(j.pending) > 0 {
		e.beginStep(ctx, run.ID, j.step, resumed)
		resumed = nil
	}
	for _, call := range j.pending {
		if e.paused(ctx, run.ID) {
			return
		}
		msg, wait, err := e.finishCall(ctx, run, j, call)
		switch {
		case err != nil:
			e.end(ctx, run.ID, err)
			return
		case wait:
			return
		}
		msgs = append(msgs, msg)
	}
	e.endStep(ctx, run.ID)
	// The model that serves the run: the run's, or for a route the
	// target it chose for the last step.
	served := cmp.Or(j.model, run.Model)
	ctxLimit := e.contextLength(ctx, served)
	for step := j.step + 1; step <= run.MaxSteps; step++ {
		if e.paused(ctx, run.ID) {
			return
		}
		e.beginStep(ctx, run.ID, step, resumed)
		resumed = nil
		unread = append(unread, e.readInbox(run.ID, j.lastSeq)...)
		human := humanMessages(run, unread)
		var resp models.ChatResponse
		for refit := 0; ; refit++ {
			// The steps so far are fitted with the human messages the
			// step reads counted; those come after any summary, as a
			// resumed run rebuilds it.
			if msgs, err = e.fit(ctx, run, step, served, ctxLimit, msgs, human, specs, budget); err != nil {
				e.end(ctx, run.ID, err)
				return
			}
			sent := slices.Concat(msgs, human)
			// The request carries what the context holds now, a
			// person's declassifications included.
			labels := e.labelsNow(ctx, run)
			resp, err = e.modelStepWithRetries(ctx, run, step, models.ChatRequest{
				Model: run.Model, Messages: scopeLabels(sent, labels), Tools: specs,
				AllowCloud: run.Policy.AllowCloud, Labels: labelNames(labels), Budget: budget,
			}, seqsOf(unread))
			estimate := models.EstimateTokens(sent, specs)
			if err == nil || models.KindOf(err) != models.KindContextTooLong || ctxLimit <= 0 || refit >= refitLimit {
				if err == nil {
					msgs = sent
					if resp.Model != "" && resp.Model != served {
						served = resp.Model
						ctxLimit = cmp.Or(e.contextLength(ctx, served), ctxLimit)
					}
					e.calib.Observe(served, estimate, resp.Usage.PromptTokens)
				}
				break
			}
			// The model layer counted more than the estimate: count
			// higher and fit again.
			e.calib.Exceeded(served, estimate, ctxLimit)
		}
		unread = nil
		if err != nil {
			e.end(ctx, run.ID, err)
			return
		}
		msgs = append(msgs, resp.Message)
		if len(resp.Message.ToolCalls) == 0 {
			if e.replay == nil || !e.replay.goesOn[step] {
				e.end(ctx, run.ID, nil, resp.Message.Content)
				return
			}
			// A replay of a fork with a message: the journal asked
			// again after this answer, reading the message.
			e.endStep(ctx, run.ID)
			continue
		}
		for _, call := range resp.Message.ToolCalls {
			if e.paused(ctx, run.ID) {
				return // the step's calls without a result run on resume
			}
			call, denied, pd, wait, err := e.gate(ctx, run, step, call, nil)
			if err != nil || wait {
				if err != nil {
					e.end(ctx, run.ID, err)
				}
				return // waiting for approval; the call runs on resume
			}
			res := keel.ToolResultData{}
			if denied != nil {
				res = *denied
				_, err = e.appendEvent(ctx, run.ID, keel.EventToolResult, res, nil)
			} else {
				res, err = e.toolStep(ctx, run, step, call, false, pd)
			}
			if err != nil {
				e.end(ctx, run.ID, err)
				return
			}
			msgs = append(msgs, toolMessage(run, res))
		}
		e.endStep(ctx, run.ID)
	}
	e.end(ctx, run.ID, fmt.Errorf("step limit reached: %d model calls without a final answer", run.MaxSteps))
}

// finishCall completes a call of the last journaled step on resume. A call
// whose intent was journaled without a result may have run: it runs again
// only if its tool is read-only or idempotent or a human said retry;
// otherwise the run waits for a human (wait true), or applies the human's
// skip or done. It returns the tool message for the model.
func (e *Engine) finishCall(ctx context.Context, run keel.Run, j journal, call keel.ToolCall) (models.Message, bool, error) {
	call, denied, pd, wait, err := e.gate(ctx, run, j.step, call, &j)
	switch {
	case err != nil || wait:
		return models.Message{}, wait, err
	case denied != nil:
		if _, err := e.appendEvent(ctx, run.ID, keel.EventToolResult, *denied, nil); err != nil {
			return models.Message{}, false, fmt.Errorf("journal: %w", err)
		}
		return toolMessage(run, *denied), false, nil
	}
	d, decided := j.decision[call.ID]
	var res keel.ToolResultData
	switch {
	case decided && d.Decision == keel.DecisionSkip:
		res = keel.ToolResultData{Step: j.step, CallID: call.ID, Name: call.Name,
			Error: &keel.ToolError{Code: keel.ToolSkipped, Message: "a human chose not to run this call again after an interruption; it may or may not have taken effect" + noteSuffix(d.Note)}}
	case decided && d.Decision == keel.DecisionDone:
		out := d.Output
		if len(out) == 0 {
			out = json.RawMessage(`{"status":"done","confirmed_by":"human"}`)
		}
		res = keel.ToolResultData{Step: j.step, CallID: call.ID, Name: call.Name, Output: out}
	case j.intent[call.ID] && !decided && !e.rerunnable(ctx, call.Name):
		why := fmt.Sprintf("the daemon stopped while tool %s was running; it is not idempotent, so it will not run again unless you decide", call.Name)
		c := call
		if _, err := e.appendEvent(ctx, run.ID, keel.EventRunWaiting,
			keel.RunWaitingData{Reason: why, Call: &c, Choices: []string{keel.DecisionRetry, keel.DecisionSkip, keel.DecisionDone}},
			&keel.RunUpdate{Status: keel.RunWaiting, Error: why}); err != nil {
			return models.Message{}, false, fmt.Errorf("journal: %w", err)
		}
		return models.Message{}, true, nil
	default:
		// Never started, safe to repeat, or a human said retry.
		r, err := e.toolStep(ctx, run, j.step, call, j.intent[call.ID] && !decided, pd)
		return toolMessage(run, r), false, err
	}
	if _, err := e.appendEvent(ctx, run.ID, keel.EventToolResult, res, nil); err != nil {
		return models.Message{}, false, fmt.Errorf("journal: %w", err)
	}
	return toolMessage(run, res), false, nil
}

func noteSuffix(note string) string {
	if note == "" {
		return ""
	}
	return " (" + note + ")"
}

// modelStep makes one model call as a span and journals its result, or
// holds it to be journaled with the run's next event (see hold).
func (e *Engine) modelStep(ctx context.Context, run keel.Run, step int, req models.ChatRequest, humanSeqs []int64, holdResult bool) (models.ChatResponse, error) {
	sp := e.newSpan(run.ID, keel.SpanModelCall, run.Model, step)
	if err := e.cfg.Store.StartSpan(context.WithoutCancel(ctx), sp); err != nil {
		return models.ChatResponse{}, fmt.Errorf("journal: %w", err)
	}
	start := e.cfg.Now()
	var decided []keel.ModelDecision
	m := e.model(run, step)
	m.decided = &decided
	resp, err := m.Chat(ctx, req, func(d models.Delta) {
		if d.Content == "" {
			return
		}
		raw, _ := json.Marshal(keel.ModelDeltaData{Step: step, Content: d.Content, Restart: d.Restart})
		e.publish(keel.Event{RunID: run.ID, Type: keel.EventModelDelta, Time: e.cfg.Now(), Data: raw})
	})
	e.endModelSpan(run.ID, &sp, start, req, resp, err)
	if e.replay != nil {
		decided = e.replay.modelDecisions(step)
	}
	labels := req.LabelSet()
	if m := resp.Meta; m.Route != "" || m.Variant != "" || len(m.Attempts) > 0 || len(decided) > 0 || len(labels) > 0 {
		sp.Attrs, _ = json.Marshal(struct {
			Route    string               `json:"route,omitempty"`
			Variant  string               `json:"variant,omitempty"`
			Attempts []models.Attempt     `json:"attempts,omitempty"`
			Policy   []keel.ModelDecision `json:"policy,omitempty"`
			Labels   []string             `json:"labels,omitempty"`
		}{m.Route, m.Variant, m.Attempts, decided, labels})
	}
	// A successful call's usage is journaled in its model.result; a
	// failed call's span is all that records what it spent (see Tracer).
	if ferr := e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), sp); ferr != nil {
		return models.ChatResponse{}, fmt.Errorf("journal: %w", ferr)
	}
	if err != nil {
		return models.ChatResponse{}, fmt.Errorf("model %s: %w", run.Model, err)
	}
	// Tool calls need IDs to pair results with; providers that give none get one.
	for i := range resp.Message.ToolCalls {
		if resp.Message.ToolCalls[i].ID == "" {
			resp.Message.ToolCalls[i].ID = fmt.Sprintf("call_%d_%d", step, i+1)
		}
	}
	// The answer derives from the whole context: it carries its labels.
	resp.Message.Role, resp.Message.Labels = models.RoleAssistant, labels
	data := keel.ModelResultData{
		Step: step, Model: resp.Model, Content: resp.Message.Content, ToolCalls: resp.Message.ToolCalls,
		PromptTokens: resp.Usage.PromptTokens, CompletionTokens: resp.Usage.CompletionTokens, CostUSD: resp.Meta.CostUSD, DurationMS: sp.Duration.Milliseconds(),
		HumanSeqs: humanSeqs, Policy: decided, Labels: labels,
	}
	if holdResult {
		err = e.hold(run.ID, keel.EventModelResult, data)
	} else {
		_, err = e.appendEvent(ctx, run.ID, keel.EventModelResult, data, nil)
	}
	if err != nil {
		return models.ChatResponse{}, fmt.Errorf("journal: %w", err)
	}
	return resp, nil
}

// toolStep runs one tool call: intent journaled first (unless it already
// is, for a call repeated on resume), then the call as a span, then the
// result. The intent of a read-only or idempotent tool is held instead
// and journaled with the result, in one commit. A tool failure is not a run failure: the classified error goes
// back to the model, which may correct itself. pd is the policy's
// decision that let the call run, recorded with its intent and on its
// span. It returns the journaled result.
func (e *Engine) toolStep(ctx context.Context, run keel.Run, step int, call keel.ToolCall, intentJournaled bool, pd *keel.PolicyDecision) (keel.ToolResultData, error) {
	if !mayUse(run, call.Name) {
		// Nothing runs, so no intent: the refusal is the result.
		res := keel.ToolResultData{Step: step, CallID: call.ID, Name: call.Name,
			Error: &keel.ToolError{Code: keel.ToolPermissionDenied, Message: fmt.Sprintf("tool %s is not among the tools this run may use (%s)", call.Name, strings.Join(run.Policy.Tools, ", "))}}
		if _, err := e.appendEvent(ctx, run.ID, keel.EventToolResult, res, nil); err != nil {
			return keel.ToolResultData{}, fmt.Errorf("journal: %w", err)
		}
		return res, nil
	}
	if !intentJournaled {
		// The intent of a call that may run twice rides with its result
		// (see hold); any other is on disk before the tool starts.
		var err error
		intent := keel.ToolCallData{Step: step, Call: call, Policy: e.journaledDecision(run.ID, pd)}
		if e.rerunnable(ctx, call.Name) {
			err = e.hold(run.ID, keel.EventToolCall, intent)
		} else {
			_, err = e.appendEvent(ctx, run.ID, keel.EventToolCall, intent, nil)
		}
		if err != nil {
			return keel.ToolResultData{}, fmt.Errorf("journal: %w", err)
		}
	}
	res, err := e.callTool(ctx, run, step, call, pd)
	if err != nil {
		return keel.ToolResultData{}, err
	}
	if _, err := e.appendEvent(ctx, run.ID, keel.EventToolResult, res, nil); err != nil {
		return keel.ToolResultData{}, fmt.Errorf("journal: %w", err)
	}
	return res, nil
}

// callTool runs one tool call, each attempt a span, under the run's step
// timeout, trying a read-only or idempotent tool again after a timeout or
// a crash as the run's policy allows. It returns the result to journal,
// or an error when the run was stopped meanwhile (no result is recorded:
// the call did not complete).
func (e *Engine) callTool(ctx context.Context, run keel.Run, step int, call keel.ToolCall, pd *keel.PolicyDecision) (keel.ToolResultData, error) {
	for attempt := 1; ; attempt++ {
		sp := e.newSpan(run.ID, keel.SpanToolCall, call.Name, step)
		sp.Attrs = toolAttrs(pd, call.ID, nil, nil, nil)
		if err := e.cfg.Store.StartSpan(context.WithoutCancel(ctx), sp); err != nil {
			return keel.ToolResultData{}, fmt.Errorf("journal: %w", err)
		}
		sctx, cancel := stepContext(ctx, run)
		start := e.cfg.Now()
		touched, egress, private := &keel.Touched{}, &egressLog{}, e.readsPrivate(call.Name)
		out, err := e.cfg.Tools.Call(sctx, keel.ToolInvocation{Run: run.ID, Step: step, CallID: call.ID, Name: call.Name, Args: call.Arguments,
			SpanID: sp.ID, Touched: touched, Egress: e.egressCheck(run, call, pd != nil && pd.Outcome == policy.Ask.String(), egress),
			Policy: pd, LabelsOf: e.labelsOf(run, call, private)})
		timedOut := errors.Is(context.Cause(sctx), errStepTimeout)
		cancel()
		sp.Duration, sp.Status = e.cfg.Now().Sub(start), keel.SpanOK
		res := keel.ToolResultData{Step: step, CallID: call.ID, Name: call.Name, DurationMS: sp.Duration.Milliseconds(), Private: private}
		res.Labels, res.Touched = e.resultLabels(run, call, touched, res.Private), touchedOrNil(touched)
		var te *keel.ToolError
		if err != nil {
			sp.Status, sp.Error = keel.SpanError, err.Error()
			if !errors.As(err, &te) {
				te = &keel.ToolError{Code: keel.ToolCrashed, Message: err.Error()}
			}
			if timedOut {
				te = &keel.ToolError{Code: keel.ToolTimeout, Message: fmt.Sprintf("tool %s did not finish within the run's step timeout of %s", call.Name, run.Policy.StepTimeout)}
			}
		}
		sp.Attrs = toolAttrs(pd, call.ID, te, res.Labels, egress.records())
		if ferr := e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), sp); ferr != nil {
			return keel.ToolResultData{}, fmt.Errorf("journal: %w", ferr)
		}
		if err == nil {
			res.Output = out
			return res, nil
		}
		if ctx.Err() != nil {
			return keel.ToolResultData{}, err
		}
		res.Error = te
		if attempt > run.Policy.ToolRetries || !retryableToolError(te) || !e.rerunnable(ctx, call.Name) {
			return res, nil
		}
		if err := e.retryWait(ctx, run, keel.StepRetryData{Step: step, CallID: call.ID, Attempt: attempt + 1, Error: te.Error()}); err != nil {
			return keel.ToolResultData{}, err
		}
	}
}

// end journals the run's ending. err nil means success with result[0].
func (e *Engine) end(ctx context.Context, id keel.RunID, err error, result ...string) {
	var typ keel.EventType
	var data keel.RunEndData
	switch cause := context.Cause(ctx); {
	case err == nil:
		typ, data = keel.EventRunSucceeded, keel.RunEndData{Status: keel.RunSucceeded, Result: result[0]}
	case errors.Is(cause, errShutdown):
		typ, data = keel.EventRunInterrupted, keel.RunEndData{Status: keel.RunInterrupted, Reason: errShutdown.Error()}
	case errors.Is(cause, errCanceled):
		typ, data = keel.EventRunCancelled, keel.RunEndData{Status: keel.RunCancelled, Reason: errCanceled.Error()}
	case errors.Is(cause, errDeadline):
		typ, data = keel.EventRunFailed, keel.RunEndData{Status: keel.RunFailed, Reason: deadlineReason(ctx, err)}
	default:
		typ, data = keel.EventRunFailed, keel.RunEndData{Status: keel.RunFailed, Reason: err.Error()}
	}
	if _, jerr := e.appendEvent(ctx, id, typ, data, &keel.RunUpdate{Status: data.Status, Result: data.Result, Error: data.Reason}); jerr != nil {
		e.log.Error("journal run end", logkey.Run, id, logkey.Event, typ, logkey.Err, jerr)
		return
	}
	e.log.Info("run ended", logkey.Run, id, logkey.Status, data.Status)
}

// startedData is what run.started says of run, which may use specs.
func startedData(run keel.Run, specs []keel.ToolSpec) keel.RunStartedData {
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	return keel.RunStartedData{Goal: run.Goal, Model: run.Model, Tools: names, MaxSteps: run.MaxSteps}
}

// toolsFor returns the specs of the tools run may use: all of them, or
// the subset its policy names (a sub-agent's), less those the Tools do
// not offer it (Offerer).
func (e *Engine) toolsFor(ctx context.Context, run keel.Run, specs []keel.ToolSpec) []keel.ToolSpec {
	of, _ := e.cfg.Tools.(Offerer)
	if run.Policy.Tools == nil && of == nil {
		return specs
	}
	var out []keel.ToolSpec
	for _, s := range specs {
		if mayUse(run, s.Name) && (of == nil || of.Offers(ctx, run, s.Name)) {
			out = append(out, s)
		}
	}
	return out
}

// mayUse reports whether run's policy lets it call the named tool.
func mayUse(run keel.Run, name string) bool {
	return run.Policy.Tools == nil || slices.Contains(run.Policy.Tools, name)
}
