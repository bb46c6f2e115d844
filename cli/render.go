package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
)

// eventPrinter renders run events for a terminal. Streamed model deltas
// are printed as they come; the model.result that follows then only adds
// what the deltas did not show (tool calls, token counts).
type eventPrinter struct {
	w         io.Writer
	streaming bool // a delta line is open
	streamed  bool // deltas were shown for the current step
}

func (p *eventPrinter) closeStream() {
	if p.streaming {
		fmt.Fprintln(p.w)
		p.streaming = false
	}
}

func (p *eventPrinter) print(ev keel.Event) {
	switch ev.Type {
	case keel.EventModelDelta:
		var d keel.ModelDeltaData
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		if d.Restart && p.streaming {
			// The model layer retried after a broken stream.
			fmt.Fprintf(p.w, " [stream broken; retrying]")
			p.closeStream()
		}
		if !p.streaming {
			fmt.Fprintf(p.w, "  model  │ ")
			p.streaming, p.streamed = true, true
		}
		fmt.Fprint(p.w, strings.ReplaceAll(d.Content, "\n", "\n         │ "))
		return
	case keel.EventRunStarted:
		var d keel.RunStartedData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(p.w, "%3d run started  model=%s tools=[%s] max_steps=%d\n", ev.Seq, d.Model, strings.Join(d.Tools, " "), d.MaxSteps)
	case keel.EventModelResult:
		p.closeStream()
		var d keel.ModelResultData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(p.w, "%3d model step %d  %s  tokens %d in / %d out  %s%s\n", ev.Seq, d.Step, d.Model, d.PromptTokens, d.CompletionTokens, ms(d.DurationMS), labelNote(d.Labels))
		if !p.streamed && d.Content != "" {
			fmt.Fprintf(p.w, "      │ %s\n", clip(d.Content, 2000))
		}
		for _, c := range d.ToolCalls {
			fmt.Fprintf(p.w, "      │ wants tool %s %s\n", c.Name, clip(string(c.Arguments), 300))
		}
		p.streamed = false
	case keel.EventToolCall:
		var d keel.ToolCallData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(p.w, "%3d tool  → %s %s\n", ev.Seq, d.Call.Name, clip(string(d.Call.Arguments), 300))
	case keel.EventToolResult:
		var d keel.ToolResultData
		_ = json.Unmarshal(ev.Data, &d)
		if d.Error != nil {
			fmt.Fprintf(p.w, "%3d tool  ← %s failed (%s): %s  %s%s\n", ev.Seq, d.Name, d.Error.Code, d.Error.Message, ms(d.DurationMS), labelNote(d.Labels))
		} else {
			fmt.Fprintf(p.w, "%3d tool  ← %s %s  %s%s\n", ev.Seq, d.Name, clip(string(d.Output), 300), ms(d.DurationMS), labelNote(d.Labels))
		}
	case keel.EventHumanTool:
		p.closeStream()
		var d keel.HumanToolData
		_ = json.Unmarshal(ev.Data, &d)
		if d.Error != nil {
			fmt.Fprintf(p.w, "%3d person ran %s %s: failed (%s): %s%s\n", ev.Seq, d.Call.Name, clip(string(d.Call.Arguments), 300), d.Error.Code, d.Error.Message, labelNote(d.Labels))
		} else {
			fmt.Fprintf(p.w, "%3d person ran %s %s ← %s%s\n", ev.Seq, d.Call.Name, clip(string(d.Call.Arguments), 300), clip(string(d.Output), 300), labelNote(d.Labels))
		}
	case keel.EventRunSucceeded, keel.EventRunFailed, keel.EventRunCancelled, keel.EventRunInterrupted, keel.EventRunPaused:
		p.closeStream()
		var d keel.RunEndData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(p.w, "%3d run %s", ev.Seq, d.Status)
		if d.Reason != "" {
			fmt.Fprintf(p.w, ": %s", d.Reason)
		}
		fmt.Fprintln(p.w)
		if d.Result != "" {
			fmt.Fprintf(p.w, "\n%s\n", d.Result)
		}
	case keel.EventRunResumed:
		p.closeStream()
		var d keel.RunResumedData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(p.w, "%3d run resumed from its journal after event %d (model step %d)\n", ev.Seq, d.FromSeq, d.Step)
	case keel.EventRunWaiting:
		p.closeStream()
		var d keel.RunWaitingData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(p.w, "%3d run waiting: %s\n", ev.Seq, d.Reason)
		if d.Call != nil {
			fmt.Fprintf(p.w, "      │ call %s: %s %s\n      │ decide with: keel decide %s %s retry|skip|done [--output JSON]\n",
				d.Call.ID, d.Call.Name, clip(string(d.Call.Arguments), 300), ev.RunID, d.Call.ID)
		}
	case keel.EventApprovalAsked:
		p.closeStream()
		var d keel.ApprovalRequestData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(p.w, "%3d approval needed: %s (%s) %s\n      │ keel approve %s %s   or   keel deny %s %s --reason \"…\"\n",
			ev.Seq, d.Call.Name, d.SideEffects, clip(string(d.Call.Arguments), 300), ev.RunID, d.Call.ID, ev.RunID, d.Call.ID)
	case keel.EventApproval:
		var d keel.ApprovalData
		_ = json.Unmarshal(ev.Data, &d)
		verdict := "approved"
		if !d.Approved {
			verdict = "denied: " + d.Reason
		} else if len(d.Arguments) > 0 {
			verdict = "approved with edited arguments " + clip(string(d.Arguments), 300)
		}
		fmt.Fprintf(p.w, "%3d call %s %s\n", ev.Seq, d.CallID, verdict)
	case keel.EventHumanMessage:
		p.closeStream()
		var d keel.HumanMessageData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(p.w, "%3d person says: %s%s\n", ev.Seq, clip(d.Content, 2000), labelNote(d.Labels))
	case keel.EventContextSummary:
		p.closeStream()
		var d keel.ContextSummaryData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(p.w, "%3d context summarized at step %d: %d messages, ~%d → ~%d tokens%s\n", ev.Seq, d.Step, d.Messages, d.TokensBefore, d.TokensAfter, labelNote(d.Labels))
		if d.Summary != "" {
			fmt.Fprintf(p.w, "      │ %s\n", clip(d.Summary, 300))
		}
	case keel.EventDeclassified:
		p.closeStream()
		var d keel.DeclassifyData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(p.w, "%3d label %s cleared by %s: %s\n      │ the context now holds %s\n", ev.Seq, d.Label, d.By, clip(d.Reason, 300), labelSet(d.Labels))
	case keel.EventHumanDecision:
		var d keel.HumanDecisionData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(p.w, "%3d human decided %s for call %s %s\n", ev.Seq, d.Decision, d.CallID, d.Note)
	default:
		p.closeStream()
		if printFlowEvent(p.w, ev) {
			return
		}
		fmt.Fprintf(p.w, "%3d %s %s\n", ev.Seq, ev.Type, clip(string(ev.Data), 300))
	}
}

// labelNote is what an event line ends with when the data it shows
// carries labels: "  labels {pii,private}"; nothing when none.
func labelNote(labels []string) string {
	if len(labels) == 0 {
		return ""
	}
	return "  labels " + labelSet(labels)
}

// labelSet renders a set of labels as "{pii,private}".
func labelSet(labels []string) string { return "{" + strings.Join(labels, ",") + "}" }

func ms(n int64) string { return (time.Duration(n) * time.Millisecond).String() }

func clip(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
