package keel

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// A plan's step handed to another environment: an edge daemon joined to
// the same cloud, or the cloud, that declares what the step needs when
// this one does not (docs/cloud.md, "Plans that cross environments").
// The parent run journals the hand-off, the other side's acceptance and
// how the step ended there; the step's run lives in the other
// environment's journal.

// StepNeed is what a plan step needs of the environment it runs in.
type StepNeed struct {
	// Tools must all be declared there.
	Tools []string `json:"tools,omitempty"`
	// Model, when set, must be declared there.
	Model string `json:"model,omitempty"`
	// Labels are the labels of the step's inputs (its parent's context):
	// the environment must be allowed to hold them; private inputs never
	// leave the environment they are in.
	Labels []string `json:"labels,omitempty"`
}

// Placement is where a step runs, and why.
type Placement struct {
	Env    string `json:"env"`
	Kind   string `json:"kind,omitempty"` // "edge" or "cloud"
	Reason string `json:"reason,omitempty"`
}

// HandOff is what a step handed off asks the other environment to run: a
// run of its own there.
type HandOff struct {
	// Key names the step in every environment: the ID its sub-agent has
	// in the parent's environment (parent.step.attempt). The other side
	// starts one run per key, however many times it is asked.
	Key      RunID    `json:"key"`
	Goal     string   `json:"goal"`
	Model    string   `json:"model,omitempty"`
	MaxSteps int      `json:"max_steps,omitempty"`
	Tools    []string `json:"tools"`
	// Need is what the step needs; its Labels are the labels the run
	// starts with.
	Need StepNeed `json:"need"`
	// TraceParent is the trace context the run's spans go under: a W3C
	// traceparent naming the parent's trace and its hand-off span
	// (TraceParent).
	TraceParent string `json:"traceparent,omitempty"`
	// ParentSpan is the keel ID of the hand-off span in the parent's
	// trace, under which the run's spans are put when they cross back.
	ParentSpan string `json:"parent_span,omitempty"`
}

// StepOffer is a step another environment handed to this one, as this
// one keeps it beside the run that carries it out.
type StepOffer struct {
	// Key is the idempotency key of the step's run here.
	Key string `json:"key"`
	// Origin is the environment whose offer came first: only it may
	// cancel the step's run.
	Origin string `json:"origin"`
	// TraceParent is the W3C trace context the first offer carried
	// (HandOff.TraceParent): the run's spans belong in that trace.
	TraceParent string `json:"traceparent,omitempty"`
	// Run is the run of Key, "" while there is none.
	Run RunID `json:"run,omitempty"`
	// Cancelled: the origin cancelled the step; no run of Key starts.
	Cancelled bool `json:"cancelled,omitempty"`
}

// StepHandedOffData is the payload of EventStepHandedOff: a plan step's
// attempt goes to another environment.
type StepHandedOffData struct {
	StepID  string `json:"step_id"`
	Run     RunID  `json:"run"` // the step's key (HandOff.Key)
	Attempt int    `json:"attempt"`
	// Placement is the environment that runs it and why.
	Placement Placement `json:"placement"`
	Need      StepNeed  `json:"need"`
	// TraceParent is the trace context sent with the step.
	TraceParent string `json:"traceparent,omitempty"`
}

// StepAcceptedData is the payload of EventStepAccepted: the other
// environment started the step's run.
type StepAcceptedData struct {
	StepID    string `json:"step_id"`
	Run       RunID  `json:"run"`
	Env       string `json:"env"`
	RemoteRun RunID  `json:"remote_run"` // the run there
}

// StepOutcome is how a step run elsewhere ended, as far as what its run
// there may let cross: its labels decide.
type StepOutcome struct {
	Status RunStatus `json:"status"`
	// Result is the run's result, when it may cross.
	Result string `json:"result,omitempty"`
	Error  string `json:"error,omitempty"`
	// Withheld: the run's data may not leave its environment; only its
	// status crossed.
	Withheld bool `json:"withheld,omitempty"`
	// Labels are the labels of what crossed (its events'): they enter
	// the parent's context with the result.
	Labels []string `json:"labels,omitempty"`
	// Spans are the run's spans, its root's parent the hand-off span
	// (HandOff.ParentSpan); a withheld run's cross as one stub span,
	// its timing only.
	Spans []Span `json:"spans,omitempty"`
	// Tokens and CostUSD are what the run's model calls spent there,
	// withheld or not: they count in the parent's budget.
	Tokens  int64   `json:"tokens,omitempty"`
	CostUSD float64 `json:"cost_usd,omitempty"`
}

