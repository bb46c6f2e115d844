package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
// one of no workspace, of each workspace in use) with the daemon's run
// layer (Config.RequireApproval) added, and with each run's own rules
// (keel.RunPolicy.Rules) on top, compiled again only when the policy in
// force changes. It holds at most maxEffective policies; past that it
// starts again, so policies no longer in force do not pile up.
type policyCache struct {
	mu  sync.Mutex
	eff map[*policy.Policy]*effEntry // by the Snapshot's policy
	n   int                          // the policies held
}

// effEntry is what one policy in force becomes.
type effEntry struct {
	base *policy.Policy          // with the daemon's run layer; nil until asked for
	runs map[string]runEffective // with a run's rules, by the rules as stored
}

// runEffective is the policy of runs with some rules, or why their
// rules do not compile with the policy in force.
type runEffective struct {
	p   *policy.Policy
	err error
}

// RunRulesFile is the name of a run's own rules (keel.RunPolicy.Rules)
// as a run-layer policy file: explanations name it, "rule 1 of the run
// layer (run.start:3:5)".
const RunRulesFile = "run.start"

const maxEffective = 64

// runPolicy is what the engine knows of the policy of a live run (from
// its start or its loop's launch in this engine until it ends, waits and
// pauses included): its workspace's use (Policy.Use), so that the
// workspace's file stays watched and its last good policy kept, and the
// policy it last journaled as in force, so that a change is journaled
// (policy.changed) before the first decision that uses it.
type runPolicy struct {
	workspace string
	rules     json.RawMessage // the run's own (keel.RunPolicy.Rules)
	release   func()

	mu     sync.Mutex
	digest string // of the effective policy last noted; "" none yet
	err    string // the reload error last journaled
	// allowed is the digest of the policy whose allow decision this run
	// last journaled with a call's intent (see journaledDecision).
	allowed string
}

// journaledDecision is the decision to journal with a call's intent,
// given pd, the one that let it run. Deny and ask are always journaled
// (a resume and a replay need them). An allow is journaled with the
// first call it lets run under a policy (by digest), so that the
// journal shows which policy was in force; later allows under the same
// policy are on the call's span and in the audit record only. Nothing
// is lost: a resume and a replay read a call whose intent is journaled
// as allowed, whatever it records. Journaling every allow's
// explanation and digest cost 2-5% of a step (docs/PERFORMANCE.md).
// Safe for concurrent use.
func (e *Engine) journaledDecision(id keel.RunID, pd *keel.PolicyDecision) *keel.PolicyDecision {
	if pd == nil || pd.Outcome != policy.Allow.String() || e.replay != nil {
		return pd
	}
	e.mu.Lock()
	rp := e.runPol[id]
	e.mu.Unlock()
	if rp == nil {
		return pd
	}
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.allowed == pd.Digest {
		return nil
	}
	rp.allowed = pd.Digest
	return pd
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
	// goesOn holds the steps that answered and yet were followed by
	// another: a fork with a message (keel.ForkRequest.Message) went on.
	goesOn map[int]bool
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
	p, snap := e.effective(root, nil)
	return p, snap.Version
}

// PolicyOf returns the policy run's calls are decided by now: Policy's
// for its workspace with its own rules (keel.RunPolicy.Rules) on top,
// and its version; nil when there is none. Safe for concurrent use.
func (e *Engine) PolicyOf(run keel.Run) (*policy.Policy, uint64) {
	p, snap := e.effective(run.Workspace, run.Policy.Rules)
	return p, snap.Version
}

// snapshot returns the policy in force for runs of workspace root.
func (e *Engine) snapshot(root string) policy.Snapshot {
	if e.cfg.Policy == nil {
		return policy.Snapshot{}
	}
	return e.cfg.Policy.CurrentFor(root)
}

// effective returns the policy a call of a run of workspace root, with
// rules its own (keel.RunPolicy.Rules, as stored; nil for none), is
// decided by, with the snapshot of the policy in force it comes from, or
// nil when there is none (no Config.Policy, no Config.RequireApproval,
// no rules): every call is then allowed and nothing is recorded. Rules
// that do not compile with the policy in force (a lock the managed
// layer set since the run started forbids a setting of theirs) are
// logged, once per policy in force, and left out.
func (e *Engine) effective(root string, rules json.RawMessage) (*policy.Policy, policy.Snapshot) {
	p, snap, _ := e.withRules(root, rules)
	return p, snap
}

