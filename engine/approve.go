package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/policy"
)

// argsHash is the hex sha256 of a call's arguments as journaled: what an
// approval is bound to.
func argsHash(args json.RawMessage) string {
	sum := sha256.Sum256(args)
	return hex.EncodeToString(sum[:])
}

// gate decides a call about to run: the policy's decision (see
// decideTool), unless the journal j already holds the decision the call
// was made under (a call that asked for approval, or whose intent was
// journaled), which then stands. It returns the call to run (its
// arguments edited if the person edited them) with the decision to
// record, or a result to journal instead (denied by the policy or by a
// person), or wait true after asking for an approval, which leaves the
// run waiting. j is nil in a run's live loop.
func (e *Engine) gate(ctx context.Context, run keel.Run, step int, call keel.ToolCall, j *journal) (keel.ToolCall, *keel.ToolResultData, *keel.PolicyDecision, bool, error) {
	var outcome policy.Outcome
	var pd *keel.PolicyDecision
	decided := map[string]keel.ApprovalData(nil)
	var asked keel.ApprovalRequestData
	wasAsked := false
	if j != nil {
		asked, wasAsked = j.asked[call.ID]
	}
	switch {
	case wasAsked:
		outcome, pd, decided = policy.Ask, asked.Policy, j.approvals
	case j != nil && j.intent[call.ID]:
		outcome, pd = policy.Allow, j.policy[call.ID]
	default:
		outcome, pd = e.decideTool(ctx, run, call)
		if j != nil {
			decided = j.approvals
		}
		if e.replay != nil {
			decided = e.replay.approvals
		}
	}
	switch outcome {
	case policy.Deny:
		res, err := e.policyDenied(ctx, run, step, call, pd)
		return call, res, nil, false, err
	case policy.Allow:
		return call, nil, pd, false, nil
	}
	if d, ok := decided[call.ID]; ok {
		if !d.Approved {
			res := &keel.ToolResultData{Step: step, CallID: call.ID, Name: call.Name,
				Error: &keel.ToolError{Code: keel.ToolDenied, Message: "a person denied this call" + noteSuffix(d.Reason)}}
			e.auditDenied(ctx, run, step, call, pd, res.Error)
			return call, res, nil, false, nil
		}
		if len(d.Arguments) > 0 {
			call.Arguments = d.Arguments
		}
		return call, nil, pd, false, nil
	}
	effects, _ := e.sideEffects(ctx, call.Name)
	sp := e.newSpan(run.ID, keel.SpanHuman, "approve "+call.Name, step)
	sp.Attrs = toolAttrs(pd, call.ID, nil, nil, nil)
	if err := e.cfg.Store.StartSpan(context.WithoutCancel(ctx), sp); err != nil {
		return call, nil, nil, false, fmt.Errorf("journal: %w", err)
	}
	why := fmt.Sprintf("tool %s (%s) needs a person's approval", call.Name, effects)
	if _, err := e.appendEvent(ctx, run.ID, keel.EventApprovalAsked,
		keel.ApprovalRequestData{Call: call, ArgsSHA256: argsHash(call.Arguments), SideEffects: effects, SpanID: sp.ID, Policy: pd},
		&keel.RunUpdate{Status: keel.RunWaiting, Error: why}); err != nil {
		return call, nil, nil, false, fmt.Errorf("journal: %w", err)
	}
	return call, nil, nil, true, nil
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
	// Its attributes again: finishing a span replaces them.
	sp := keel.Span{ID: asked.SpanID, RunID: id, Kind: keel.SpanHuman, Status: status, Duration: e.cfg.Now().Sub(j.askedAt[d.CallID]), Error: d.Reason,
		Attrs: toolAttrs(asked.Policy, d.CallID, nil, nil, nil)}
	if err := e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), sp); err != nil {
		e.log.Warn("close the approval span", logkey.Run, id, logkey.Err, err)
	}
	if _, err := e.appendEvent(ctx, id, keel.EventApproval, d, nil); err != nil {
		return run, err
	}
	if err := e.launchAnswered(run); err != nil {
		return run, err
	}
	return e.cfg.Store.GetRun(ctx, id)
}
