package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/policy"
)

// openPolicy loads the policy files (the managed layer's, Config.
// ManagedPolicyFile, and the user layer's, policy.json in the data
// directory) and watches them: an edit applies from the next decision;
// a file that stops loading keeps the last good policy in force and is
// logged with its file and line. A missing file is no file. Files that
// do not load at start fail it: there is no last good policy to keep.
func openPolicy(cfg Config, log *slog.Logger) (*policy.Watcher, error) {
	home, _ := os.UserHomeDir()
	w, err := policy.NewWatcher(policy.WatcherConfig{
		Paths:   policy.Paths{Managed: cfg.ManagedPolicyFile, User: policy.UserPath(cfg.DataDir)},
		Options: policy.DefaultOptions(home),
		OnEvent: func(ev policy.Event) {
			if ev.Err != nil {
				log.Error("the policy files do not load; the last good policy stays in force", logkey.Version, ev.Version, logkey.Err, ev.Err)
			} else {
				log.Info("policy reloaded", logkey.Version, ev.Version, logkey.Digest, ev.Policy.Digest())
			}
			if cfg.OnPolicy != nil {
				cfg.OnPolicy(ev)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	for _, warn := range w.Current().Policy.Warnings() {
		log.Warn("policy", logkey.Warning, warn.String())
	}
	return w, nil
}

// policyState declares the policy in force for env.describe.
func policyState(snap policy.Snapshot) *capabilities.PolicyState {
	st := &capabilities.PolicyState{Version: snap.Version, Digest: snap.Policy.Digest(), Files: []string{}}
	for _, f := range snap.Policy.Files() {
		st.Files = append(st.Files, f.Layer.String()+" "+f.Name)
	}
	if snap.Err != nil {
		st.Error = snap.Err.Error()
	}
	return st
}

// policyService serves policy.show and policy.explain (ipc.Policy): it
// asks the policy the engine's runs are decided by, and turns its
// answers into wire types. The decisions are package policy's.
type policyService struct {
	watcher *policy.Watcher
	// effective is the engine's policy (engine.Engine.Policy): the one in
	// force with the --require-approval run layer; nil when none.
	effective func() (*policy.Policy, uint64)
	runs      interface {
		GetRun(ctx context.Context, id keel.RunID) (keel.Run, error)
	}
	sideEffects func(tool string) (keel.SideEffect, bool)
	// targets are the paths and URLs a tool call names, as the engine
	// gives them to the policy (engine.CallTargeter).
	targets func(tool string, args json.RawMessage) keel.CallTargets
	isCloud func(provider string) bool
}

// current returns the policy to show and explain with, its version and
// the error keeping newer files out, if any.
func (s *policyService) current() (*policy.Policy, uint64, error) {
	snap := s.watcher.Current()
	p, version := s.effective()
	if p == nil {
		p, version = snap.Policy, snap.Version
	}
	return p, version, snap.Err
}

func (s *policyService) ShowPolicy(ctx context.Context) (protocol.PolicyShowResult, error) {
	p, version, err := s.current()
	res := protocol.PolicyShowResult{Version: version, Digest: p.Digest(), Files: []protocol.PolicyOrigin{},
		Rules: []protocol.PolicyRule{}, Locks: []protocol.PolicySetting{}, Warnings: []string{}}
	for _, f := range p.Files() {
		res.Files = append(res.Files, protocol.PolicyOrigin{Layer: f.Layer.String(), File: f.Name})
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

func (s *policyService) ExplainPolicy(ctx context.Context, q protocol.PolicyExplainParams) (protocol.PolicyExplainResult, error) {
	var run keel.Run
	if q.RunID != "" {
		r, err := s.runs.GetRun(ctx, keel.RunID(q.RunID))
		if err != nil {
			return protocol.PolicyExplainResult{}, err
		}
		run = r
	}
	a := policy.Action{Provider: q.Provider, Model: q.Model, Tool: q.Tool}
	switch q.Kind {
	case protocol.PolicyKindTool:
		if len(q.Args) > 0 {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(q.Args, &obj); err != nil || obj == nil {
				return protocol.PolicyExplainResult{}, fmt.Errorf("args must be a JSON object: %w", keel.ErrInvalid)
			}
		}
		a.Kind, a.Args = policy.KindTool, q.Args
		a.SideEffect, _ = s.sideEffects(q.Tool)
		if s.targets != nil {
			t := s.targets(q.Tool, q.Args)
			a.Paths, a.Base, a.Resolve, a.URLs = t.Paths, t.Base, t.Resolve, t.URLs
		}
	case protocol.PolicyKindModel:
		a.Kind, a.Cloud = policy.KindModel, s.isCloud(q.Provider)
		if run.Policy.Private {
			a.Labels = policy.Labels(policy.Private)
		}
	default:
		return protocol.PolicyExplainResult{}, fmt.Errorf("kind %q: %w", q.Kind, keel.ErrInvalid)
	}
	p, version, _ := s.current()
	d := p.Decide(&a)
	res := protocol.PolicyExplainResult{Decision: d.Outcome.String(), Explanation: d.String(), Version: version, Digest: p.Digest()}
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

func wireRule(r *policy.Rule) protocol.PolicyRule {
	return protocol.PolicyRule{PolicyOrigin: protocol.PolicyOrigin{Layer: r.Layer.String(), File: r.File, Line: r.Line, Col: r.Col},
		N: r.N, Action: r.Kind.String(), Decision: r.Outcome.String(), Reason: r.Reason, Text: r.Text()}
}

func wireSetting(s *policy.Setting) protocol.PolicySetting {
	return protocol.PolicySetting{PolicyOrigin: protocol.PolicyOrigin{Layer: s.Layer.String(), File: s.File, Line: s.Line, Col: s.Col}, Key: s.Key}
}
