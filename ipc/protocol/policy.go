package protocol

import "github.com/keel-runtime/keel"

// Method names of the policy group.
const (
	MethodPolicyShow    = "policy.show"
	MethodPolicyExplain = "policy.explain"
)

// Kinds of action policy.explain decides.
const (
	PolicyKindTool      = keel.PolicyKindTool
	PolicyKindModel     = keel.PolicyKindModel
	PolicyKindKnowledge = keel.PolicyKindKnowledge
)

// The policy group's wire types are the root package's (keel), which
// package policy serves without translation.
type (
	PolicyOrigin        = keel.PolicyOrigin
	PolicyRule          = keel.PolicyRule
	PolicySetting       = keel.PolicySetting
	PolicyShowParams    = keel.PolicyShowParams
	PolicyShowResult    = keel.PolicyShowResult
	PolicyExplainParams = keel.PolicyExplainParams
	PolicyExplainResult = keel.PolicyExplainResult
)

// MethodRunDeclassify clears a label from what a run's context holds
// (RunDeclassifyParams → RunDeclassifyResult), journaled as
// labels.declassified with who and why.
const MethodRunDeclassify = "run.declassify"

// RunDeclassifyParams is the params of run.declassify.
type RunDeclassifyParams = keel.DeclassifyRequest

// RunDeclassifyResult is the result of run.declassify: what
// labels.declassified journaled.
type RunDeclassifyResult = keel.DeclassifyData

// DeclassifiedByDefault is who a run.declassify is recorded as when it
// names no one and its client did not name itself in initialize.
const DeclassifiedByDefault = "user"
