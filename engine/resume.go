package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/policy"
)

// journal is where a run stands according to its events: the messages
// the model has seen, the last model step, and the calls of that step
// that have no result yet. The engine rebuilds it from the store on every
// (re)start of a run's loop, so a resumed run continues from exactly what
// was journaled: recorded model and tool results are reused, never asked
// for again.
type journal struct {
	fresh     bool // run.started is not journaled yet
	lastSeq   int64
	msgs      []models.Message
	step      int                             // the last journaled model step
	pending   []keel.ToolCall                 // calls of that step without a result, in order
	intent    map[string]bool                 // calls whose tool.call intent is journaled
	policy    map[string]*keel.PolicyDecision // the decision journaled with each intent, if any
	decision  map[string]keel.HumanDecisionData
	asked     map[string]keel.ApprovalRequestData // approvals requested, by call
	askedAt   map[string]time.Time
	approvals map[string]keel.ApprovalData // approvals given or refused, by call
	unread    []inboxMsg                   // human messages no model step has read yet
	answer    *string                      // the final answer, when the last step gave one
	model     string                       // the model that served the last step, when one did
	// policyDigest is the digest of the policy the journal last shows in
	// force (a policy.changed, a journaled decision); "" if none.
	policyDigest string

	// decided is the human.decision that answered each call's last
	// run.waiting (a new wait on the call clears it); approvedBy is the
	// approval.decision of each call (a call is approved once). Only
	// restore fills them.
	decided, approvedBy map[string]answer
}

// newJournal is the journal of a run that has journaled nothing.
func (e *Engine) newJournal(run keel.Run) journal {
	return journal{
		fresh:     true,
		msgs:      initialMessages(e.cfg.SystemPrompt, run),
		intent:    map[string]bool{},
		policy:    map[string]*keel.PolicyDecision{},
		decision:  map[string]keel.HumanDecisionData{},
		asked:     map[string]keel.ApprovalRequestData{},
		askedAt:   map[string]time.Time{},
		approvals: map[string]keel.ApprovalData{},
	}
}

