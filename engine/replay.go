package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
)

// lifecycleOnly are the events that record what happened to a run rather
// than what it did; a replay, which runs straight through, has none.
var lifecycleOnly = []keel.EventType{keel.EventRunInterrupted, keel.EventRunResumed, keel.EventRunWaiting,
	keel.EventRunPaused, keel.EventHumanDecision, keel.EventApprovalAsked, keel.EventApproval, keel.EventHumanMessage,
	keel.EventTakeOver, keel.EventHandBack, keel.EventHumanTool, keel.EventRunForked, keel.EventPolicyChanged}

// Replay runs a finished run again from its journal without calling any
// model or tool: the engine's own loop runs against the journaled model
// and tool results (a recording standing for the model and the tools),
// the journal's context summaries, a clock that does not wait and a
// journal in memory, and the events it produces are returned (numbered
// from 1). For a run that went straight through they equal the
// journal's, durations aside (see SameEvents); the events of
// interruptions, pauses and human decisions are not reproduced, their
// effect (a result) is. A run cancelled while a model or tool call was in
// flight replays to its cancellation at that call.
func (e *Engine) Replay(ctx context.Context, id keel.RunID) ([]keel.Event, error) {
	run, err := e.cfg.Store.GetRun(ctx, id)
	if err != nil {
		return nil, err
	}
	if !run.Status.Terminal() {
		return nil, fmt.Errorf("run %s is %s; only a finished run can be replayed: %w", id, run.Status, keel.ErrConflict)
	}
	if err := replayable(run); err != nil {
		return nil, err
	}
	evs, err := e.cfg.Store.Events(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	rec := &recording{results: map[string]keel.ToolResultData{}, modelFailures: map[int][]string{}, toolFailures: map[string][]string{}}
	for _, s := range e.cfg.Tools.Specs(ctx) {
		rec.specs = append(rec.specs, s) // side effects decide retries
	}
	summaries := map[int][]keel.ContextSummaryData{}
	// A replay does not decide again: it uses the decisions journaled.
	dec := &recorded{policy: map[string]*keel.PolicyDecision{}, asked: map[string]bool{}, approvals: map[string]keel.ApprovalData{},
		models: map[int][][]keel.ModelDecision{}, labels: map[string][]string{}}
	for _, ev := range evs {
		switch ev.Type {
		case keel.EventToolCall:
			var d keel.ToolCallData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return nil, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			if d.Policy != nil {
				dec.policy[d.Call.ID] = d.Policy
			}
		case keel.EventApprovalAsked:
			var d keel.ApprovalRequestData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return nil, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			dec.asked[d.Call.ID] = true
			if d.Policy != nil {
				dec.policy[d.Call.ID] = d.Policy
			}
		case keel.EventApproval:
			var d keel.ApprovalData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return nil, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			dec.approvals[d.CallID] = d
		case keel.EventRunStarted:
			if err := json.Unmarshal(ev.Data, &rec.started); err != nil {
				return nil, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
		case keel.EventModelResult:
			var d keel.ModelResultData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return nil, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			rec.steps = append(rec.steps, d)
			dec.models[d.Step] = append(dec.models[d.Step], d.Policy)
		case keel.EventToolResult:
			var d keel.ToolResultData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return nil, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			rec.results[d.CallID] = d
			dec.labels[d.CallID] = d.Labels
			if d.Policy != nil {
				dec.policy[d.CallID] = d.Policy
			}
		case keel.EventContextSummary:
			var d keel.ContextSummaryData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return nil, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			summaries[d.Step] = append(summaries[d.Step], d)
		case keel.EventStepRetry:
			var d keel.StepRetryData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return nil, fmt.Errorf("journal event %d: %w", ev.Seq, err)
			}
			if d.CallID == "" {
				rec.modelFailures[d.Step] = append(rec.modelFailures[d.Step], d.Error)
			} else {
				rec.toolFailures[d.CallID] = append(rec.toolFailures[d.CallID], d.Error)
			}
		}
	}
	// A run cancelled while a model or tool call was in flight has no
	// result for that call: where the recording runs out, the replay is
	// cancelled as the run was.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if run.Status == keel.RunCancelled {
		rec.cancel = func() { cancel(errCanceled) }
	}
	mem := &memStore{}
	run.Status, run.LastSeq = keel.RunQueued, 0
	if err := mem.CreateRun(ctx, run); err != nil {
		return nil, err
	}
	cfg := e.cfg
	cfg.Store, cfg.Model, cfg.Tools, cfg.Logger = mem, rec, rec, e.log
	// A replay calls no model: its interceptors have nothing to see.
	cfg.ModelInterceptors = nil
	cfg.Policy, cfg.RequireApproval = nil, nil
	cfg.Sleep = func(context.Context, time.Duration) error { return nil } // the retry, not its wait
	replayer, err := New(cfg)
	if err != nil {
		return nil, err
	}
	dec.goesOn = map[int]bool{}
	for i, st := range rec.steps {
		if len(st.ToolCalls) == 0 && i+1 < len(rec.steps) {
			dec.goesOn[st.Step] = true
		}
	}
	replayer.fit = replayer.recordedSummaries(summaries)
	replayer.replay = dec
	replayer.loop(ctx, run, nil)
	replayer.flushHeld(ctx, run.ID)
	return mem.events, nil
}

