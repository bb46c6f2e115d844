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
	// Args is the call's input, a JSON object; empty counts as {}.
	Args json.RawMessage
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
