package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/policy"
)

// Policy is the policy the engine consults before every tool call and
// model call of a run: the one in force now for the run's workspace,
// with its version (*policy.Watcher is one). Its methods must be safe for
// concurrent use; CurrentFor must be cheap: it is called once per
// decision.
type Policy interface {
	// Current is the policy in force for runs that name no workspace.
	Current() policy.Snapshot
	// CurrentFor is the policy in force for runs of the workspace at
	// root ("": Current): the workspace's layer with the others.
	CurrentFor(root string) policy.Snapshot
	// Use puts root's workspace layer in force (and keeps it current)
	// until release is called; the engine uses the workspace of each
	// run from its start, or its loop's relaunch, to the loop's end. It
	// fails, with the file and line, when the layer does not load.
	Use(root string) (release func(), err error)
}

// CallTargeter is implemented by Tools that can say which of a call's
// arguments name files and URLs (the tool's input schema marks them:
// "format": "path", "uri" or "uri-reference") and where those files are:
// the engine gives them to the policy, for its path and url rules. The
// engine asks it before a tool call the policy decides; it must be
// safe for concurrent use. The engine skips it when no path or url
// rule of the policy could look at the call (policy.NeedsTargets) and
// the call is not decided as egress. Tools that do not implement it give
// the policy no paths and no URLs: path and url rules then match none of
// their calls.
type CallTargeter interface {
	CallTargets(name string, args json.RawMessage) keel.CallTargets
}

// policyCache holds the effective policies: each policy in force (the
// one of no workspace, of each workspace in use) with the run layer
// (Config.RequireApproval) added, compiled again only when the policy in
// force changes. It holds at most maxEffective; past that it starts
// again, so policies no longer in force do not pile up.
type policyCache struct {
	mu  sync.Mutex
	eff map[*policy.Policy]*policy.Policy // by the Snapshot's policy
}

const maxEffective = 64

// runPolicy is what the engine knows of the policy of a live run (from
// its start or its loop's launch in this engine until it ends, waits and
// pauses included): its workspace's use (Policy.Use), so that the
// workspace's file stays watched and its last good policy kept, and the
// policy it last journaled as in force, so that a change is journaled
// (policy.changed) before the first decision that uses it.
type runPolicy struct {
	workspace string
	release   func()

	mu     sync.Mutex
	digest string // of the effective policy last noted; "" none yet
	err    string // the reload error last journaled
}

// recorded is what a replay decides from: the decisions the journal
// holds, by call (tool calls) and by step (model calls, in order),
// instead of the policy in force now.
type recorded struct {
	policy    map[string]*keel.PolicyDecision
	asked     map[string]bool
	approvals map[string]keel.ApprovalData
	models    map[int][][]keel.ModelDecision
	labels    map[string][]string // the labels journaled with each tool result
}

// modelDecisions returns the decisions journaled with the next model
// result of step.
func (r *recorded) modelDecisions(step int) []keel.ModelDecision {
	q := r.models[step]
	if len(q) == 0 {
		return nil
	}
	r.models[step] = q[1:]
	return q[0]
}

// Policy returns the policy the engine's runs of workspace root ("":
// none) are decided by (the policy in force with the run layer of
// Config.RequireApproval) and its version; nil when there is none, and
// every call is allowed. Safe for concurrent use.
func (e *Engine) Policy(root string) (*policy.Policy, uint64) {
	p, snap := e.effective(root)
	return p, snap.Version
}

// snapshot returns the policy in force for runs of workspace root.
func (e *Engine) snapshot(root string) policy.Snapshot {
	if e.cfg.Policy == nil {
		return policy.Snapshot{}
	}
	return e.cfg.Policy.CurrentFor(root)
}

// effective returns the policy a call of a run of workspace root is
// decided by, with the snapshot of the policy in force it comes from, or
// nil when there is none (no Config.Policy and no
// Config.RequireApproval): every call is then allowed and nothing is
// recorded.
func (e *Engine) effective(root string) (*policy.Policy, policy.Snapshot) {
	snap := e.snapshot(root)
	if e.runLayer == nil {
		return snap.Policy, snap
	}
	e.pol.mu.Lock()
	defer e.pol.mu.Unlock()
	if eff := e.pol.eff[snap.Policy]; eff != nil {
		return eff, snap
	}
	base := snap.Policy
	if base == nil {
		base = e.emptyPolicy
	}
	eff, err := base.WithRun(*e.runLayer)
	if err != nil {
		// The run layer compiled alone at New, but not with these files
		// (it sets what a lock forbids): keep the files' policy rather
		// than none.
		e.log.Warn("policy: add the run layer", logkey.Err, err)
		eff = base
	}
	if len(e.pol.eff) >= maxEffective || e.pol.eff == nil {
		e.pol.eff = map[*policy.Policy]*policy.Policy{}
	}
	e.pol.eff[snap.Policy] = eff
	return eff, snap
}