// SameEvents reports the first difference between a run's journal and its
// replay, ignoring lifecycle-only events of the journal, times and
// durations; "" means they match.
func SameEvents(journal, replay []keel.Event) string {
	var want []keel.Event
	for _, ev := range journal {
		if !slices.Contains(lifecycleOnly, ev.Type) {
			want = append(want, ev)
		}
	}
	for i := range max(len(want), len(replay)) {
		if i >= len(want) || i >= len(replay) {
			return fmt.Sprintf("journal has %d events and the replay %d", len(want), len(replay))
		}
		a, b := normalize(want[i]), normalize(replay[i])
		if a != b {
			return fmt.Sprintf("event %d: journal %s, replay %s", i+1, a, b)
		}
	}
	return ""
}

// normalize renders an event without what differs between a run and its
// replay: time, sequence number (lifecycle events are skipped), durations,
// and which human messages a step read (a replay reads none: they are
// input, like the results it reuses).
func normalize(ev keel.Event) string {
	var data map[string]any
	_ = json.Unmarshal(ev.Data, &data)
	delete(data, "duration_ms")
	delete(data, "human_seqs") // a person's messages are input the replay does not read
	if ev.Type == keel.EventStepRetry {
		// Why an attempt failed came from outside, like a result; the
		// replay reproduces that it failed, and the retry.
		delete(data, "error")
		delete(data, "wait_ms")
	}
	b, _ := json.Marshal(data)
	return string(ev.Type) + " " + string(b)
}

// recording serves a replay: the journaled model results in order, and
// the journaled tool results by call.
type recording struct {
	mu      sync.Mutex
	started keel.RunStartedData
	specs   []keel.ToolSpec // the installed tools, for their side effects
	steps   []keel.ModelResultData
	next    int
	results map[string]keel.ToolResultData
	// modelFailures and toolFailures are the failed attempts the journal
	// shows before a step's result (step.retry), by step and by call;
	// the replay fails them again, so the engine retries as it did.
	modelFailures map[int][]string
	toolFailures  map[string][]string
	// cancel, for a run that was cancelled, cancels the replay where the
	// journal has no result for a call; nil otherwise.
	cancel func()
}

func (r *recording) Models(context.Context) ([]models.ModelInfo, error) { return nil, nil }

func (r *recording) Chat(_ context.Context, _ models.ChatRequest, _ func(models.Delta)) (models.ChatResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.next >= len(r.steps) {
		if r.cancel != nil {
			r.cancel()
			return models.ChatResponse{}, &models.Error{Kind: models.KindCancelled, Msg: "the run was cancelled during this call"}
		}
		return models.ChatResponse{}, fmt.Errorf("the journal has no model result for step %d", r.next+1)
	}
	d := r.steps[r.next]
	if f := r.modelFailures[d.Step]; len(f) > 0 {
		r.modelFailures[d.Step] = f[1:]
		return models.ChatResponse{}, &models.Error{Kind: models.KindTimeout, Msg: f[0]}
	}
	r.next++
	return models.ChatResponse{Model: d.Model, Message: models.Message{Role: models.RoleAssistant, Content: d.Content, ToolCalls: d.ToolCalls},
		Usage: models.Usage{PromptTokens: d.PromptTokens, CompletionTokens: d.CompletionTokens}}, nil
}