// restore reads run's journal.
func (e *Engine) restore(ctx context.Context, run keel.Run) (journal, error) {
	evs, err := e.cfg.Store.Events(ctx, run.ID, 0)
	if err != nil {
		return journal{}, fmt.Errorf("read journal: %w", err)
	}
	j := e.newJournal(run)
	j.decided, j.approvedBy = map[string]answer{}, map[string]answer{}
	for _, ev := range evs {
		j.lastSeq = ev.Seq
		switch ev.Type {
		case keel.EventRunStarted:
			j.fresh = false
		case keel.EventModelResult:
			var d keel.ModelResultData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return journal{}, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			// The human messages this step read come before its reply,
			// exactly those it names.
			var read []inboxMsg
			read, j.unread = takeSeqs(j.unread, d.HumanSeqs)
			j.msgs = append(j.msgs, humanMessages(run, read)...)
			j.step, j.pending, j.answer = d.Step, append([]keel.ToolCall(nil), d.ToolCalls...), nil
			if d.Model != "" {
				j.model = d.Model
			}
			if n := len(d.Policy); n > 0 {
				j.policyDigest = d.Policy[n-1].Digest
			}
			j.msgs = append(j.msgs, models.Message{Role: models.RoleAssistant, Content: d.Content, ToolCalls: d.ToolCalls, Labels: d.Labels})
			if len(d.ToolCalls) == 0 {
				answer := d.Content
				j.answer = &answer
			}
		case keel.EventToolCall:
			var d keel.ToolCallData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return journal{}, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			j.intent[d.Call.ID] = true
			if d.Policy != nil {
				j.policy[d.Call.ID] = d.Policy
				j.policyDigest = d.Policy.Digest
			}
			delete(j.decision, d.Call.ID) // a retry decided before it is used up
		case keel.EventToolResult:
			var d keel.ToolResultData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return journal{}, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			if d.Policy != nil {
				j.policyDigest = d.Policy.Digest
			}
			j.msgs = append(j.msgs, toolMessage(run, d))
			for i, c := range j.pending {
				if c.ID == d.CallID {
					j.pending = append(j.pending[:i:i], j.pending[i+1:]...)
					break
				}
			}
		case keel.EventHumanMessage:
			var d keel.HumanMessageData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return journal{}, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			j.unread = append(j.unread, inboxMsg{seq: ev.Seq, text: d.Content, labels: d.Labels})
			// A message after an answer (a fork that is the next turn of
			// a conversation, keel.ForkRequest.Message) asks for another.
			j.answer = nil
		case keel.EventContextSummary:
			var d keel.ContextSummaryData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return journal{}, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			if j.msgs, err = applySummary(run, j.msgs, d); err != nil {
				return journal{}, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
		case keel.EventHumanTool:
			var d keel.HumanToolData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return journal{}, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			j.unread = append(j.unread, inboxMsg{seq: ev.Seq, text: humanToolText(d), labels: withPrivate(d.Labels, d.Private)})
		case keel.EventHandBack:
			var d keel.HumanControlData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return journal{}, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			if d.Note != "" {
				j.unread = append(j.unread, inboxMsg{seq: ev.Seq, text: handBackText(d.Note)})
			}
		case keel.EventApprovalAsked:
			var d keel.ApprovalRequestData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return journal{}, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			j.asked[d.Call.ID], j.askedAt[d.Call.ID] = d, ev.Time
			if d.Policy != nil {
				j.policyDigest = d.Policy.Digest
			}
		case keel.EventPolicyChanged:
			var d keel.PolicyChangeData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return journal{}, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			j.policyDigest = d.Digest
		case keel.EventApproval:
			var d keel.ApprovalData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return journal{}, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			j.approvals[d.CallID] = d
			j.approvedBy[d.CallID] = answer{what: "denied", seq: ev.Seq}
			if d.Approved {
				j.approvedBy[d.CallID] = answer{what: "approved", seq: ev.Seq}
			}
		case keel.EventHumanDecision:
			var d keel.HumanDecisionData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return journal{}, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			j.decision[d.CallID] = d
			j.decided[d.CallID] = answer{what: d.Decision, seq: ev.Seq}
		case keel.EventRunWaiting:
			var d keel.RunWaitingData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return journal{}, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			if d.Call != nil {
				delete(j.decided, d.Call.ID) // a new wait, for a new answer
			}
		}
	}
	return j, nil
}

// initialMessages opens a run's conversation; the goal carries the
// labels of the run's inputs.
func initialMessages(system string, run keel.Run) []models.Message {
	return []models.Message{
		{Role: models.RoleSystem, Content: system},
		{Role: models.RoleUser, Content: run.Goal, Labels: labelNames(inputLabels(run))},
	}
}

// humanMessages turns a person's words into the user messages the model
// reads, with their labels.
func humanMessages(run keel.Run, ms []inboxMsg) []models.Message {
	out := make([]models.Message, len(ms))
	for i, m := range ms {
		out[i] = models.Message{Role: models.RoleUser, Content: "Message from the person supervising this run: " + m.text, Labels: m.labels}
	}
	return out
}

// takeSeqs splits ms into those whose seq is in seqs and the rest.
func takeSeqs(ms []inboxMsg, seqs []int64) (taken, rest []inboxMsg) {
	for _, m := range ms {
		if slices.Contains(seqs, m.seq) {
			taken = append(taken, m)
		} else {
			rest = append(rest, m)
		}
	}
	return taken, rest
}

func seqsOf(ms []inboxMsg) []int64 {
	var out []int64
	for _, m := range ms {
		out = append(out, m.seq)
	}
	return out
}

// toolMessage is the message that gives the model a tool's result: its
// output, or its classified error as {"error": ...}.
func toolMessage(run keel.Run, res keel.ToolResultData) models.Message {
	content := string(res.Output)
	if res.Error != nil {
		b, _ := json.Marshal(map[string]any{"error": res.Error})
		content = string(b)
	}
	return models.Message{Role: models.RoleTool, ToolCallID: res.CallID, ToolName: res.Name, Content: content, Labels: withPrivate(res.Labels, res.Private)}
}

// readsPrivate reports whether the tool name may read private data (see
// PrivateReader).
func (e *Engine) readsPrivate(name string) bool {
	pr, ok := e.cfg.Tools.(PrivateReader)
	return ok && pr.ReadsPrivate(name)
}

// spent returns what the run's model calls spent so far: the usage
// journaled with each model result, and the trace spans of the calls that
// journal none (failed calls, the planner's). A result's span is written
// lazily and may be lost in a crash; its model.result is not. Events
// copied into a fork (before its run.forked) were spent by its source.
//
// The spans are read first, and the store's Spans returns every span
// finished before it was called: a call whose span is read has its
// result, if any, among the events read after, and a call whose span is
// not read yet has either its result among them or no result at all (it
// is still running). So each call is counted once, whichever goroutine
// is writing meanwhile.
func (e *Engine) spent(ctx context.Context, id keel.RunID) (tokens int64, usd float64) {
	spans, err := e.cfg.Store.Spans(ctx, id)
	if err != nil {
		e.log.Warn("read spans for the run's budget", logkey.Run, id, logkey.Err, err)
		return 0, 0
	}
	evs, err := e.cfg.Store.Events(ctx, id, 0)
	if err != nil {
		e.log.Warn("read the journal for the run's budget", logkey.Run, id, logkey.Err, err)
		return 0, 0
	}
	var results []keel.ModelResultData
	for _, ev := range evs {
		switch ev.Type {
		case keel.EventRunForked:
			results = results[:0]
		case keel.EventModelResult:
			var d keel.ModelResultData
			if json.Unmarshal(ev.Data, &d) == nil {
				results = append(results, d)
			}
		}
	}
	// Spans that crossed back from a step run elsewhere (under a
	// hand-off span) are that run's spending, counted from its
	// step.completed_elsewhere.
	spans = ownSpans(spans)
	// The successful spans of a step stand for its journaled results.
	ok := map[int]int{}
	for _, sp := range spans {
		if sp.Kind == keel.SpanModelCall && sp.Status == keel.SpanOK {
			ok[sp.Step]++
		}
	}
	for _, d := range results {
		if ok[d.Step] > 0 {
			ok[d.Step]--
			continue
		}
		tokens += int64(d.PromptTokens + d.CompletionTokens)
		usd += d.CostUSD
	}
	for _, sp := range spans {
		if sp.Kind == keel.SpanModelCall {
			tokens += int64(sp.PromptTokens + sp.CompletionTokens)
			usd += sp.CostUSD
		}
	}
	return tokens, usd
}

// ownSpans is spans without those under a hand-off span: the spans of
// runs elsewhere, imported into the run's trace.
func ownSpans(spans []keel.Span) []keel.Span {
	away := map[string]bool{}
	for _, sp := range spans {
		if sp.Kind == keel.SpanHandOff {
			away[sp.ID] = true
		}
	}
	if len(away) == 0 {
		return spans
	}
	for grew := true; grew; {
		grew = false
		for _, sp := range spans {
			if !away[sp.ID] && away[sp.ParentID] {
				away[sp.ID], grew = true, true
			}
		}
	}
	out := make([]keel.Span, 0, len(spans))
	for _, sp := range spans {
		if !away[sp.ID] {
			out = append(out, sp)
		}
	}
	return out
}

// rerunnable reports whether a tool may run again when its earlier call's
// outcome is unknown: only tools declared read-only or idempotent.
func (e *Engine) rerunnable(ctx context.Context, name string) bool {
	class, ok := e.sideEffects(ctx, name)
	return ok && (class == keel.SideEffectReadOnly || class == keel.SideEffectIdempotentWrite)
}

// sideEffects returns the side-effect class of the tool name, and
// whether there is such a tool.
func (e *Engine) sideEffects(ctx context.Context, name string) (keel.SideEffect, bool) {
	if se, ok := e.cfg.Tools.(SideEffecter); ok {
		return se.SideEffects(name)
	}
	for _, s := range e.cfg.Tools.Specs(ctx) {
		if s.Name == name {
			return s.SideEffects, true
		}
	}
	return "", false
}

// Resume starts the loop of every interrupted run again, from its
// journal. It returns how many it started.
func (e *Engine) Resume(ctx context.Context) (int, error) {
	runs, err := e.cfg.Store.RunsWithStatus(ctx, keel.RunInterrupted)
	if err != nil {
		return 0, fmt.Errorf("resume: %w", err)
	}
	// A waiting run whose decision or approval is journaled was stopped
	// between recording the answer and going on: it goes on now.
	waiting, err := e.cfg.Store.RunsWithStatus(ctx, keel.RunWaiting)
	if err != nil {
		return 0, fmt.Errorf("resume: %w", err)
	}
	for _, r := range waiting {
		j, err := e.restore(ctx, r)
		if err != nil {
			return 0, fmt.Errorf("resume %s: %w", r.ID, err)
		}
		if j.answered() {
			runs = append(runs, r)
		}
	}
	n := 0
	for _, r := range runs {
		if err := e.launch(r); errors.Is(err, keel.ErrConflict) {
			continue // already going on (an answer given meanwhile launched it)
		} else if errors.Is(err, keel.ErrInvalid) {
			// Its workspace's policy does not load: it stays as it is
			// until the file is fixed and the daemon starts again.
			e.log.Error("resume", logkey.Run, r.ID, logkey.Err, err)
			continue
		} else if err != nil {
			return n, fmt.Errorf("resume %s: %w", r.ID, err)
		}
		n++
	}
	return n, nil
}

// answered reports whether the call the run waits on has a human answer
// in the journal (a decision, or an approval given or refused) that no
// loop has acted on yet.
func (j journal) answered() bool {
	if len(j.pending) == 0 {
		return false
	}
	id := j.pending[0].ID
	_, approved := j.approvals[id]
	return j.decision[id].Decision != "" || approved
}

// Decide records a human's decision about the tool call a waiting run
// waits on, and lets the run go on. decision is keel.DecisionRetry, Skip
// or Done (with output, the call's result as the human knows it).
//
// Exactly one decision is journaled per wait, however many callers
// decide at once: the others get a *keel.AlreadyDecidedError naming the
// one that was, and nothing is journaled for them. Any error means
// nothing was journaled: keel.ErrInvalid for a bad decision or output,
// keel.ErrNotFound for an unknown run, keel.ErrConflict when the run
// does not wait on that call.
func (e *Engine) Decide(ctx context.Context, id keel.RunID, callID, decision string, output json.RawMessage, note string) (keel.Run, error) {
	switch decision {
	case keel.DecisionRetry, keel.DecisionSkip, keel.DecisionDone:
	default:
		return keel.Run{}, fmt.Errorf("decision %q: want retry, skip or done: %w", decision, keel.ErrInvalid)
	}
	if len(output) > 0 && !json.Valid(output) {
		return keel.Run{}, fmt.Errorf("output is not JSON: %w", keel.ErrInvalid)
	}
	// One answer per wait: the check and the append are one step.
	defer e.deciding.lock(id)()
	run, err := e.cfg.Store.GetRun(ctx, id)
	if err != nil {
		return keel.Run{}, err
	}
	j, err := e.restore(ctx, run)
	if err != nil {
		return run, err
	}
	if a, ok := j.decided[callID]; ok {
		return run, decided(id, callID, a)
	}
	if run.Status != keel.RunWaiting {
		return run, fmt.Errorf("run %s is %s, not waiting for a decision: %w", id, run.Status, keel.ErrConflict)
	}
	if len(j.pending) == 0 || j.pending[0].ID != callID {
		return run, fmt.Errorf("run %s is not waiting on call %q: %w", id, callID, keel.ErrConflict)
	}
	if _, err := e.appendEvent(ctx, id, keel.EventHumanDecision, keel.HumanDecisionData{CallID: callID, Decision: decision, Output: output, Note: note}, nil); err != nil {
		return run, err
	}
	if err := e.launchAnswered(run); err != nil {
		return run, err
	}
	return e.cfg.Store.GetRun(ctx, id)
}

// Say gives a run a person's message, which the model reads before its
// next step (a running run at its next step boundary; a paused or
// waiting one when it goes on). It is journaled as human.message. It is
// SayLabeled with no labels of its own.
func (e *Engine) Say(ctx context.Context, id keel.RunID, text string) (keel.Run, error) {
	return e.SayLabeled(ctx, id, text, nil)
}

// SayLabeled is Say for a message that carries labels: those given and
// those the policy gives human messages (sources "human") enter the
// run's context with it (keel.HumanMessageData.Labels). Errors wrap
// keel.ErrInvalid (an empty message, a malformed label), keel.ErrNotFound
// or keel.ErrConflict (the run has ended).
func (e *Engine) SayLabeled(ctx context.Context, id keel.RunID, text string, labels []string) (keel.Run, error) {
	if text == "" {
		return keel.Run{}, fmt.Errorf("the message is empty: %w", keel.ErrInvalid)
	}
	if err := checkLabels(labels); err != nil {
		return keel.Run{}, err
	}
	run, err := e.cfg.Store.GetRun(ctx, id)
	if err != nil {
		return keel.Run{}, err
	}
	if run.Status.Terminal() {
		return run, fmt.Errorf("run %s already %s: %w", id, run.Status, keel.ErrConflict)
	}
	if run.KindOrAgent() != keel.KindAgent {
		return run, fmt.Errorf("run %s is a %s run, whose steps are its sub-agents: say it to the sub-agent of the step (keel show %s lists them): %w", id, run.KindOrAgent(), id, keel.ErrInvalid)
	}
	labels = unionNames(labels, labelNames(e.labelPolicy(run).LabelsOf(policy.Source{Kind: policy.SourceHuman})))
	ev, err := e.appendEvent(ctx, id, keel.EventHumanMessage, keel.HumanMessageData{Content: text, Labels: labels}, nil)
	if err != nil {
		return run, err
	}
	// A running loop reads it from its inbox; a loop that starts later
	// reads it from the journal. The sequence number keeps a loop that
	// started in between from reading it twice (see readInbox).
	e.mu.Lock()
	if _, active := e.active[id]; active {
		e.inbox[id] = append(e.inbox[id], inboxMsg{seq: ev.Seq, text: text, labels: labels})
	}
	e.mu.Unlock()
	return e.cfg.Store.GetRun(ctx, id)
}

// inboxMsg is a human message for a running loop, with its journal seq
// and its labels.
type inboxMsg struct {
	seq    int64
	text   string
	labels []string
}

// readInbox returns and clears the messages said to a running run,
// leaving out those journaled at or before seq (the loop read those from
// the journal when it started).
func (e *Engine) readInbox(id keel.RunID, seq int64) []inboxMsg {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []inboxMsg
	for _, m := range e.inbox[id] {
		if m.seq > seq {
			out = append(out, m)
		}
	}
	delete(e.inbox, id)
	return out
}
