package keel

import "encoding/json"

// The policy's answers as the protocol carries them (policy.show,
// policy.explain); package policy serves them, ipc/protocol aliases them.

// Kinds of action policy.explain decides.
const (
	PolicyKindTool      = "tool"
	PolicyKindModel     = "model"
	PolicyKindKnowledge = "knowledge"
)

// PolicyOrigin is where a rule or setting is: its layer (managed,
// workspace, user, run) and the file (or name, such as
// "--require-approval"), line and column it is written at.
type PolicyOrigin struct {
	Layer string `json:"layer"`
	File  string `json:"file"`
	// Line and Col are 0 for a whole file (PolicyShowResult.Files).
	Line int `json:"line,omitempty"`
	Col  int `json:"col,omitempty"`
}

// PolicyRule is one rule of the effective policy.
type PolicyRule struct {
	PolicyOrigin
	// N is the rule's position in its file's rules, from 1.
	N        int    `json:"n"`
	Action   string `json:"action"`   // tool, model, egress, knowledge, telemetry
	Decision string `json:"decision"` // allow, ask, deny
	Reason   string `json:"reason,omitempty"`
	// Text is the rule as written in its file.
	Text string `json:"text"`
}

// PolicySetting is a setting (cloud, clear.LABEL, default.KIND,
// egress_after_labels) or a lock of one, and where it is.
type PolicySetting struct {
	PolicyOrigin
	Key string `json:"key"`
}

// PolicyShowResult is the effective policy: the policy in force for
// the daemon's runs, with the run layer of --require-approval.
type PolicyShowResult struct {
	// Version and Digest identify the policy in force (what a decision
	// journals).
	Version uint64 `json:"version"`
	Digest  string `json:"digest"`
	// Files are the layer files in force, in precedence order.
	Files []PolicyOrigin `json:"files"`
	// Rules are every rule, in precedence order.
	Rules []PolicyRule `json:"rules"`
	// Locks are the settings the managed layer locked.
	Locks []PolicySetting `json:"locks"`
	// Warnings are the problems that did not stop the files loading.
	Warnings []string `json:"warnings"`
	// Error is set while the files on disk do not load; the last good
	// policy (the one shown) stays in force meanwhile.
	Error string `json:"error,omitempty"`
}

// PolicyShowParams are the params of policy.show, all optional.
type PolicyShowParams struct {
	// Workspace, an absolute directory, shows the policy of the runs
	// naming it: with its .keel/policy.json. Empty: the policy of runs
	// that name no workspace.
	Workspace string `json:"workspace,omitempty"`
}

// PolicyExplainParams name an action for policy.explain: a tool call
// (Kind "tool": Tool and Args, a JSON object) or a model call (Kind
// "model": Provider and Model). RunID, optional, decides it as for
// that run (see docs/protocol.md); Workspace, optional, as for a run
// naming that workspace (default: the run's, if RunID names one).
type PolicyExplainParams struct {
	Kind     string          `json:"kind"`
	Tool     string          `json:"tool,omitempty"`
	Args     json.RawMessage `json:"args,omitempty"`
	Provider string          `json:"provider,omitempty"`
	Model    string          `json:"model,omitempty"`
	// Scope is the knowledge scope read (kind knowledge): the run's own
	// (its workspace's, with Workspace or the run's; its run scope, with
	// RunID) is readable with no rule.
	Scope     string `json:"scope,omitempty"`
	RunID     string `json:"run_id,omitempty"`
	Workspace string `json:"workspace,omitempty"`
}

// PolicyExplainResult is the policy's decision about an action and why.
type PolicyExplainResult struct {
	Decision string `json:"decision"` // allow, ask, deny
	// Explanation says what decided, with its layer and file:line:col.
	Explanation string `json:"explanation"`
	// Rule is the rule that decided, if one did; Setting the setting
	// that did, if one did. Neither: nothing had a verdict.
	Rule    *PolicyRule    `json:"rule,omitempty"`
	Setting *PolicySetting `json:"setting,omitempty"`
	Version uint64         `json:"version"`
	Digest  string         `json:"digest"`
}
