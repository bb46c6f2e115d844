package protocol

import (
	"encoding/json"
	"time"

	"github.com/keel-runtime/keel"
)

// Model calls without a run: an IDE asks the model layer for a reply
// (text, or JSON valid against a schema) and gets it streamed. The call
// goes through the same router as a run's calls: routing, cloud policy,
// limits, retries, the daily budget.
const (
	MethodModelsChat = "models.chat"
	// NotifyModelsChatDelta carries one ChatDelta of a models.chat in
	// flight to the connection that asked.
	NotifyModelsChatDelta = "models.chat.delta"
)

// ChatMessage is one message of a models.chat conversation.
type ChatMessage = keel.ChatMessage

// ModelsChatParams asks for one reply.
type ModelsChatParams = keel.ChatRequest

// ChatDelta is the params of a models.chat.delta notification.
type ChatDelta struct {
	ID      json.RawMessage `json:"id"` // of the models.chat request
	Content string          `json:"content"`
	// Restart voids the deltas before it (a retry after a broken stream).
	Restart bool `json:"restart,omitempty"`
}

// ModelsChatResult is the reply of models.chat with its accounting.
type ModelsChatResult = keel.ChatReply

// Millis expresses d in milliseconds for the wire.
func Millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Run control beyond start and cancel. run.decide answers a waiting run:
// it names the tool call the run waits on (run.waiting's call) and what to
// do about it. run.pause stops a running run at its next step boundary;
// run.resume lets a paused run go on. Both take a RunRef.
const (
	MethodRunDecide = "run.decide"
	MethodRunPause  = "run.pause"
	MethodRunResume = "run.resume"
	// MethodRunReplay runs a finished run again from its journal without
	// calling any model or tool, and compares (RunReplayResult).
	MethodRunReplay = "run.replay"
	// MethodRunApprove answers an approval.requested: approve (the exact
	// arguments shown, named by their hash; optionally edited) or deny
	// with a reason the model sees.
	MethodRunApprove = "run.approve"
	// MethodRunSay gives a run a person's message (RunSayParams), which
	// the model reads before its next step.
	MethodRunSay = "run.say"
)

// RunSayParams is the params of run.say.
type RunSayParams struct {
	RunID   keel.RunID `json:"run_id"`
	Message string     `json:"message"`
	// Labels are the message's labels (label names): they enter the
	// run's context with it, and human.message carries them.
	Labels []string `json:"labels,omitempty"`
}

// RunApproveParams is the params of run.approve.
type RunApproveParams struct {
	RunID      keel.RunID `json:"run_id"`
	CallID     string     `json:"call_id"`
	ArgsSHA256 string     `json:"args_sha256"`
	Approved   bool       `json:"approved"`
	Reason     string     `json:"reason,omitempty"`
	// Arguments, when set with approved, replace the call's arguments.
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// RunReplayResult is the result of run.replay.
type RunReplayResult = keel.ReplayCheck

// AlreadyDecided is the data of the -32002 (CodeConflict) error of a
// run.decide or run.approve whose wait another decision already
// answered: that decision (retry, skip, done; approved or denied) and
// the journal event that recorded it. The refused one was not recorded.
type AlreadyDecided struct {
	RunID    keel.RunID `json:"run_id"`
	CallID   string     `json:"call_id"`
	Decision string     `json:"decision"`
	Seq      int64      `json:"seq"`
}

// RunDecideParams is the params of run.decide. Decision is "retry" (run
// the call again), "skip" (do not; the model is told) or "done" (it did
// happen; Output, if given, is its result).
type RunDecideParams struct {
	RunID    keel.RunID      `json:"run_id"`
	CallID   string          `json:"call_id"`
	Decision string          `json:"decision"`
	Output   json.RawMessage `json:"output,omitempty"`
	Note     string          `json:"note,omitempty"`
}
