package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/keel-runtime/keel"
)

// argsHash is the hex sha256 of a call's arguments as journaled: what an
// approval is bound to.
func argsHash(args json.RawMessage) string {
	sum := sha256.Sum256(args)
	return hex.EncodeToString(sum[:])
}

// needsApproval reports whether a call of tool name must be approved by a
// person first (Config.RequireApproval names its side-effect class).
func (e *Engine) needsApproval(ctx context.Context, name string) (keel.SideEffect, bool) {
	class, ok := e.sideEffects(ctx, name)
	return class, ok && slices.Contains(e.cfg.RequireApproval, class)
}

// gate applies approvals to a call about to run. It returns the call to
// run (its arguments edited if the person edited them), or a result to
// journal instead (denied), or wait true after asking for an approval,
// which leaves the run waiting.
func (e *Engine) gate(ctx context.Context, run keel.Run, step int, call keel.ToolCall, decided map[string]keel.ApprovalData) (keel.ToolCall, *keel.ToolResultData, bool, error) {
	effects, need := e.needsApproval(ctx, call.Name)
	if !need {
		return call, nil, false, nil
	}
	if d, ok := decided[call.ID]; ok {
		if !d.Approved {
			return call, &keel.ToolResultData{Step: step, CallID: call.ID, Name: call.Name,
				Error: &keel.ToolError{Code: keel.ToolDenied, Message: "a person denied this call" + noteSuffix(d.Reason)}}, false, nil
		}
		if len(d.Arguments) > 0 {
			call.Arguments = d.Arguments
		}
		return call, nil, false, nil
	}
	sp := e.newSpan(run.ID, keel.SpanHuman, "approve "+call.Name, step)
	if err := e.cfg.Store.StartSpan(context.WithoutCancel(ctx), sp); err != nil {
		return call, nil, false, fmt.Errorf("journal: %w", err)
	}
	why := fmt.Sprintf("tool %s (%s) needs a person's approval", call.Name, effects)
	if _, err := e.appendEvent(ctx, run.ID, keel.EventApprovalAsked,
		keel.ApprovalRequestData{Call: call, ArgsSHA256: argsHash(call.Arguments), SideEffects: effects, SpanID: sp.ID},
		&keel.RunUpdate{Status: keel.RunWaiting, Error: why}); err != nil {
		return call, nil, false, fmt.Errorf("journal: %w", err)
	}
	return call, nil, true, nil
}

// Approve answers a run waiting for approval of callID. argsSHA256 must
// be the hash the request showed (approval.requested): an approval binds
// to the exact payload. approved false denies, with reason for the model;
// args, when set, replace the call's arguments. As with Decide, exactly
// one answer is journaled per call: a later one gets a
// *keel.AlreadyDecidedError and is not journaled; any error means
// nothing was journaled.
func (e *Engine) Approve(ctx context.Context, id keel.RunID, d keel.ApprovalData) (keel.Run, error) {
	if len(d.Arguments) > 0 && !json.Valid(d.Arguments) {
		return keel.Run{}, fmt.Errorf("edited arguments are not JSON: %w", keel.ErrInvalid)
	}
	// One answer per wait: the check and the append are one step.
	defer e.deciding.lock(id)()
	run, err := e.cfg.Store.GetRun(ctx, id)
	if err != nil {
		return keel.Run{}, err
	}
	j, err := e.restore(ctx, run)
	if err != nil {
		return run, err
	}
	if a, done := j.approvedBy[d.CallID]; done {
		return run, decided(id, d.CallID, a)
	}
	if run.Status != keel.RunWaiting {
		return run, fmt.Errorf("run %s is %s, not waiting for an approval: %w", id, run.Status, keel.ErrConflict)
	}
	asked, ok := j.asked[d.CallID]
	if !ok {
		return run, fmt.Errorf("run %s is not waiting for an approval of call %q: %w", id, d.CallID, keel.ErrConflict)
	}
	if d.ArgsSHA256 != asked.ArgsSHA256 {
		return run, fmt.Errorf("the approval names arguments %q but call %s shows %q: approve what was shown: %w", d.ArgsSHA256, d.CallID, asked.ArgsSHA256, keel.ErrConflict)
	}
	status := keel.SpanOK
	if !d.Approved {
		status = keel.SpanError
	}
	// Finished first, to commit with the decision: a crash after the
	// decision must not leave the wait open in the trace.
	sp := keel.Span{ID: asked.SpanID, RunID: id, Kind: keel.SpanHuman, Status: status, Duration: e.cfg.Now().Sub(j.askedAt[d.CallID]), Error: d.Reason}
	if err := e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), sp); err != nil {
		e.log.Warn("close the approval span", "run", id, "err", err)
	}
	if _, err := e.appendEvent(ctx, id, keel.EventApproval, d, nil); err != nil {
		return run, err
	}
	if err := e.launchAnswered(run); err != nil {
		return run, err
	}
	return e.cfg.Store.GetRun(ctx, id)
}