// withRules is effective, with the error of rules that do not compile
// (a *policy.FileError naming RunRulesFile, line and column): the policy
// returned then leaves them out.
func (e *Engine) withRules(root string, rules json.RawMessage) (*policy.Policy, policy.Snapshot, error) {
	snap := e.snapshot(root)
	if e.runLayer == nil && len(rules) == 0 {
		return snap.Policy, snap, nil
	}
	e.pol.mu.Lock()
	defer e.pol.mu.Unlock()
	ent := e.pol.eff[snap.Policy]
	if ent != nil {
		if len(rules) == 0 && ent.base != nil {
			return ent.base, snap, nil
		}
		if r, ok := ent.runs[string(rules)]; ok && len(rules) > 0 {
			return r.p, snap, r.err
		}
	}
	if e.pol.n >= maxEffective || e.pol.eff == nil {
		e.pol.eff, e.pol.n, ent = map[*policy.Policy]*effEntry{}, 0, nil
	}
	if ent == nil {
		ent = &effEntry{}
		e.pol.eff[snap.Policy] = ent
	}
	base := snap.Policy
	if base == nil {
		base = e.emptyPolicy
	}
	if ent.base == nil {
		ent.base = base
		if e.runLayer != nil {
			eff, err := base.WithRun(*e.runLayer)
			if err != nil {
				// The run layer compiled alone at New, but not with these
				// files (it sets what a lock forbids): keep the files'
				// policy rather than none.
				e.log.Warn("policy: add the run layer", logkey.Err, err)
			} else {
				ent.base = eff
			}
		}
		e.pol.n++
	}
	if len(rules) == 0 {
		return ent.base, snap, nil
	}
	r := runEffective{p: ent.base}
	var files []policy.LayerFile
	if e.runLayer != nil && ent.base != base {
		files = append(files, *e.runLayer)
	}
	files = append(files, policy.LayerFile{Layer: policy.LayerRun, Name: RunRulesFile, Data: ruleDocument(rules)})
	if eff, err := base.WithRun(files...); err != nil {
		r.err = err
		e.log.Warn("policy: a run's rules do not compile with the policy in force; they are left out", logkey.Err, err)
	} else {
		r.p = eff
	}
	if ent.runs == nil {
		ent.runs = map[string]runEffective{}
	}
	ent.runs[string(rules)] = r
	e.pol.n++
	return r.p, snap, r.err
}

// ruleDocument returns the document of rules as stored (see
// normalizeRules): the object, or the text a JSON string holds.
func ruleDocument(rules json.RawMessage) []byte {
	if len(rules) > 0 && rules[0] == '"' {
		var s string
		if json.Unmarshal(rules, &s) == nil {
			return []byte(s)
		}
	}
	return rules
}

// normalizeRules checks a run's rules as received (keel.RunPolicy.Rules)
// and returns them as they are stored: nil for none (absent or null),
// else as encoding/json writes them (compacted, HTML characters
// escaped), so that the run's policy is the same bytes before a restart
// and after. A JSON string holds the document (its text, with its lines
// and columns); an object is the document itself. Anything else, or a
// document over policy.MaxFileSize, is keel.ErrInvalid.
func normalizeRules(rules json.RawMessage) (json.RawMessage, error) {
	rules = bytes.TrimSpace(rules)
	switch {
	case len(rules) == 0 || string(rules) == "null":
		return nil, nil
	case rules[0] != '"' && rules[0] != '{':
		return nil, fmt.Errorf("policy.rules: want a policy document (a JSON object) or a string holding one: %w", keel.ErrInvalid)
	}
	if !json.Valid(rules) {
		// Say where, as for a file.
		_, err := policy.Compile(policy.Options{}, policy.LayerFile{Layer: policy.LayerRun, Name: RunRulesFile, Data: rules})
		if err == nil {
			err = errors.New("not valid JSON")
		}
		return nil, fmt.Errorf("policy.rules: %w: %w", keel.ErrInvalid, err)
	}
	out, err := json.Marshal(rules)
	if err != nil {
		return nil, fmt.Errorf("policy.rules: %w: %w", keel.ErrInvalid, err)
	}
	if n := len(ruleDocument(out)); n > policy.MaxFileSize {
		return nil, fmt.Errorf("policy.rules: %d bytes, at most %d: %w", n, policy.MaxFileSize, keel.ErrInvalid)
	}
	return out, nil
}

