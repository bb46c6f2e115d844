package protocol

import (
	"encoding/json"

	"github.com/keel-runtime/keel"
)

// Taking a run over, handing it back, running a tool on its behalf, and
// forking it. These are served by backends whose runs support them (see
// ipc.RunSteerer).
const (
	// MethodRunTakeOver gives the caller's person control of a run
	// (RunControlParams): it stops advancing at its next step boundary
	// and only run.handback lets it go on. Event human.takeover.
	MethodRunTakeOver = "run.takeover"
	// MethodRunHandBack returns control (RunControlParams; the note is a
	// message the model reads). Event human.handback.
	MethodRunHandBack = "run.handback"
	// MethodRunTool runs one of the run's tools on its behalf while it is
	// taken over and not advancing (RunToolParams → RunToolResult). Event
	// human.tool; the model reads the outcome when the run is handed back.
	MethodRunTool = "run.tool"
	// MethodRunFork starts a new run from another's journal up to and
	// including a step (RunForkParams → the new keel.Run). Event
	// run.forked opens the new run's journal.
	MethodRunFork = "run.fork"
)

// RunControlParams is the params of run.takeover and run.handback.
type RunControlParams struct {
	RunID keel.RunID `json:"run_id"`
	Note  string     `json:"note,omitempty"`
}

// RunToolParams is the params of run.tool.
type RunToolParams struct {
	RunID     keel.RunID      `json:"run_id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// RunToolResult is the result of run.tool: the call as journaled, with
// its output or its classified error (a failed tool is a result, not a
// JSON-RPC error).
type RunToolResult = keel.HumanToolData

// RunForkParams is the params of run.fork.
type RunForkParams = keel.ForkRequest