// policyFor returns the policy a call of run is decided by now, and its
// version, after journaling policy.changed if it is not the one the run
// last noted (see notePolicy). Nil: every call is allowed.
func (e *Engine) policyFor(ctx context.Context, run keel.Run) (*policy.Policy, uint64) {
	p, snap := e.effective(run.Workspace)
	if p != nil {
		e.notePolicy(ctx, run.ID, p, snap)
	}
	return p, snap.Version
}

// notePolicy journals policy.changed for run id if p, the policy in force
// for it, is not the one it last noted, or snap carries a reload error it
// has not journaled yet; the first policy a run notes is journaled only
// when its journal showed another (see notedInJournal). A run that is
// not live in this engine (see runPolicy) notes nothing. Safe for
// concurrent use; a failed append is logged.
func (e *Engine) notePolicy(ctx context.Context, id keel.RunID, p *policy.Policy, snap policy.Snapshot) {
	if e.replay != nil {
		return
	}
	e.mu.Lock()
	rp := e.runPol[id]
	e.mu.Unlock()
	if rp == nil {
		return
	}
	digest, errText := p.Digest(), ""
	if snap.Err != nil {
		errText = snap.Err.Error()
	}
	rp.mu.Lock()
	defer rp.mu.Unlock()
	switch {
	case rp.digest == "" && errText == "":
		rp.digest = digest
		return
	case rp.digest == digest && rp.err == errText:
		return
	}
	d := keel.PolicyChangeData{Version: snap.Version, Digest: digest, Error: errText}
	if _, err := e.appendEvent(ctx, id, keel.EventPolicyChanged, d, nil); err != nil {
		e.log.Warn("journal a policy change", logkey.Run, id, logkey.Err, err)
		return
	}
	rp.digest, rp.err = digest, errText
}

// PolicyChanged journals policy.changed in every live run (see
// runPolicy; a waiting or paused one too) whose policy is the one of
// workspace root ("": the runs that name none), when it is not the one
// the run last noted: call it when the policy in force changed or a
// policy file stopped loading (policy.WatcherConfig.OnEvent). Runs
// resumed by a later daemon note a change at their next decision. Safe
// for concurrent use.
func (e *Engine) PolicyChanged(ctx context.Context, root string) {
	e.mu.Lock()
	var ids []keel.RunID
	for id, rp := range e.runPol {
		if rp.workspace == root {
			ids = append(ids, id)
		}
	}
	e.mu.Unlock()
	p, snap := e.effective(root)
	if p == nil {
		return
	}
	for _, id := range ids {
		e.notePolicy(ctx, id, p, snap)
	}
}

// useWorkspace returns the policy of run, about to start or go on in
// this engine: it puts the run's workspace layer in force (Policy.Use)
// until the run ends (dropPolicy, when a terminal event is journaled).
// noted is the digest of the policy the run last noted, "" if none. An
// error, the layer not loading (with its file and line), wraps
// keel.ErrInvalid.
func (e *Engine) useWorkspace(run keel.Run, noted string) (*runPolicy, error) {
	rp := &runPolicy{workspace: run.Workspace, release: func() {}, digest: noted}
	if e.cfg.Policy != nil && run.Workspace != "" {
		release, err := e.cfg.Policy.Use(run.Workspace)
		if err != nil {
			return nil, fmt.Errorf("%w: the policy of workspace %s does not load: %w", keel.ErrInvalid, run.Workspace, err)
		}
		rp.release = release
	}
	return rp, nil
}

// notedInJournal tells the runPolicy of run id, whose loop starts again
// from its journal, the digest of the policy the journal last shows in
// force: a different one in force now is journaled (policy.changed)
// before its first decision.
func (e *Engine) notedInJournal(id keel.RunID, digest string) {
	e.mu.Lock()
	rp := e.runPol[id]
	e.mu.Unlock()
	if rp == nil || digest == "" {
		return
	}
	rp.mu.Lock()
	if rp.digest == "" {
		rp.digest = digest
	}
	rp.mu.Unlock()
}

// dropPolicy ends what useWorkspace began for run id. e.mu is held.
func (e *Engine) dropPolicy(id keel.RunID) {
	if rp := e.runPol[id]; rp != nil {
		delete(e.runPol, id)
		rp.release()
	}
}