// policyFor returns the policy a call of run is decided by now, and its
// version, after journaling policy.changed if it is not the one the run
// last noted (see notePolicy). Nil: every call is allowed.
func (e *Engine) policyFor(ctx context.Context, run keel.Run) (*policy.Policy, uint64) {
	p, snap := e.effective(run.Workspace, run.Policy.Rules)
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
	type live struct {
		id    keel.RunID
		rules json.RawMessage
	}
	e.mu.Lock()
	var runs []live
	for id, rp := range e.runPol {
		if rp.workspace == root {
			runs = append(runs, live{id, rp.rules})
		}
	}
	e.mu.Unlock()
	for _, r := range runs {
		if p, snap := e.effective(root, r.rules); p != nil {
			e.notePolicy(ctx, r.id, p, snap)
		}
	}
}

// useWorkspace returns the policy of run, about to start or go on in
// this engine: it puts the run's workspace layer in force (Policy.Use)
// until the run ends (dropPolicy, when a terminal event is journaled).
// noted is the digest of the policy the run last noted, "" if none. An
// error, the layer not loading (with its file and line), wraps
// keel.ErrInvalid.
func (e *Engine) useWorkspace(run keel.Run, noted string) (*runPolicy, error) {
	rp := &runPolicy{workspace: run.Workspace, rules: run.Policy.Rules, release: func() {}, digest: noted}
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

// labelPolicy is the policy labels of run are decided by: the effective
// one (its workspace's, with its own rules), or with none, an empty one,
// whose built-in rules still hold (no label is cleared for a cloud
// provider; egress after labelled data asks).
func (e *Engine) labelPolicy(run keel.Run) *policy.Policy {
	if p, _ := e.effective(run.Workspace, run.Policy.Rules); p != nil {
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
// (status error, the decision in its attributes) and in the audit trail
// (Config.Audit), and returns the result
// to journal: a policy_denied tool error the model sees. The tool does
// not run.
func (e *Engine) policyDenied(ctx context.Context, run keel.Run, step int, call keel.ToolCall, pd *keel.PolicyDecision) (*keel.ToolResultData, error) {
	msg := fmt.Sprintf("the policy denied the call of %s: %s", call.Name, pd.Explanation)
	sp := e.newSpan(run.ID, keel.SpanToolCall, call.Name, step)
	sp.Status, sp.Error, sp.Attrs = keel.SpanError, msg, toolAttrs(pd, call.ID, &keel.ToolError{Code: keel.ToolPolicyDenied}, nil, nil)
	if err := e.cfg.Store.StartSpan(context.WithoutCancel(ctx), sp); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	if err := e.cfg.Store.FinishSpan(context.WithoutCancel(ctx), sp); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	res := &keel.ToolResultData{Step: step, CallID: call.ID, Name: call.Name, Policy: pd,
		Error: &keel.ToolError{Code: keel.ToolPolicyDenied, Message: msg}}
	e.auditDenied(ctx, run, step, call, pd, res.Error)
	return res, nil
}

// auditDenied records in Config.Audit a call of run that a decision
// (pd) kept from running, failing with te. A replay records nothing.
func (e *Engine) auditDenied(ctx context.Context, run keel.Run, step int, call keel.ToolCall, pd *keel.PolicyDecision, te *keel.ToolError) {
	if e.cfg.Audit == nil || e.replay != nil {
		return
	}
	e.cfg.Audit.ToolDenied(ctx, keel.ToolInvocation{Run: run.ID, Step: step, CallID: call.ID, Name: call.Name, Args: call.Arguments, Policy: pd}, te)
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
