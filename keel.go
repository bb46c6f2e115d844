package keel

import (
	"encoding/json"
	"time"
)

// RunID identifies a run. It is opaque to clients.
type RunID string

// RunStatus is the lifecycle state of a run.
type RunStatus string

// Run states. A run starts queued, runs, and ends in exactly one terminal
// state. RunWaiting is a run that cannot advance until something outside
// it decides (a human); RunPaused one a client paused at a step boundary,
// which stays paused, across restarts too, until resumed or cancelled; RunInterrupted marks a run that was in flight when
// the daemon stopped, which the next start resumes. Which state may follow
// which is CanTransition's table, enforced by the store.
const (
	RunQueued      RunStatus = "queued"
	RunRunning     RunStatus = "running"
	RunWaiting     RunStatus = "waiting"
	RunPaused      RunStatus = "paused"
	RunInterrupted RunStatus = "interrupted"
	RunSucceeded   RunStatus = "succeeded"
	RunFailed      RunStatus = "failed"
	RunCancelled   RunStatus = "cancelled"
)

// transitions lists the states each state may move to.
var transitions = map[RunStatus][]RunStatus{
	RunQueued:      {RunRunning, RunFailed, RunCancelled, RunInterrupted},
	RunRunning:     {RunWaiting, RunPaused, RunSucceeded, RunFailed, RunCancelled, RunInterrupted},
	RunWaiting:     {RunRunning, RunFailed, RunCancelled, RunInterrupted},
	RunPaused:      {RunRunning, RunCancelled},
	RunInterrupted: {RunRunning, RunWaiting, RunFailed, RunCancelled},
}

// CanTransition reports whether a run in state from may move to state to.
// Staying in a state is not a transition and is always allowed; nothing
// leaves a terminal state.
func CanTransition(from, to RunStatus) bool {
	if from == to {
		return true
	}
	for _, t := range transitions[from] {
		if t == to {
			return true
		}
	}
	return false
}

// Terminal reports whether no further transition is possible from s.
func (s RunStatus) Terminal() bool {
	switch s {
	case RunSucceeded, RunFailed, RunCancelled:
		return true
	}
	return false
}

// RunKind is how a run is driven: its orchestration pattern.
type RunKind string

// Run kinds. All three are journaled the same way and share the
// lifecycle; they differ in who decides the next step.
const (
	// KindAgent is the agent loop: the model proposes tool calls, the
	// engine runs them, until the model answers.
	KindAgent RunKind = "agent"
	// KindPlan is planner-executor: the model proposes a plan (a DAG of
	// steps, under a schema), deterministic code runs the steps, and the
	// model re-plans within a bound when a step fails.
	KindPlan RunKind = "plan"
	// KindDAG runs a DAG of steps the client gave, with no planner.
	KindDAG RunKind = "dag"
)

// Run is the persisted summary of one run.
type Run struct {
	ID       RunID     `json:"id"`
	Kind     RunKind   `json:"kind,omitempty"` // "" reads as KindAgent
	Goal     string    `json:"goal"`
	Model    string    `json:"model"`
	Status   RunStatus `json:"status"`
	Result   string    `json:"result,omitempty"` // final answer when succeeded
	Error    string    `json:"error,omitempty"`  // failure or cancel reason
	MaxSteps int       `json:"max_steps"`
	Policy   RunPolicy `json:"policy,omitzero"`
	// IdempotencyKey is the client's key for the start request, if any.
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	// LastSeq is the sequence number of the newest event of the run.
	LastSeq int64 `json:"last_seq"`
	// ParentID and ParentStep link a sub-agent, a run that carries out
	// one step of a plan or DAG run, to that run and step.
	ParentID   RunID  `json:"parent_id,omitempty"`
	ParentStep string `json:"parent_step,omitempty"`
	// Workspace is the directory the run works in (StartRequest.
	// Workspace), an absolute path: its .keel/policy.json is the run's
	// workspace policy layer. Empty: none. A fork and a sub-agent keep
	// their run's.
	Workspace string `json:"workspace,omitempty"`
	// Warnings are the problems of the run's own rules (RunPolicy.Rules)
	// that did not refuse its start, each "run.start:LINE:COL: what"
	// (a rule that can never match, a setting that cannot loosen a
	// higher layer's): set only in the result of the start that created
	// the run, not stored.
	Warnings []string `json:"warnings,omitempty"`
}

