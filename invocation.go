package keel

import "encoding/json"

// ToolInvocation is one call of a tool, saying who makes it: the run,
// step and call it answers, or none. A direct call (a client's
// tools.call, outside any run) has a zero Run, Step and CallID.
type ToolInvocation struct {
	Run    RunID
	Step   int
	CallID string // the model's (or a person's) ID of the call within the run
	Name   string // the tool
	// Client names who asked for a direct call (no run), as the client
	// declared it, for the audit trail: such as "mcp:Claude Desktop" for
	// an MCP client through keel's MCP server. Empty for a run's call
	// and for a keel protocol client that named no one.
	Client string
	// Args is the call's input, a JSON object; empty counts as {}.
	Args json.RawMessage
	// Touched, when not nil, is filled in by the tool host with what the
	// call reached (files opened, hosts contacted, the labels the host
	// gives its output). Interceptors pass it on unchanged.
	Touched *Touched
	// SpanID is the ID of the call's span in the run's trace (set by
	// the engine; empty for a direct call): a tool host may record spans
	// of its own under it, such as the knowledge_search tool's retrieval
	// span. Interceptors pass it on unchanged.
	SpanID string
	// Egress, when not nil, is asked before each network request the
	// call makes (see EgressCheck); nil allows every request the tool's
	// grants allow.
	Egress EgressCheck
	// Policy, when not nil, is the policy's decision that let the call
	// run (a rule's allow, or an ask a person approved), for the audit
	// trail; the engine sets it. Interceptors pass it on unchanged; the
	// tool host ignores it.
	Policy *PolicyDecision
	// LabelsOf, when not nil, gives the labels of the call's output from
	// what it touched (the engine's: Touched.Labels with the policy's
	// sources of the paths it opened), for the audit trail; nil: the
	// labels the host gave it (Touched.Labels). It is called after the
	// call, on the call's goroutine, and must be safe for concurrent use.
	LabelsOf func(*Touched) []string
}

// ModelInvocation is one model call a run makes: the model answering a
// step, or planning a flow run's steps.
type ModelInvocation struct {
	Run  RunID
	Step int
	// Model is the model or route the run asked for; the one that
	// answered may differ (a route's choice).
	Model string
}
