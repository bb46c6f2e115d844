package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/policy"
)

// Policy is the policy the engine consults before every tool call of a
// run: the one in force now, with its version (*policy.Watcher is one).
// Current must be safe for concurrent use and cheap: it is called once
// per tool call.
type Policy interface {
	Current() policy.Snapshot
}

// CallTargeter is implemented by Tools that can say which of a call's
// arguments name files and URLs (the tool's input schema marks them:
// "format": "path", "uri" or "uri-reference") and where those files are:
// the engine gives them to the policy, for its path and url rules. The
// engine asks it before every tool call the policy decides; it must be
// safe for concurrent use. Tools that do not implement it give the
// policy no paths and no URLs: path and url rules then match none of
// their calls.
type CallTargeter interface {
	CallTargets(name string, args json.RawMessage) keel.CallTargets
}

// policyCache holds the effective policy: the policy in force with the
// run layer (Config.RequireApproval) added, compiled again only when the
// policy in force changes.
type policyCache struct {
	mu   sync.Mutex
	base *policy.Policy // the Snapshot's policy eff was compiled from
	eff  *policy.Policy
}

// recorded is what a replay decides from: the decisions the journal
// holds, by call, instead of the policy in force now.
type recorded struct {
	policy    map[string]*keel.PolicyDecision
	asked     map[string]bool
	approvals map[string]keel.ApprovalData
}

// Policy returns the policy the engine's runs are decided by (the
// policy in force with the run layer of Config.RequireApproval) and its
// version; nil when there is none, and every call is allowed. Safe for
// concurrent use.
func (e *Engine) Policy() (*policy.Policy, uint64) { return e.effective() }

// effective returns the policy a tool call is decided by and its
// version, or nil when there is none (no Config.Policy and no
// Config.RequireApproval): every call is then allowed and nothing is
// recorded.
func (e *Engine) effective() (*policy.Policy, uint64) {
	var snap policy.Snapshot
	if e.cfg.Policy != nil {
		snap = e.cfg.Policy.Current()
	}
	if snap.Policy == nil && e.runLayer == nil {
		return nil, 0
	}
	e.pol.mu.Lock()
	defer e.pol.mu.Unlock()
	if e.pol.eff != nil && e.pol.base == snap.Policy {
		return e.pol.eff, snap.Version
	}
	eff := snap.Policy
	if e.runLayer != nil {
		base := snap.Policy
		if base == nil {
			base = e.emptyPolicy
		}
		p, err := base.WithRun(*e.runLayer)
		if err != nil {
			// The run layer compiled alone at New; keep the last good
			// effective policy rather than drop --require-approval.
			e.log.Warn("policy: add the run layer", logkey.Err, err)
			if e.pol.eff != nil {
				return e.pol.eff, snap.Version
			}
			p = base
		}
		eff = p
	}
	e.pol.base, e.pol.eff = snap.Policy, eff
	return eff, snap.Version
}

// labelPolicy is the policy labels are decided by: the effective one,
// or with none, an empty one, whose built-in rules still hold (no label
// is cleared for a cloud provider; egress after labelled data asks).
func (e *Engine) labelPolicy() *policy.Policy {
	if p, _ := e.effective(); p != nil {
		return p
	}
	return e.emptyPolicy
}

// decideTool asks the policy about a call: allow, ask or deny, and the
// decision to record, nil when no rule or setting had anything to say
// (the built-in allow), so that a user without policy files journals
// what they always did. A replay decides nothing: it reads the journal.
func (e *Engine) decideTool(ctx context.Context, call keel.ToolCall) (policy.Outcome, *keel.PolicyDecision) {
	if e.replay != nil {
		pd := e.replay.policy[call.ID]
		switch {
		case pd != nil && pd.Outcome == policy.Deny.String():
			return policy.Deny, pd
		case pd != nil && pd.Outcome == policy.Ask.String(), e.replay.asked[call.ID]:
			return policy.Ask, pd
		}
		return policy.Allow, pd
	}
	p, version := e.effective()
	if p == nil {
		return policy.Allow, nil
	}
	class, _ := e.sideEffects(ctx, call.Name)
	a := policy.Action{Kind: policy.KindTool, Tool: call.Name, SideEffect: class, Args: call.Arguments}
	if ct, ok := e.cfg.Tools.(CallTargeter); ok {
		t := ct.CallTargets(call.Name, call.Arguments)
		a.Paths, a.Base, a.Resolve, a.URLs = t.Paths, t.Base, t.Resolve, t.URLs
	}
	d := p.Decide(&a)
	if d.Rule() == nil && d.Setting() == nil && d.Outcome == policy.Allow {
		return policy.Allow, nil
	}
	return d.Outcome, &keel.PolicyDecision{Outcome: d.Outcome.String(), Explanation: d.String(), Version: version, Digest: p.Digest()}
}

// policyDenied records a call the policy denied as a span of its own
// (status error, the decision in its attributes) and returns the result
// to journal: a policy_denied tool error the model sees. The tool does
// not run.
func (e *Engine) policyDenied(ctx context.Context, run keel.Run, step int, call keel.ToolCall, pd *keel.PolicyDecision) (*keel.ToolResultData, error) {
	msg := fmt.Sprintf("the policy denied the call of %s: %s", call.Name, pd.Explanation)
	sp := e.newSpan(run.ID, keel.SpanToolCall, call.Name, step)
	sp.Status, sp.Error, sp.Attrs = keel.SpanError, msg, policyAttrs(pd)
	if err := e.cfg.Store.StartSpan(context.WithoutCancel(ctx), sp); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	if err := e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), sp); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	return &keel.ToolResultData{Step: step, CallID: call.ID, Name: call.Name, Policy: pd,
		Error: &keel.ToolError{Code: keel.ToolPolicyDenied, Message: msg}}, nil
}

// policyAttrs are a span's attributes holding a decision; nil for none.
func policyAttrs(pd *keel.PolicyDecision) json.RawMessage {
	if pd == nil {
		return nil
	}
	b, _ := json.Marshal(struct {
		Policy *keel.PolicyDecision `json:"policy"`
	}{pd})
	return b
}

// admitModel returns the check the model layer makes before a call of
// req goes to each target (models.ChatRequest.Admit): the policy's
// decision about that provider and model, local or cloud, with the
// labels the request's context holds (private, when the run or a
// message of it is private). Anything but allow refuses the target: a
// model call cannot wait for a person. Nil when there is no policy.
func (e *Engine) admitModel(req models.ChatRequest) func(provider, model string, cloud bool) error {
	p, version := e.effective()
	if p == nil || e.replay != nil {
		return nil
	}
	var labels policy.LabelSet
	if req.IsPrivate() {
		labels = policy.Labels(policy.Private)
	}
	return func(provider, model string, cloud bool) error {
		d := p.Decide(&policy.Action{Kind: policy.KindModel, Provider: provider, Model: model, Cloud: cloud, Labels: labels})
		if d.Outcome == policy.Allow {
			return nil
		}
		return &PolicyRefusal{Decision: keel.PolicyDecision{Outcome: d.Outcome.String(), Explanation: d.String(), Version: version, Digest: p.Digest()}}
	}
}

// PolicyRefusal is why the policy kept a model call from a target: its
// decision (deny, or ask, which a model call cannot wait for).
type PolicyRefusal struct{ Decision keel.PolicyDecision }

func (e *PolicyRefusal) Error() string {
	return fmt.Sprintf("the policy refused the call (policy version %d): %s", e.Decision.Version, e.Decision.Explanation)
}
