package engine

import (
	"encoding/json"
	"time"

	"github.com/keel-runtime/keel"
)

// closeFromJournal closes sp, a span left running, from the journal's
// record of its outcome, and reports whether evs holds one. A model
// call's outcome is the first model.result of its step journaled after
// it started, a tool call's the first tool.result of its step and tool;
// either only if no later attempt of the same call (another span of all)
// started before that result. An approval's wait is closed by its
// approval.decision. A run's root and step spans are closed by its end
// (run.succeeded, run.failed, run.cancelled).
func closeFromJournal(sp *keel.Span, all []keel.Span, evs []keel.Event) bool {
	switch sp.Kind {
	case keel.SpanRun, keel.SpanStep:
		if len(evs) == 0 {
			return false
		}
		switch end := evs[len(evs)-1]; end.Type {
		case keel.EventRunSucceeded, keel.EventRunFailed, keel.EventRunCancelled:
			var d keel.RunEndData
			if json.Unmarshal(end.Data, &d) != nil {
				return false
			}
			sp.Status, sp.Error, sp.Duration = keel.SpanOK, "", max(0, end.Time.Sub(sp.Start))
			if d.Status != keel.RunSucceeded {
				sp.Status, sp.Error = keel.SpanError, string(d.Status)
				if d.Reason != "" {
					sp.Error += ": " + d.Reason
				}
			}
			return true
		}
	case keel.SpanModelCall, keel.SpanToolCall:
		for _, ev := range evs {
			if ev.Time.Before(sp.Start) {
				continue
			}
			var ok bool
			switch {
			case sp.Kind == keel.SpanModelCall && ev.Type == keel.EventModelResult:
				var d keel.ModelResultData
				if json.Unmarshal(ev.Data, &d) == nil && d.Step == sp.Step {
					sp.Status, sp.Error, sp.Duration = keel.SpanOK, "", time.Duration(d.DurationMS)*time.Millisecond
					sp.PromptTokens, sp.CompletionTokens, sp.CostUSD = d.PromptTokens, d.CompletionTokens, d.CostUSD
					ok = true
				}
			case sp.Kind == keel.SpanToolCall && ev.Type == keel.EventToolResult:
				var d keel.ToolResultData
				if json.Unmarshal(ev.Data, &d) == nil && d.Step == sp.Step && d.Name == sp.Name {
					sp.Status, sp.Error, sp.Duration = keel.SpanOK, "", time.Duration(d.DurationMS)*time.Millisecond
					if d.Error != nil {
						sp.Status, sp.Error = keel.SpanError, d.Error.Error()
					}
					ok = true
				}
			}
			if !ok {
				continue
			}
			for _, o := range all {
				if o.ID != sp.ID && o.Kind == sp.Kind && o.Step == sp.Step && o.Name == sp.Name &&
					o.Start.After(sp.Start) && !o.Start.After(ev.Time) {
					return false // the result is a later attempt's
				}
			}
			return true
		}
	case keel.SpanHuman:
		var call string
		for _, ev := range evs {
			switch ev.Type {
			case keel.EventApprovalAsked:
				var d keel.ApprovalRequestData
				if json.Unmarshal(ev.Data, &d) == nil && d.SpanID == sp.ID {
					call = d.Call.ID
				}
			case keel.EventApproval:
				var d keel.ApprovalData
				if call == "" || json.Unmarshal(ev.Data, &d) != nil || d.CallID != call {
					continue
				}
				sp.Status, sp.Error, sp.Duration = keel.SpanOK, d.Reason, max(0, ev.Time.Sub(sp.Start))
				if !d.Approved {
					sp.Status = keel.SpanError
				}
				return true
			}
		}
	}
	return false
}