func (r *recording) Specs(context.Context) []keel.ToolSpec {
	specs := make([]keel.ToolSpec, len(r.started.Tools))
	for i, name := range r.started.Tools {
		specs[i] = keel.ToolSpec{Name: name}
		for _, s := range r.specs {
			if s.Name == name {
				specs[i].SideEffects = s.SideEffects
			}
		}
	}
	return specs
}

// ReadsPrivate reports what the journal says: whether a result of the
// tool name was private (see PrivateReader).
func (r *recording) ReadsPrivate(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, res := range r.results {
		if res.Name == name && res.Private {
			return true
		}
	}
	return false
}

// Call answers with the journaled result of the call inv names.
func (r *recording) Call(_ context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	r.mu.Lock()
	res, ok := r.results[inv.CallID]
	if f := r.toolFailures[inv.CallID]; len(f) > 0 {
		r.toolFailures[inv.CallID] = f[1:]
		r.mu.Unlock()
		return nil, &keel.ToolError{Code: keel.ToolTimeout, Message: f[0]}
	}
	r.mu.Unlock()
	if ok && res.Touched != nil && inv.Touched != nil {
		*inv.Touched = *res.Touched
	}
	switch {
	case !ok && r.cancel != nil:
		r.cancel()
		return nil, fmt.Errorf("the run was cancelled during call %s of %s: %w", inv.CallID, inv.Name, context.Canceled)
	case !ok:
		return nil, fmt.Errorf("the journal has no result for call %s of %s", inv.CallID, inv.Name)
	case res.Error != nil:
		return nil, res.Error
	}
	return res.Output, nil
}

// memStore is the Store of a replay: the run and its events in memory,
// and a trace that keeps nothing.
type memStore struct {
	discardTracer
	mu     sync.Mutex
	run    keel.Run
	events []keel.Event
}

func (m *memStore) CreateRun(_ context.Context, r keel.Run) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.run = r
	return nil
}

func (m *memStore) GetRun(context.Context, keel.RunID) (keel.Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.run, nil
}

func (m *memStore) CreateRunWith(ctx context.Context, r keel.Run, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error) {
	if err := m.CreateRun(ctx, r); err != nil {
		return nil, err
	}
	return m.AppendAll(ctx, r.ID, evs, upd)
}

func (m *memStore) AppendAll(_ context.Context, id keel.RunID, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if upd != nil {
		if !keel.CanTransition(m.run.Status, upd.Status) {
			return nil, fmt.Errorf("replay: %s cannot become %s: %w", m.run.Status, upd.Status, keel.ErrConflict)
		}
		m.run.Status, m.run.Result, m.run.Error = upd.Status, upd.Result, upd.Error
	}
	out := make([]keel.Event, len(evs))
	for i, ev := range evs {
		out[i] = keel.Event{RunID: id, Seq: int64(len(m.events) + 1), Type: ev.Type, Time: ev.Time, Data: ev.Data}
		m.events = append(m.events, out[i])
	}
	m.run.LastSeq = out[len(out)-1].Seq
	return out, nil
}

func (m *memStore) RunsWithStatus(context.Context, ...keel.RunStatus) ([]keel.Run, error) {
	return nil, nil
}
func (m *memStore) Events(context.Context, keel.RunID, int64) ([]keel.Event, error) {
	return nil, nil // a replay starts from nothing
}
func (m *memStore) RunByIdempotencyKey(context.Context, string) (keel.Run, error) {
	return keel.Run{}, keel.ErrNotFound
}

// discardTracer is a Tracer that keeps nothing.
type discardTracer struct{}

func (discardTracer) StartSpan(context.Context, keel.Span) error              { return nil }
func (discardTracer) FinishSpan(context.Context, keel.Span) error             { return nil }
func (discardTracer) Sync(context.Context) error                              { return nil }
func (discardTracer) Spans(context.Context, keel.RunID) ([]keel.Span, error)  { return nil, nil }
func (discardTracer) RunsWithOpenSpans(context.Context) ([]keel.RunID, error) { return nil, nil }
