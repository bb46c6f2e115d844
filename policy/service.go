package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/keel-runtime/keel"
)

// Service serves policy.show and policy.explain (ipc.Policy) in the
// root package's wire types: it shows the policy a daemon's runs are
// decided by and decides a described action with it. Its fields are the
// layers' parts it needs; it is safe for concurrent use when they are.
type Service struct {
	// Watcher holds the layer files in force (and the error keeping newer
	// ones out).
	Watcher *Watcher
	// Effective returns the policy runs of a workspace ("": none) are
	// decided by (the engine's, with the --require-approval run layer)
	// and its version; a nil policy means the Watcher's.
	Effective func(workspace string) (*Policy, uint64)
	// RunEffective, when set, returns the policy a run's calls are
	// decided by (Effective's for its workspace with the run's own
	// rules, keel.RunPolicy.Rules) and its version: policy.explain for
	// a run decides with it. A nil policy means Effective's.
	RunEffective func(run keel.Run) (*Policy, uint64)
	// Runs finds a run named by policy.explain.
	Runs interface {
		GetRun(ctx context.Context, id keel.RunID) (keel.Run, error)
	}
	// SideEffects gives a tool's declared side-effect class.
	SideEffects func(tool string) (keel.SideEffect, bool)
	// Targets, when set, gives the paths and URLs a tool call names, as
	// a run's call gives them to the policy.
	Targets func(tool string, args json.RawMessage) keel.CallTargets
	// IsCloud tells a cloud provider from a local one.
	IsCloud func(provider string) bool
	// ContextLabels, when set, gives the labels a run's context holds
	// now (the engine's): policy.explain for a run decides with them.
	// Unset, a run holds the labels it started with (private, if it was
	// started private, and its inputs' labels).
	ContextLabels func(ctx context.Context, id keel.RunID) ([]string, error)
}

// current returns the policy to show and explain with for runs of
// workspace ws ("": none), its version and the error keeping newer
// files out, if any. A workspace no run uses is read now (version 0).
func (s *Service) current(ws string) (*Policy, uint64, error) {
	if ws != "" && !filepath.IsAbs(ws) {
		return nil, 0, fmt.Errorf("workspace %q is not an absolute path: %w", ws, keel.ErrInvalid)
	}
	ws = filepath.Clean(ws)
	if ws == "." {
		ws = ""
	}
	snap := s.Watcher.CurrentFor(ws)
	p, version := s.Effective(ws)
	if p == nil {
		p, version = snap.Policy, snap.Version
	}
	return p, version, snap.Err
}

// ShowPolicy returns the effective policy of the runs of q.Workspace
// (none if empty): its files, rules, locks and warnings, each with its
// origin. A workspace that is not an absolute path is keel.ErrInvalid; a
// workspace file that does not load is shown as Error, with the policy
// without it.
func (s *Service) ShowPolicy(ctx context.Context, q keel.PolicyShowParams) (keel.PolicyShowResult, error) {
	p, version, err := s.current(q.Workspace)
	if p == nil {
		return keel.PolicyShowResult{}, err
	}
	res := keel.PolicyShowResult{Version: version, Digest: p.Digest(), Files: []keel.PolicyOrigin{},
		Rules: []keel.PolicyRule{}, Locks: []keel.PolicySetting{}, Warnings: []string{}}
	for _, f := range p.Files() {
		res.Files = append(res.Files, keel.PolicyOrigin{Layer: f.Layer.String(), File: f.Name})
	}
	for _, r := range p.Rules() {
		res.Rules = append(res.Rules, wireRule(r))
	}
	for _, l := range p.Locks() {
		res.Locks = append(res.Locks, wireSetting(l))
	}
	for _, w := range p.Warnings() {
		res.Warnings = append(res.Warnings, w.String())
	}
	if err != nil {
		res.Error = err.Error()
	}
	return res, nil
}