// KindOrAgent returns the run's kind, KindAgent when unset.
func (r Run) KindOrAgent() RunKind {
	if r.Kind == "" {
		return KindAgent
	}
	return r.Kind
}

// RunPolicy is what a run's model calls may do. The zero value is the
// default: local models only, no budget of its own (the daily one holds).
type RunPolicy struct {
	// AllowCloud lets the run's calls go to cloud models, where the
	// daemon's configuration allows cloud at all.
	AllowCloud bool `json:"allow_cloud,omitempty"`
	// Private marks everything in the run as private: it is the label
	// private on the run's inputs, so nothing of the run leaves the
	// machine, whatever else allows, until a person declassifies private
	// (run.declassify).
	Private bool `json:"private,omitempty"`
	// Labels are the labels of the run's inputs (its goal): they are in
	// the run's context from the start. Sorted names; see labels.go.
	Labels []string `json:"labels,omitempty"`
	// BudgetTokens and BudgetUSD cap what the run's model calls spend;
	// 0 is no cap.
	BudgetTokens int64   `json:"budget_tokens,omitempty"`
	BudgetUSD    float64 `json:"budget_usd,omitempty"`
	// Tools, when not nil, is the subset of installed tools the run may
	// call (a sub-agent gets its step's tools); nil is every tool. An
	// empty subset is encoded as [] (omitzero), so it stays "no tools"
	// when stored and read back.
	Tools []string `json:"tools,omitzero"`
	// Deadline, when set, ends the run as failed if it has not ended by
	// then, across restarts.
	Deadline time.Time `json:"deadline,omitzero"`
	// StepTimeout bounds each model call and each tool call of the run;
	// a step that outlives it fails like any failed step (and may be
	// retried, see ModelRetries and ToolRetries). 0 is no bound beyond
	// the model layer's and the tool sandbox's own.
	StepTimeout time.Duration `json:"step_timeout,omitempty"`
	// ModelRetries is how many more times a failed model step is tried
	// (after the model layer's own retries of transport errors) before
	// the run fails.
	ModelRetries int `json:"model_retries,omitempty"`
	// ToolRetries is how many more times a tool call that timed out or
	// crashed is tried, for read-only and idempotent tools only; a tool
	// with other side effects is never repeated by itself.
	ToolRetries int `json:"tool_retries,omitempty"`
	// RetryBackoff is the wait before the first retry, doubled before
	// each next one; default 200ms.
	RetryBackoff time.Duration `json:"retry_backoff,omitempty"`
	// Rules are the run's own policy rules: the run layer's document
	// (see docs/policy.md), a JSON object in the format every layer
	// shares, or a JSON string holding one, whose lines and columns
	// explanations then name (keel run --policy FILE sends it so). At
	// most policy.MaxFileSize bytes. They apply on top of the run's
	// workspace policy and the daemon's run layer (--require-approval):
	// they can tighten what the higher layers allow, never loosen it. A
	// sub-agent and a fork keep their run's.
	Rules json.RawMessage `json:"rules,omitempty"`
}

// IsZero reports whether p is the default policy.
func (p RunPolicy) IsZero() bool {
	return !p.AllowCloud && !p.Private && len(p.Labels) == 0 && p.BudgetTokens == 0 && p.BudgetUSD == 0 && p.Tools == nil &&
		p.Deadline.IsZero() && p.StepTimeout == 0 && p.ModelRetries == 0 && p.ToolRetries == 0 && p.RetryBackoff == 0 && len(p.Rules) == 0
}

// EventType names what an Event records. The set is documented in
// docs/protocol.md; clients must ignore types they do not know.
type EventType string

