package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
)

// Step and run limits from a run's policy (keel.RunPolicy): a deadline
// for the whole run, a timeout per model or tool call, and how many times
// a failed step is tried again.

var (
	errDeadline    = errors.New("the run's deadline passed")
	errStepTimeout = errors.New("the step outlived the run's step timeout")
)

// defaultRetryBackoff is the wait before a first retry when the policy
// names none; each next retry waits twice as long.
const defaultRetryBackoff = 200 * time.Millisecond

// withDeadline bounds ctx by the run's deadline, if it has one.
func withDeadline(ctx context.Context, run keel.Run) (context.Context, context.CancelFunc) {
	if run.Policy.Deadline.IsZero() {
		return ctx, func() {}
	}
	return context.WithDeadlineCause(ctx, run.Policy.Deadline, errDeadline)
}

// stepContext bounds one model or tool call by the run's step timeout.
func stepContext(ctx context.Context, run keel.Run) (context.Context, context.CancelFunc) {
	if run.Policy.StepTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, run.Policy.StepTimeout, errStepTimeout)
}

// backoff is the wait before attempt (2 for the first retry).
func backoff(p keel.RunPolicy, attempt int) time.Duration {
	d := p.RetryBackoff
	if d <= 0 {
		d = defaultRetryBackoff
	}
	for i := 2; i < attempt && d < time.Minute; i++ {
		d *= 2
	}
	return min(d, time.Minute)
}

// retryableModelError reports whether a failed model step may succeed
// if made again: it timed out (the step timeout or the model layer's), or
// the model layer classified its failure as transient or as output that
// stayed invalid after repairs.
func retryableModelError(stepCtx context.Context, err error) bool {
	if errors.Is(context.Cause(stepCtx), errStepTimeout) {
		return true
	}
	k := models.KindOf(err)
	return k.Retryable() || k == models.KindInvalidOutput
}

// retryableToolError reports whether a failed tool call may succeed if
// made again: it timed out or crashed. Whether the tool may be repeated
// at all (its side effects) is the caller's check.
func retryableToolError(err *keel.ToolError) bool {
	return err != nil && (err.Code == keel.ToolTimeout || err.Code == keel.ToolCrashed)
}

// retryWait journals that a step is tried again and waits before it; it
// returns early with ctx's error when the run is stopped meanwhile.
func (e *Engine) retryWait(ctx context.Context, run keel.Run, d keel.StepRetryData) error {
	wait := backoff(run.Policy, d.Attempt)
	d.WaitMS = wait.Milliseconds()
	if _, err := e.appendEvent(ctx, run.ID, keel.EventStepRetry, d, nil); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	what := "model step"
	if d.CallID != "" {
		what = "tool call " + d.CallID
	}
	e.log.Info("retrying", logkey.Run, run.ID, logkey.Step, d.Step, logkey.What, what, logkey.Attempt, d.Attempt, logkey.After, wait, logkey.Err, d.Error)
	sp := e.newSpan(run.ID, keel.SpanRetry, "retry "+what, d.Step)
	sp.Error = d.Error
	_ = e.cfg.Store.StartSpan(context.WithoutCancel(ctx), sp)
	err := e.cfg.Sleep(ctx, wait)
	sp.Duration, sp.Status = wait, keel.SpanOK
	_ = e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), sp)
	return cmp.Or(err, ctx.Err())
}

// modelStepWithRetries is modelStep under the run's step timeout and
// model retry policy.
func (e *Engine) modelStepWithRetries(ctx context.Context, run keel.Run, step int, req models.ChatRequest, humanSeqs []int64) (models.ChatResponse, error) {
	for attempt := 1; ; attempt++ {
		sctx, cancel := stepContext(ctx, run)
		resp, err := e.modelStep(sctx, run, step, req, humanSeqs, true)
		retry := err != nil && ctx.Err() == nil && attempt <= run.Policy.ModelRetries && retryableModelError(sctx, err)
		if err != nil && errors.Is(context.Cause(sctx), errStepTimeout) {
			err = fmt.Errorf("%w (%s): %w", errStepTimeout, run.Policy.StepTimeout, err)
		}
		cancel()
		if !retry {
			return resp, err
		}
		if werr := e.retryWait(ctx, run, keel.StepRetryData{Step: step, Attempt: attempt + 1, Error: err.Error()}); werr != nil {
			return resp, werr
		}
	}
}

// deadlineReason says why a run ended at its deadline.
func deadlineReason(ctx context.Context, err error) string {
	d, _ := ctx.Deadline()
	msg := fmt.Sprintf("%s (%s)", errDeadline, d.UTC().Format(time.RFC3339))
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, errDeadline) {
		msg += ": " + err.Error()
	}
	return msg
}

// maxRetries bounds ModelRetries and ToolRetries.
const maxRetries = 10

// validatePolicy checks the parts of a run's policy the engine enforces.
func validatePolicy(p keel.RunPolicy, now time.Time) error {
	switch {
	case p.BudgetTokens < 0 || p.BudgetUSD < 0:
		return fmt.Errorf("a budget cannot be negative: %w", keel.ErrInvalid)
	case p.StepTimeout < 0 || p.RetryBackoff < 0:
		return fmt.Errorf("step_timeout and retry_backoff cannot be negative: %w", keel.ErrInvalid)
	case p.ModelRetries < 0 || p.ModelRetries > maxRetries || p.ToolRetries < 0 || p.ToolRetries > maxRetries:
		return fmt.Errorf("model_retries and tool_retries must be within 0..%d: %w", maxRetries, keel.ErrInvalid)
	case !p.Deadline.IsZero() && !p.Deadline.After(now):
		return fmt.Errorf("the deadline %s has already passed: %w", p.Deadline.UTC().Format(time.RFC3339), keel.ErrInvalid)
	}
	return checkLabels(p.Labels)
}