// ExplainPolicy decides the action q describes as a run would, and says
// why. A malformed q is keel.ErrInvalid; an unknown run, Runs' error.
func (s *Service) ExplainPolicy(ctx context.Context, q keel.PolicyExplainParams) (keel.PolicyExplainResult, error) {
	var labels LabelSet
	var run *keel.Run
	if q.RunID != "" {
		r, ls, err := s.runLabels(ctx, keel.RunID(q.RunID))
		if err != nil {
			return keel.PolicyExplainResult{}, err
		}
		labels, run = ls, &r
		if q.Workspace == "" {
			q.Workspace = r.Workspace
		}
	}
	a := Action{Provider: q.Provider, Model: q.Model, Tool: q.Tool, Labels: labels}
	switch q.Kind {
	case keel.PolicyKindTool:
		if len(q.Args) > 0 {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(q.Args, &obj); err != nil || obj == nil {
				return keel.PolicyExplainResult{}, fmt.Errorf("args must be a JSON object: %w", keel.ErrInvalid)
			}
		}
		a.Kind, a.Args = KindTool, q.Args
		a.SideEffect, _ = s.SideEffects(q.Tool)
		if s.Targets != nil {
			t := s.Targets(q.Tool, q.Args)
			a.Paths, a.Base, a.Resolve, a.URLs, a.Unresolvable = t.Paths, t.Base, t.Resolve, t.URLs, t.Unresolvable
		}
	case keel.PolicyKindModel:
		a.Kind, a.Cloud = KindModel, s.IsCloud(q.Provider)
	case keel.PolicyKindKnowledge:
		// A run's own scopes: its workspace's and its run scope.
		a.Kind, a.Scope = KindKnowledge, q.Scope
		a.Own = q.Workspace != "" && q.Scope == "workspace:"+filepath.Clean(q.Workspace) || run != nil && q.Scope == "run:"+string(run.ID)
	default:
		return keel.PolicyExplainResult{}, fmt.Errorf("kind %q: %w", q.Kind, keel.ErrInvalid)
	}
	p, version, err := s.current(q.Workspace)
	if p == nil {
		return keel.PolicyExplainResult{}, err
	}
	if run != nil && s.RunEffective != nil {
		// The run's own rules too, on the policy of the workspace asked
		// about.
		r := *run
		r.Workspace = filepath.Clean(q.Workspace)
		if r.Workspace == "." {
			r.Workspace = ""
		}
		if rp, v := s.RunEffective(r); rp != nil {
			p, version = rp, v
		}
	}
	d := p.Decide(&a)
	res := keel.PolicyExplainResult{Decision: d.Outcome.String(), Explanation: d.String(), Version: version, Digest: p.Digest()}
	if r := d.Rule(); r != nil {
		w := wireRule(r)
		res.Rule = &w
	}
	if st := d.Setting(); st != nil {
		w := wireSetting(st)
		res.Setting = &w
	}
	return res, nil
}

// runLabels returns run id and the labels its context holds:
// ContextLabels', or, without it, those the run started with.
func (s *Service) runLabels(ctx context.Context, id keel.RunID) (keel.Run, LabelSet, error) {
	run, err := s.Runs.GetRun(ctx, id)
	if err != nil {
		return keel.Run{}, LabelSet{}, err
	}
	names := run.Policy.Labels
	if s.ContextLabels != nil {
		if names, err = s.ContextLabels(ctx, id); err != nil {
			return keel.Run{}, LabelSet{}, err
		}
	} else if run.Policy.Private {
		names = append([]string{string(Private)}, names...)
	}
	ls := make([]Label, len(names))
	for i, n := range names {
		ls[i] = Label(n)
	}
	return run, Labels(ls...), nil
}

// ErrEgressRefused is wrapped by the error of a DirectEgress check that
// refuses a request.
var ErrEgressRefused = errors.New("network request refused by the policy")

// DirectEgress returns the check of the network requests of a call of
// tool made directly, in no run (tools.call): the policy in force when
// each request is made decides it as egress of tool to that
// destination, with no labels (no run's context is involved). Anything
// but allow refuses the request, ask too: a direct call has no run to
// wait in for a person's approval. The error wraps ErrEgressRefused
// and a *keel.EgressRefusal with the decision (the call then fails with
// policy_denied, and the tool host records the refusal for the audit
// trail). Safe for concurrent use.
func (s *Service) DirectEgress(tool string) keel.EgressCheck {
	return func(ctx context.Context, dest string) error {
		p, version, _ := s.current("")
		d := p.Decide(&Action{Kind: KindEgress, Tool: tool, Destination: dest})
		if d.Outcome == Allow {
			return nil
		}
		r := &keel.EgressRefusal{Tool: tool, Destination: dest,
			Decision: keel.PolicyDecision{Outcome: d.Outcome.String(), Explanation: d.String(), Version: version, Digest: p.Digest()}}
		if d.Outcome == Ask {
			return fmt.Errorf("%w: %w (a direct tool call cannot wait for approval; call the tool in a run)", ErrEgressRefused, r)
		}
		return fmt.Errorf("%w: %w", ErrEgressRefused, r)
	}
}

func wireRule(r *Rule) keel.PolicyRule {
	return keel.PolicyRule{PolicyOrigin: keel.PolicyOrigin{Layer: r.Layer.String(), File: r.File, Line: r.Line, Col: r.Col},
		N: r.N, Action: r.Kind.String(), Decision: r.Outcome.String(), Reason: r.Reason, Text: r.Text()}
}

func wireSetting(s *Setting) keel.PolicySetting {
	return keel.PolicySetting{PolicyOrigin: keel.PolicyOrigin{Layer: s.Layer.String(), File: s.File, Line: s.Line, Col: s.Col}, Key: s.Key}
}