// Event types of a run.
const (
	EventRunStarted     EventType = "run.started"         // data: RunStartedData
	EventModelDelta     EventType = "model.delta"         // data: ModelDeltaData (not persisted)
	EventModelResult    EventType = "model.result"        // data: ModelResultData
	EventToolCall       EventType = "tool.call"           // data: ToolCallData
	EventToolResult     EventType = "tool.result"         // data: ToolResultData
	EventRunSucceeded   EventType = "run.succeeded"       // data: RunEndData
	EventRunFailed      EventType = "run.failed"          // data: RunEndData
	EventRunCancelled   EventType = "run.cancelled"       // data: RunEndData
	EventRunInterrupted EventType = "run.interrupted"     // data: RunEndData
	EventRunResumed     EventType = "run.resumed"         // data: RunResumedData
	EventRunWaiting     EventType = "run.waiting"         // data: RunWaitingData
	EventHumanDecision  EventType = "human.decision"      // data: HumanDecisionData
	EventRunPaused      EventType = "run.paused"          // data: RunEndData (status paused, reason)
	EventApprovalAsked  EventType = "approval.requested"  // data: ApprovalRequestData
	EventApproval       EventType = "approval.decision"   // data: ApprovalData
	EventHumanMessage   EventType = "human.message"       // data: HumanMessageData
	EventPlanProposed   EventType = "plan.proposed"       // data: PlanData
	EventStepStarted    EventType = "step.started"        // data: StepData
	EventStepFinished   EventType = "step.finished"       // data: StepData
	EventStepRetry      EventType = "step.retry"          // data: StepRetryData
	EventContextSummary EventType = "context.summarized"  // data: ContextSummaryData
	EventTakeOver       EventType = "human.takeover"      // data: HumanControlData
	EventHandBack       EventType = "human.handback"      // data: HumanControlData
	EventRunForked      EventType = "run.forked"          // data: RunForkedData
	EventHumanTool      EventType = "human.tool"          // data: HumanToolData
	EventDeclassified   EventType = "labels.declassified" // data: DeclassifyData
	EventPolicyChanged  EventType = "policy.changed"      // data: PolicyChangeData
	// A plan step handed to another environment (handoff.go).
	EventStepHandedOff          EventType = "step.handed_off"          // data: StepHandedOffData
	EventStepAccepted           EventType = "step.accepted"            // data: StepAcceptedData
	EventStepCompletedElsewhere EventType = "step.completed_elsewhere" // data: StepCompletedElsewhereData
	EventStepCancelledElsewhere EventType = "step.cancelled_elsewhere" // data: StepCancelledElsewhereData
)

// HumanToolData is the payload of EventHumanTool: a tool call a person
// made on the run's behalf while in control of it (taken over), and its
// outcome, which the model reads when the run is handed back.
type HumanToolData struct {
	Call   ToolCall        `json:"call"`
	Output json.RawMessage `json:"output,omitempty"`
	Error  *ToolError      `json:"error,omitempty"`
	// Private: as ToolResultData.Private; the run is private from here on.
	Private bool `json:"private,omitempty"`
	// Labels are the labels of the call's output, as ToolResultData.Labels;
	// they enter the run's context.
	Labels []string `json:"labels,omitempty"`
}

// PlanStep is one step of a plan or DAG run. It is carried out by a
// sub-agent: a run of its own, with its own budget and tool subset,
// whose result returns to the parent.
type PlanStep struct {
	ID   string `json:"id"`
	Goal string `json:"goal"`
	// Tools is the subset of tools the step may use; empty is none.
	Tools []string `json:"tools,omitempty"`
	// DependsOn lists the steps whose results this step needs; it starts
	// when they have all succeeded, and sees their results.
	DependsOn []string `json:"depends_on,omitempty"`
	// BudgetTokens caps the sub-agent's model calls; 0 is the parent's
	// remaining budget.
	BudgetTokens int64 `json:"budget_tokens,omitempty"`
	// MaxSteps bounds the sub-agent's model calls; 0 is the default.
	MaxSteps int `json:"max_steps,omitempty"`
	// Retries is the step's retry policy: how many more times a failed
	// step is run (each time as a new sub-agent) before it counts as
	// failed.
	Retries int `json:"retries,omitempty"`
}

