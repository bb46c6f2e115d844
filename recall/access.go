package recall

import (
	"slices"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/knowledge"
	"github.com/keel-runtime/keel/policy"
)

// ScopeUser is the user's own scope, readable by a run only where a
// rule allows it.
const ScopeUser knowledge.Scope = "user"

// WorkspaceScope is the scope of the workspace at root (an absolute
// path).
func WorkspaceScope(root string) knowledge.Scope { return knowledge.Scope("workspace:" + root) }

// RunScope is run id's own scope.
func RunScope(id keel.RunID) knowledge.Scope { return knowledge.Scope("run:" + string(id)) }

// OwnScopes are the scopes of run itself: its workspace's, when it names
// one, and its run scope.
func OwnScopes(run keel.Run) []knowledge.Scope {
	var out []knowledge.Scope
	if run.Workspace != "" {
		out = append(out, WorkspaceScope(run.Workspace))
	}
	return append(out, RunScope(run.ID))
}

// emptyPolicy decides for a daemon with no policy at all: its built-in
// rules still hold (a run reads only its own scopes).
var emptyPolicy, _ = policy.Compile(policy.Options{})

// decide is the policy's decision about run reading scope.
func decide(p *policy.Policy, run keel.Run, scope knowledge.Scope) policy.Decision {
	if p == nil {
		p = emptyPolicy
	}
	return p.Decide(&policy.Action{Kind: policy.KindKnowledge, Scope: string(scope), Own: slices.Contains(OwnScopes(run), scope)})
}

// scopeLabels are the labels of what scope holds beyond its own: those
// the policy's sources give it.
func scopeLabels(p *policy.Policy, scope knowledge.Scope) policy.LabelSet {
	if p == nil {
		return policy.LabelSet{}
	}
	return p.LabelsOf(policy.Source{Kind: policy.SourceScope, Name: string(scope)})
}
