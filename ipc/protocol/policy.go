package protocol

import "github.com/keel-runtime/keel"

// Method names of the policy group.
const (
	MethodPolicyShow    = "policy.show"
	MethodPolicyExplain = "policy.explain"
)

// Kinds of action policy.explain decides.
const (
	PolicyKindTool  = keel.PolicyKindTool
	PolicyKindModel = keel.PolicyKindModel
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