// Plan is a DAG of steps.
type Plan struct {
	Steps []PlanStep `json:"steps"`
}

// PlanData is the payload of EventPlanProposed: the plan the run follows
// from now on. Revision 0 is the first plan; each re-plan after a failed
// step is the next revision.
type PlanData struct {
	Plan     Plan   `json:"plan"`
	Revision int    `json:"revision"`
	Reason   string `json:"reason,omitempty"` // why it re-planned
}

// StepData is the payload of EventStepStarted and EventStepFinished.
type StepData struct {
	StepID  string    `json:"step_id"`
	Run     RunID     `json:"run"`     // the sub-agent carrying it out
	Attempt int       `json:"attempt"` // 1 for the first
	Status  RunStatus `json:"status,omitempty"`
	Result  string    `json:"result,omitempty"`
	Error   string    `json:"error,omitempty"`
	// Private is set on step.finished when the sub-agent read private
	// data (see ToolResultData.Private): the parent is private from here
	// on.
	Private bool `json:"private,omitempty"`
	// Labels, on step.finished, are the labels the sub-agent's context
	// held when it ended: they enter the parent's context with its
	// result.
	Labels []string `json:"labels,omitempty"`
}

// StepRetryData is the payload of EventStepRetry: a failed model or tool
// step is tried again, by the run's retry policy.
type StepRetryData struct {
	Step    int    `json:"step"`
	CallID  string `json:"call_id,omitempty"` // a tool call; empty for a model step
	Attempt int    `json:"attempt"`           // the attempt about to start, 2 for the first retry
	Error   string `json:"error"`             // why the last attempt failed
	WaitMS  int64  `json:"wait_ms"`
}

// ContextSummaryData is the payload of EventContextSummary: older steps
// no longer fit the model's context and were replaced by a summary,
// which later steps (and a resumed or replayed run) read instead. When
// the newest step's tool results alone do not fit, they are cut (Cuts),
// each with a note saying so; Messages is 0 when only that was done.
type ContextSummaryData struct {
	Step         int          `json:"step"`          // the model step it was made for
	Messages     int          `json:"messages"`      // messages summarized, counted from the first after the goal
	TokensBefore int          `json:"tokens_before"` // estimated context before (calibrated to the model's count)
	TokensAfter  int          `json:"tokens_after"`  // and after
	Summary      string       `json:"summary"`
	Cuts         []ContextCut `json:"cuts,omitempty"`
	// Labels are the labels of what was summarized: the summary carries
	// them.
	Labels []string `json:"labels,omitempty"`
}

// ContextCut says that the tool result of call CallID, as the model reads
// it, keeps only its first Keep bytes, followed by a note.
type ContextCut struct {
	CallID string `json:"call_id"`
	Keep   int    `json:"keep"`
}

// HumanControlData is the payload of EventTakeOver and EventHandBack.
type HumanControlData struct {
	Note string `json:"note,omitempty"`
}

// RunForkedData is the payload of EventRunForked, the first event of a
// run forked from another: it starts from the journal of From up to and
// including step Step.
type RunForkedData struct {
	From  RunID  `json:"from"`
	Step  int    `json:"step"`
	Model string `json:"model,omitempty"` // the model the fork uses, when changed
	Goal  string `json:"goal,omitempty"`  // the edited goal, when changed
}

// HumanMessageData is the payload of EventHumanMessage: a person's words
// to the run, which the model reads before its next step.
type HumanMessageData struct {
	Content string `json:"content"`
	// Labels are the message's labels: those the person gave it and
	// those the policy gives human messages (sources "human").
	Labels []string `json:"labels,omitempty"`
}

