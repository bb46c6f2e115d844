package acp

import (
	"encoding/json"
	"strings"

	"github.com/keel-runtime/keel"
)

// renderer turns a run's events into session/update notifications: the
// model's text as agent_message_chunk (streamed from model.delta, the
// rest from model.result), each tool call as tool_call (pending) and
// tool_call_update (in_progress when it runs, completed or failed with
// its output or error), a plan run's plan and steps as plan, and, in a
// history (session/load), the person's words as user_message_chunk.
type renderer struct {
	c       *conn
	session string
	history bool
	// ask, when set, is called for each approval.requested (live only).
	ask func(keel.ApprovalRequestData)
	// kinds is the ACP kind of each tool's calls (see toolKind).
	kinds map[string]string

	streamed map[int]string // the text of each step sent so far
	// asked are the approvals requested and not yet decided, in order.
	asked []keel.ApprovalRequestData
	plan  []planEntry
	// status is the run's status once it ended; failure its reason.
	status  keel.RunStatus
	failure string
	stop    string // the turn's stopReason once it ended, "" for a failure
	done    bool
	steps   int // model steps seen
	maxStep int // the run's step bound, from run.started
	runStep int // the last model step seen
}

type planEntry struct {
	Content  string `json:"content"`
	Priority string `json:"priority"`
	Status   string `json:"status"`
	id       string
}

func newRenderer(c *conn, session string, history bool) *renderer {
	return &renderer{c: c, session: session, history: history, streamed: map[int]string{}}
}

// ended reports whether the run ended, and the stopReason of the turn
// ("" when it failed: see failure).
func (r *renderer) ended() (bool, string) { return r.done, r.stop }

func (r *renderer) update(u map[string]any) {
	_ = r.c.notify("session/update", map[string]any{"sessionId": r.session, "update": u})
}

func textChunk(kind, text string) map[string]any {
	return map[string]any{"sessionUpdate": kind, "content": map[string]string{"type": "text", "text": text}}
}

// toolCallFields are the ToolCall fields of call with status; kinds
// gives its kind (other when it names none).
func toolCallFields(call keel.ToolCall, status string, kinds map[string]string) map[string]any {
	args := call.Arguments
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	kind := kinds[call.Name]
	if kind == "" {
		kind = "other"
	}
	return map[string]any{"toolCallId": call.ID, "title": call.Name, "kind": kind, "status": status, "rawInput": args}
}

// event renders one event.
func (r *renderer) event(ev keel.Event) {
	switch ev.Type {
	case keel.EventRunStarted:
		var d keel.RunStartedData
		if json.Unmarshal(ev.Data, &d) == nil {
			r.maxStep = d.MaxSteps
			if r.history {
				r.update(textChunk("user_message_chunk", d.Goal))
			}
		}
	case keel.EventHumanMessage:
		var d keel.HumanMessageData
		if r.history && json.Unmarshal(ev.Data, &d) == nil {
			r.update(textChunk("user_message_chunk", d.Content))
		}
	case keel.EventModelDelta:
		var d keel.ModelDeltaData
		if json.Unmarshal(ev.Data, &d) == nil && d.Content != "" {
			r.streamed[d.Step] += d.Content
			r.update(textChunk("agent_message_chunk", d.Content))
		}
	case keel.EventModelResult:
		var d keel.ModelResultData
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		r.runStep = d.Step
		// What streaming did not send (all of it, from a model that does
		// not stream, or in a history).
		if rest, ok := strings.CutPrefix(d.Content, r.streamed[d.Step]); ok && rest != "" {
			r.update(textChunk("agent_message_chunk", rest))
		}
		delete(r.streamed, d.Step)
		for _, c := range d.ToolCalls {
			u := toolCallFields(c, "pending", r.kinds)
			u["sessionUpdate"] = "tool_call"
			r.update(u)
		}
	case keel.EventToolCall:
		var d keel.ToolCallData
		if json.Unmarshal(ev.Data, &d) == nil && !r.history {
			r.update(map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": d.Call.ID, "status": "in_progress"})
		}
	case keel.EventApprovalAsked:
		var d keel.ApprovalRequestData
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		r.asked = append(r.asked, d)
		if r.ask != nil {
			r.ask(d)
		}
	case keel.EventApproval:
		var d keel.ApprovalData
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		for i, ap := range r.asked {
			if ap.Call.ID == d.CallID {
				r.asked = append(r.asked[:i:i], r.asked[i+1:]...)
				break
			}
		}
	case keel.EventToolResult:
		var d keel.ToolResultData
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		u := map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": d.CallID}
		if d.Error != nil {
			u["status"] = "failed"
			u["content"] = []any{toolText(d.Error.Error())}
			u["rawOutput"] = d.Error
		} else {
			u["status"] = "completed"
			u["content"] = []any{toolText(string(d.Output))}
			u["rawOutput"] = d.Output
		}
		r.update(u)
	case keel.EventPlanProposed:
		var d keel.PlanData
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		r.plan = r.plan[:0]
		for _, st := range d.Plan.Steps {
			r.plan = append(r.plan, planEntry{Content: st.Goal, Priority: "medium", Status: "pending", id: st.ID})
		}
		r.sendPlan()
	case keel.EventStepStarted, keel.EventStepFinished:
		var d keel.StepData
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		status := "in_progress"
		if ev.Type == keel.EventStepFinished && d.Status == keel.RunSucceeded {
			status = "completed"
		}
		for i := range r.plan {
			if r.plan[i].id == d.StepID {
				r.plan[i].Status = status
			}
		}
		r.sendPlan()
	case keel.EventRunSucceeded:
		r.end(keel.RunSucceeded, "end_turn", "")
	case keel.EventRunCancelled:
		r.end(keel.RunCancelled, "cancelled", "")
	case keel.EventRunFailed:
		var d keel.RunEndData
		_ = json.Unmarshal(ev.Data, &d)
		stop := ""
		if r.maxStep > 0 && r.runStep >= r.maxStep {
			// Every step the turn had was used without an answer.
			stop = "max_turn_requests"
		}
		r.end(keel.RunFailed, stop, d.Reason)
	case keel.EventRunWaiting:
		// After a daemon restart a call that may or may not have run
		// waits for a person's decision (keel decide): the turn ends
		// saying so.
		var d keel.RunWaitingData
		if json.Unmarshal(ev.Data, &d) == nil && !r.history {
			r.update(textChunk("agent_message_chunk", "\n[keel] the run waits for a decision: "+d.Reason))
			r.end(keel.RunWaiting, "end_turn", "")
		}
	}
}

// pendingApprovals are the approvals requested and not decided in the
// events rendered so far.
func (r *renderer) pendingApprovals() []keel.ApprovalRequestData {
	return append([]keel.ApprovalRequestData(nil), r.asked...)
}

func (r *renderer) end(status keel.RunStatus, stop, failure string) {
	r.status, r.stop, r.failure, r.done = status, stop, failure, true
}

func (r *renderer) sendPlan() {
	entries := make([]planEntry, len(r.plan))
	copy(entries, r.plan)
	r.update(map[string]any{"sessionUpdate": "plan", "entries": entries})
}

// toolText is a ToolCallContent holding text.
func toolText(s string) map[string]any {
	return map[string]any{"type": "content", "content": map[string]string{"type": "text", "text": s}}
}