// StepCompletedElsewhereData is the payload of
// EventStepCompletedElsewhere: the step's run there ended.
type StepCompletedElsewhereData struct {
	StepID    string    `json:"step_id"`
	Run       RunID     `json:"run"`
	Env       string    `json:"env"`
	RemoteRun RunID     `json:"remote_run"`
	Status    RunStatus `json:"status"`
	Result    string    `json:"result,omitempty"`
	Error     string    `json:"error,omitempty"`
	Withheld  bool      `json:"withheld,omitempty"`
	Labels    []string  `json:"labels,omitempty"`
	// Spans is how many of its spans crossed back.
	Spans int `json:"spans,omitempty"`
	// Tokens and CostUSD are what the run spent there, counted in the
	// parent's budget as a sub-agent's spending is.
	Tokens  int64   `json:"tokens,omitempty"`
	CostUSD float64 `json:"cost_usd,omitempty"`
}

// StepCancelledElsewhereData is the payload of
// EventStepCancelledElsewhere: the parent asked the environment that
// runs a step handed off to cancel its run there.
type StepCancelledElsewhereData struct {
	StepID string `json:"step_id"`
	Run    RunID  `json:"run"`
	Env    string `json:"env"`
	// RemoteRun is the step's run there; "" when its acceptance was not
	// known: the step was cancelled there by its key, and no run of it
	// starts there.
	RemoteRun RunID `json:"remote_run"`
	// Status is the run's status there after the request (cancelled,
	// or how it had ended already); Error is why the request failed.
	Status RunStatus `json:"status,omitempty"`
	Error  string    `json:"error,omitempty"`
}

// TraceID is the OpenTelemetry trace ID (32 hex digits) of the trace of
// top-level run top: a hash of its ID, the same after a restart and in
// every environment (package telemetry exports under it).
func TraceID(top RunID) string {
	h := sha256.Sum256([]byte("keel.trace\x00" + string(top)))
	id := h[:16]
	if allZero(id) {
		id[15] = 1
	}
	return hex.EncodeToString(id)
}

// OTelSpanID is the OpenTelemetry span ID (16 hex digits) of keel span
// id, as package telemetry exports it.
func OTelSpanID(id string) string {
	h := sha256.Sum256([]byte("keel.span\x00" + id))
	sid := h[:8]
	if allZero(sid) {
		sid[7] = 1
	}
	return hex.EncodeToString(sid)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// TraceParent is the W3C traceparent of keel span span in the trace of
// top-level run top (sampled).
func TraceParent(top RunID, span string) string {
	return "00-" + TraceID(top) + "-" + OTelSpanID(span) + "-01"
}

// ParseTraceParent returns the trace ID and the parent span ID of a W3C
// traceparent, or an error wrapping ErrInvalid.
func ParseTraceParent(tp string) (traceID, spanID string, err error) {
	p := strings.Split(tp, "-")
	if len(p) != 4 || len(p[0]) != 2 || len(p[1]) != 32 || len(p[2]) != 16 || len(p[3]) != 2 || p[0] == "ff" {
		return "", "", fmt.Errorf("traceparent %q: %w", tp, ErrInvalid)
	}
	for _, s := range p {
		if _, err := hex.DecodeString(s); err != nil {
			return "", "", fmt.Errorf("traceparent %q: %w", tp, ErrInvalid)
		}
	}
	if p[1] == strings.Repeat("0", 32) || p[2] == strings.Repeat("0", 16) {
		return "", "", fmt.Errorf("traceparent %q: %w", tp, ErrInvalid)
	}
	return p[1], p[2], nil
}