// ApprovalRequestData is the payload of EventApprovalAsked: the exact
// call a person must approve, and the hash that binds an approval to it.
type ApprovalRequestData struct {
	Call ToolCall `json:"call"`
	// ArgsSHA256 is the hex sha256 of the call's arguments as shown; an
	// approval must name it, so approving one payload cannot release
	// another.
	ArgsSHA256  string     `json:"args_sha256"`
	SideEffects SideEffect `json:"side_effects"`
	SpanID      string     `json:"span_id"`
	// Policy is the policy's decision (ask) that made the call wait.
	Policy *PolicyDecision `json:"policy,omitempty"`
}

// PolicyDecision is what the policy decided about an action, as the
// journal and the trace record it, so that a resume and a replay use the
// decision in force at the time instead of deciding again. Absent when
// no policy had anything to say (no rule or setting applied).
type PolicyDecision struct {
	// Outcome is allow, ask or deny.
	Outcome string `json:"outcome"`
	// Explanation says which rule or setting decided, with its layer and
	// file:line:col.
	Explanation string `json:"explanation"`
	// Version numbers the policies the daemon has put in force (from 1;
	// 0 when there are no policy files); Digest identifies the files.
	Version uint64 `json:"version"`
	Digest  string `json:"digest"`
	// Approver, for an ask, names who answered it when it was not a run's
	// (whose approval event says): an MCP client whose user approved or
	// declined the call through MCP elicitation, "mcp:NAME". Empty
	// otherwise.
	Approver string `json:"approver,omitempty"`
}

