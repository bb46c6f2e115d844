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
type ChatMessage struct {
	Role       string          `json:"role"` // system, user, assistant, tool
	Content    string          `json:"content"`
	ToolCalls  []keel.ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	// Images are base64 (in JSON) PNG or JPEG bytes for vision models.
	Images [][]byte `json:"images,omitempty"`
	// Private content never leaves the machine.
	Private bool `json:"private,omitempty"`
}

// ModelsChatParams asks for one reply.
type ModelsChatParams struct {
	// Model names the model ("keel-tiny", "ollama/keel-tiny") or a route;
	// empty means the route "default".
	Model    string          `json:"model,omitempty"`
	Messages []ChatMessage   `json:"messages"`
	Tools    []keel.ToolSpec `json:"tools,omitempty"`
	// Format, when set, is a JSON Schema the reply must satisfy; replies
	// that break it are repaired (asked again) at most Repairs times.
	Format      json.RawMessage `json:"format,omitempty"`
	Repairs     int             `json:"repairs,omitempty"`
	MaxTokens   int             `json:"max_tokens,omitempty"`
	Temperature *float64        `json:"temperature,omitempty"`
	Seed        *int            `json:"seed,omitempty"`
	AllowCloud  bool            `json:"allow_cloud,omitempty"`
	Private     bool            `json:"private,omitempty"`
	// Stream asks for models.chat.delta notifications.
	Stream bool `json:"stream,omitempty"`
}

// ChatDelta is the params of a models.chat.delta notification.
type ChatDelta struct {
	ID      json.RawMessage `json:"id"` // of the models.chat request
	Content string          `json:"content"`
	// Restart voids the deltas before it (a retry after a broken stream).
	Restart bool `json:"restart,omitempty"`
}

// ModelsChatResult is the reply of models.chat with its accounting.
type ModelsChatResult struct {
	Model            string      `json:"model"`
	Provider         string      `json:"provider"`
	Message          ChatMessage `json:"message"`
	FinishReason     string      `json:"finish_reason,omitempty"`
	PromptTokens     int         `json:"prompt_tokens"`
	CompletionTokens int         `json:"completion_tokens"`
	CostUSD          float64     `json:"cost_usd,omitempty"`
	TTFTMS           float64     `json:"ttft_ms,omitempty"`
	LatencyMS        float64     `json:"latency_ms"`
	Retries          int         `json:"retries,omitempty"`
	Route            string      `json:"route,omitempty"`
	Variant          string      `json:"variant,omitempty"`
	// Attempts is how many replies a structured call took (repairs + 1).
	Attempts int `json:"attempts,omitempty"`
}

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