// labelPolicy is the policy labels of runs of workspace root ("": none)
// are decided by: the effective one, or with none, an empty one, whose
// built-in rules still hold (no label is cleared for a cloud provider;
// egress after labelled data asks).
func (e *Engine) labelPolicy(root string) *policy.Policy {
	if p, _ := e.effective(root); p != nil {
		return p
	}
	return e.emptyPolicy
}

// decideTool asks the policy about a call of run: allow, ask or deny,
// and the decision to record, nil when no rule or setting had anything
// to say (the built-in allow), so that a user without policy files
// journals what they always did. The action carries the labels run's
// context holds; a call of a tool that may reach the network
// (NetworkRequester) while the context holds labels is also decided as
// egress, to each URL the call names (or to an unknown destination when
// it names none), and the strictest decision stands: by default ask
// (egress_after_labels), also with no policy files. A replay decides
// nothing: it reads the journal.
func (e *Engine) decideTool(ctx context.Context, run keel.Run, call keel.ToolCall) (policy.Outcome, *keel.PolicyDecision) {
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
	labels := e.labelsNow(ctx, run)
	egress := labels.Len() > 0 && e.requestsNetwork(call.Name)
	p, version := e.policyFor(ctx, run)
	if p == nil {
		if !egress {
			return policy.Allow, nil
		}
		p = e.emptyPolicy // its built-in egress_after_labels
	}
	class, _ := e.sideEffects(ctx, call.Name)
	a := policy.Action{Kind: policy.KindTool, Tool: call.Name, SideEffect: class, Args: call.Arguments, Labels: labels}
	// The call's paths and URLs matter only to a path or url rule for
	// the tool, or to its egress: working them out parses the arguments.
	if ct, ok := e.cfg.Tools.(CallTargeter); ok && (egress || p.NeedsTargets(call.Name)) {
		t := ct.CallTargets(call.Name, call.Arguments)
		a.Paths, a.Base, a.Resolve, a.URLs, a.Unresolvable = t.Paths, t.Base, t.Resolve, t.URLs, t.Unresolvable
	}
	d := p.Decide(&a)
	if egress {
		dests := a.URLs
		if len(dests) == 0 || a.Unresolvable {
			// unknown: matches only rules that ask or deny
			dests = append(slices.Clip(dests), "")
		}
		for _, dest := range dests {
			if ed := p.Decide(&policy.Action{Kind: policy.KindEgress, Tool: call.Name, Destination: dest, Labels: labels}); ed.Outcome > d.Outcome {
				d = ed
			}
		}
	}
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
// req, by run, goes to each target (models.ChatRequest.Admit): the
// policy's decision about that provider and model, local or cloud, with
// every label the request carries (models.ChatRequest.LabelSet: the
// labels of the context it was built from). Anything but allow refuses
// the target: a model call cannot wait for a person. A decision a rule
// or setting made is appended to *decided, when set, to be recorded with
// the call. With no policy files, a request that carries labels is
// decided by the built-in rules (no label is cleared for a cloud
// provider); one that carries none is admitted everywhere (nil), as in a
// replay (which reads the decisions from the journal).
func (e *Engine) admitModel(ctx context.Context, run keel.Run, req models.ChatRequest, decided *[]keel.ModelDecision) func(provider, model string, cloud bool) error {
	if e.replay != nil {
		return nil
	}
	labels := labelSet(req.LabelSet())
	p, version := e.policyFor(ctx, run)
	if p == nil {
		if labels.Len() == 0 {
			return nil
		}
		p = e.emptyPolicy
	}
	return func(provider, model string, cloud bool) error {
		d := p.Decide(&policy.Action{Kind: policy.KindModel, Provider: provider, Model: model, Cloud: cloud, Labels: labels})
		if d.Outcome == policy.Allow && d.Rule() == nil && d.Setting() == nil {
			return nil
		}
		pd := keel.PolicyDecision{Outcome: d.Outcome.String(), Explanation: d.String(), Version: version, Digest: p.Digest()}
		if decided != nil {
			*decided = append(*decided, keel.ModelDecision{Provider: provider, Model: model, PolicyDecision: pd})
		}
		if d.Outcome == policy.Allow {
			return nil
		}
		return &PolicyRefusal{Decision: pd}
	}
}

// PolicyRefusal is why the policy kept a model call from a target: its
// decision (deny, or ask, which a model call cannot wait for).
type PolicyRefusal struct{ Decision keel.PolicyDecision }

func (e *PolicyRefusal) Error() string {
	return fmt.Sprintf("the policy refused the call (policy version %d): %s", e.Decision.Version, e.Decision.Explanation)
}