// ApprovalData is the payload of EventApproval.
type ApprovalData struct {
	CallID     string `json:"call_id"`
	ArgsSHA256 string `json:"args_sha256"`
	Approved   bool   `json:"approved"`
	// Reason is why, for a denial; the model sees it.
	Reason string `json:"reason,omitempty"`
	// Arguments, when set, replace the call's arguments (an edit).
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// Decisions a human can take about a tool call whose outcome is unknown
// (its intent was journaled, its result was not, and it is not safe to
// run twice).
const (
	DecisionRetry = "retry" // run the call again
	DecisionSkip  = "skip"  // do not run it; the model is told it was skipped
	DecisionDone  = "done"  // it did happen; the model gets Output as its result
)

// HumanDecisionData is the payload of EventHumanDecision.
type HumanDecisionData struct {
	CallID   string          `json:"call_id"`
	Decision string          `json:"decision"`
	Output   json.RawMessage `json:"output,omitempty"` // for DecisionDone
	Note     string          `json:"note,omitempty"`
}

// Event is one entry of a run's journal. Seq starts at 1 and grows by one
// per persisted event of the run, so a client that saw Seq n asks for
// events after n and gets each later event exactly once.
type Event struct {
	RunID RunID           `json:"run_id"`
	Seq   int64           `json:"seq"`
	Type  EventType       `json:"type"`
	Time  time.Time       `json:"time"`
	Data  json.RawMessage `json:"data,omitempty"`
}

// RunResumedData is the payload of EventRunResumed: the daemon picked an
// interrupted run up again from its journal.
type RunResumedData struct {
	// FromSeq is the last journaled event the run resumes after.
	FromSeq int64 `json:"from_seq"`
	// Step is the model step the run goes on from.
	Step int `json:"step"`
}

// RunWaitingData is the payload of EventRunWaiting: why the run cannot go
// on by itself, and what would let it.
type RunWaitingData struct {
	Reason string `json:"reason"`
	// Call is the tool call a human must decide about, when there is one.
	Call *ToolCall `json:"call,omitempty"`
	// Choices are the decisions that release the run.
	Choices []string `json:"choices,omitempty"`
}

// RunStartedData is the payload of EventRunStarted.
type RunStartedData struct {
	Goal     string   `json:"goal"`
	Model    string   `json:"model"`
	Tools    []string `json:"tools"`
	MaxSteps int      `json:"max_steps"`
}

// ModelDeltaData is a streamed fragment of model output. Deltas are sent
// live to subscribers but not journaled; the ModelResult that follows
// holds the whole message.
type ModelDeltaData struct {
	Step    int    `json:"step"`
	Content string `json:"content"`
	// Restart voids the step's earlier deltas: the model layer retried
	// after a broken stream and the reply starts again here.
	Restart bool `json:"restart,omitempty"`
}

// ModelResultData is the payload of EventModelResult.
type ModelResultData struct {
	Step             int        `json:"step"`
	Model            string     `json:"model"`
	Content          string     `json:"content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
	PromptTokens     int        `json:"prompt_tokens"`
	CompletionTokens int        `json:"completion_tokens"`
	// CostUSD is what the call cost (cloud providers; 0 for local ones).
	CostUSD    float64 `json:"cost_usd,omitempty"`
	DurationMS int64   `json:"duration_ms"`
	// HumanSeqs are the human.message events the model read before this
	// step, by sequence number.
	HumanSeqs []int64 `json:"human_seqs,omitempty"`
	// Labels are the labels of the context the model answered from: the
	// answer carries them.
	Labels []string `json:"labels,omitempty"`
	// Policy are the policy's decisions about the targets the call was
	// offered to, in order, where a rule or setting decided (a target the
	// policy refused, then the one that answered if a rule allowed it),
	// so that a replay shows the decisions of the time.
	Policy []ModelDecision `json:"policy,omitempty"`
}

// ModelDecision is the policy's decision about one target of a model
// call: a provider and model.
type ModelDecision struct {
	Provider string `json:"provider"`
	Model    string `json:"model"`
	PolicyDecision
}

// ToolCallData is the payload of EventToolCall: the intent, recorded
// before the tool runs.
type ToolCallData struct {
	Step int      `json:"step"`
	Call ToolCall `json:"call"`
	// Policy is the policy's decision that let the call run, when a
	// policy had something to say.
	Policy *PolicyDecision `json:"policy,omitempty"`
}

// ToolResultData is the payload of EventToolResult.
type ToolResultData struct {
	Step       int             `json:"step"`
	CallID     string          `json:"call_id"`
	Name       string          `json:"name"`
	Output     json.RawMessage `json:"output,omitempty"`
	Error      *ToolError      `json:"error,omitempty"`
	DurationMS int64           `json:"duration_ms"`
	// Private is set when the tool had a directory marked private: its
	// output may hold private data, so the run is private from here on.
	Private bool `json:"private,omitempty"`
	// Policy is the policy's decision (deny) when the policy refused the
	// call: the tool did not run and Error is policy_denied.
	Policy *PolicyDecision `json:"policy,omitempty"`
	// Labels are the labels of the call's output: from Touched.Labels,
	// the policy's sources for the paths it opened and for the tool.
	// They enter the run's context with the output.
	Labels []string `json:"labels,omitempty"`
	// Touched is what the call reached, as the tool host saw it.
	Touched *Touched `json:"touched,omitempty"`
}

// RunEndData is the payload of the terminal and interrupted events.
type RunEndData struct {
	Status RunStatus `json:"status"`
	Result string    `json:"result,omitempty"`
	Reason string    `json:"reason,omitempty"`
}

// ToolCall is a model's request to run a tool.
type ToolCall struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// SideEffect classifies what a tool may change outside itself.
type SideEffect string

// Side-effect classes, from harmless to irreversible.
const (
	SideEffectReadOnly           SideEffect = "read_only"
	SideEffectIdempotentWrite    SideEffect = "idempotent_write"
	SideEffectNonIdempotentWrite SideEffect = "non_idempotent_write"
	SideEffectExternal           SideEffect = "external"
)

// ToolSpec describes a tool to callers and models.
type ToolSpec struct {
	Name         string          `json:"name"`
	Version      string          `json:"version,omitempty"`
	Description  string          `json:"description"`
	InputSchema  json.RawMessage `json:"input_schema"`
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
	SideEffects  SideEffect      `json:"side_effects"`
}

// CallTargets are the files and URLs one tool call names, as a policy
// matches them: the arguments its input schema marks "format": "path"
// (Paths) or "uri" / "uri-reference" (URLs), as written. A relative path
// is relative to Base, an absolute guest path; Resolve, if set, maps a
// cleaned absolute guest path to the host path the call would touch
// (following symlinks), or fails when no grant reaches it. Resolve may
// be called concurrently. Unresolvable says the call names paths or URLs
// that could not all be read (too many, or too deep in its arguments):
// a policy treats it as naming a path and a URL that cannot be
// normalized (every path and url rule that asks or denies matches, none
// that allows).
type CallTargets struct {
	Paths        []string
	Base         string
	Resolve      func(guest string) (string, error)
	URLs         []string
	Unresolvable bool
}

// ToolErrorCode classifies why a tool call failed.
type ToolErrorCode string

// Tool error codes.
const (
	ToolInvalidInput      ToolErrorCode = "invalid_input"
	ToolPermissionDenied  ToolErrorCode = "permission_denied"
	ToolTimeout           ToolErrorCode = "timeout"
	ToolResourceExhausted ToolErrorCode = "resource_exhausted"
	ToolFailed            ToolErrorCode = "tool_error"
	ToolCrashed           ToolErrorCode = "crashed"
	ToolNotFound          ToolErrorCode = "not_found"
	// ToolSkipped: the call was not run, by a human's decision.
	ToolSkipped ToolErrorCode = "skipped"
	// ToolDenied: a person denied the call; the message holds the reason.
	ToolDenied ToolErrorCode = "denied"
	// ToolPolicyDenied: the policy denied the call before it ran; the
	// message holds the explanation (rule, layer, file:line).
	ToolPolicyDenied ToolErrorCode = "policy_denied"
)

// ToolError is a classified tool failure. Its message is written for both
// a model and a human to act on.
type ToolError struct {
	Code    ToolErrorCode `json:"code"`
	Message string        `json:"message"`
	// Path is the JSON pointer of the failing input field, for invalid_input.
	Path string `json:"path,omitempty"`
}

func (e *ToolError) Error() string {
	if e.Path != "" {
		return string(e.Code) + ": " + e.Path + ": " + e.Message
	}
	return string(e.Code) + ": " + e.Message
}

// SpanKind names what a trace span measured.
type SpanKind string

// Span kinds. A run's trace is a tree: its root span (SpanRun) holds
// its step spans (SpanStep), which hold the spans of the work each step
// did; see Span.ParentID.
const (
	// SpanRun is a run's root span, from its creation to its end. A
	// sub-agent's root span has for parent the step span, in its parent
	// run's trace, of the step it carries out.
	SpanRun SpanKind = "run"
	// SpanStep groups one step's spans: in an agent run a model step (its
	// model call, retries, tool calls and waits for a person), in a plan
	// or DAG run one attempt of a plan step (its sub-agent).
	SpanStep      SpanKind = "step"
	SpanModelCall SpanKind = "model.call"
	SpanToolCall  SpanKind = "tool.call"
	SpanHuman     SpanKind = "human.wait"        // a run waiting for a person's approval
	SpanRetry     SpanKind = "retry"             // the wait before a failed step is tried again
	SpanSummarize SpanKind = "context.summarize" // older steps summarized to fit the context
	// SpanRetrieval is a search of the knowledge store a tool call made
	// (the knowledge_search tool), under that call's span: its Attrs
	// hold the query, the scopes searched and the hits with their scores.
	SpanRetrieval SpanKind = "retrieval"
	// SpanHandOff is a plan step carried out in another environment,
	// under the step's span, from the hand-off to the result's return;
	// the spans of the run there that cross back are under it (Name:
	// the environment).
	SpanHandOff SpanKind = "handoff"
)

// SpanStatus is the outcome of a span.
type SpanStatus string

// Span outcomes. SpanRunning marks a span whose end was never recorded
// (the daemon stopped while it was open).
const (
	SpanRunning SpanStatus = "running"
	SpanOK      SpanStatus = "ok"
	SpanError   SpanStatus = "error"
)

// Span is one timed unit of work in a run's trace.
type Span struct {
	ID    string `json:"id"`
	RunID RunID  `json:"run_id"`
	// ParentID is the span this one is part of: "" for a run's root span
	// (a sub-agent's root names its parent run's step span).
	ParentID         string        `json:"parent_id,omitempty"`
	Kind             SpanKind      `json:"kind"`
	Name             string        `json:"name"` // model or tool name
	Step             int           `json:"step"`
	Start            time.Time     `json:"start"`
	Duration         time.Duration `json:"duration_ns"`
	Status           SpanStatus    `json:"status"`
	Error            string        `json:"error,omitempty"`
	PromptTokens     int           `json:"prompt_tokens,omitempty"`
	CompletionTokens int           `json:"completion_tokens,omitempty"`
	// Model calls only: what served the call and what it cost.
	Provider     string          `json:"provider,omitempty"`
	CostUSD      float64         `json:"cost_usd,omitempty"`
	TTFT         time.Duration   `json:"ttft_ns,omitempty"` // time to first token
	Retries      int             `json:"retries,omitempty"`
	FinishReason string          `json:"finish_reason,omitempty"`
	Attrs        json.RawMessage `json:"attrs,omitempty"` // route, A/B variant, failed attempts; a plan step's sub-agent
	// ModelDigest is the version of the model that served the call as
	// its provider reports it (Ollama: the digest /api/tags lists); ""
	// when the provider reports none.
	ModelDigest string `json:"model_digest,omitempty"`
	// TemplateHash and PromptHash identify the prompt: the first 16 hex
	// digits of the sha256 of the call's system prompt template (its
	// first system message), and of everything the model was sent (its
	// messages, tool specs and output schema; see models.PromptHashes).
	TemplateHash string `json:"prompt_template_hash,omitempty"`
	PromptHash   string `json:"prompt_hash,omitempty"`
}

// RunUpdate changes a run's status together with the event that records
// the change, so the two are never out of step.
type RunUpdate struct {
	Status RunStatus
	Result string
	Error  string
}

// ToolAudit is the audit record of one tool call: which tool (version and
// module hash), who called it (run and step, or a direct call), a hash of
// the arguments, the grants in force, the outcome and the duration.
type ToolAudit struct {
	ID      int64     `json:"id"`
	Time    time.Time `json:"time"`
	Tool    string    `json:"tool"`
	Version string    `json:"version,omitempty"`
	SHA256  string    `json:"sha256,omitempty"`
	RunID   RunID     `json:"run_id,omitempty"` // empty for a direct call
	Step    int       `json:"step,omitempty"`
	CallID  string    `json:"call_id,omitempty"`
	// Client names who asked for a direct call, as it declared itself
	// (ToolInvocation.Client): "mcp:NAME" for an MCP client. Empty for
	// a run's call and for a client that named no one.
	Client     string        `json:"client,omitempty"`
	ArgsSHA256 string        `json:"args_sha256"`
	Grants     []string      `json:"grants,omitempty"` // e.g. "fs:/workspace=ro"
	Outcome    string        `json:"outcome"`          // "ok" or a ToolErrorCode
	Error      string        `json:"error,omitempty"`
	Duration   time.Duration `json:"duration_ns"`
	// Policy is the policy's decision about the call: the one that let it
	// run (a rule's allow, or an ask a person approved) or denied it
	// (Outcome policy_denied; the tool did not run). Nil when no rule or
	// setting had anything to say, and for a direct call (tools.call),
	// which the tool rules do not decide.
	Policy *PolicyDecision `json:"policy,omitempty"`
	// Labels are the labels of the call's output (see ToolResultData.Labels).
	Labels []string `json:"labels,omitempty"`
	// Hosts are the host:port of every network request the call made or
	// tried, allowed or refused (Touched.Hosts).
	Hosts []string `json:"hosts,omitempty"`
	// Refused are the call's network requests the policy refused, each
	// with its decision (Touched.Refused); the first one failed the call
	// with policy_denied.
	Refused []EgressRefusal `json:"egress_refused,omitempty"`
}
