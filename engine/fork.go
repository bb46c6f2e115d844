package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/policy"
)

// ForkRequest asks for a run forked from another.
type ForkRequest struct {
	From keel.RunID
	// Step is the last model step of From the fork keeps, with its tool
	// results; 0 keeps nothing but the goal.
	Step int
	// Model, when set, is the model the fork uses from then on.
	Model string
	// Goal, when set, replaces the goal (edited input).
	Goal string
	// Message, when set, is a person's message journaled after the
	// copied steps, which the fork's next model step reads (see
	// keel.ForkRequest.Message).
	Message string
	// MaxSteps, when not 0, is the fork's step bound, greater than Step;
	// 0 keeps the source's.
	MaxSteps int
	// IdempotencyKey, when set, makes a retried fork return the run the
	// first one created (see keel.ForkRequest.IdempotencyKey).
	IdempotencyKey string
}

// forkCopied are the events a fork copies from its source: what the run
// did and was told, not what happened to it.
var forkCopied = []keel.EventType{keel.EventModelResult, keel.EventToolCall, keel.EventToolResult,
	keel.EventHumanMessage, keel.EventHumanTool, keel.EventStepRetry, keel.EventContextSummary}

// Fork starts a new run from the journal of another, up to and including
// model step req.Step and its tool calls' results, with another model or
// goal if asked. The source is not changed. The fork's journal starts with
// run.forked, then run.started and the copied events, and it goes on
// (run.resumed) from step req.Step+1: nothing copied is done again. A
// tool call of step req.Step without a result in the source never
// finished there and runs in the fork. Source runs that are still
// advancing cannot be forked: pause them first.
//
// With req.Message the fork is the next turn of a conversation: the
// message is journaled after the copied steps, and a fork of a run that
// answered asks the model again, reading it. With req.IdempotencyKey a
// fork asked for again (a lost response) returns the run the first one
// created. Errors wrap keel.ErrInvalid (a step outside the source's,
// MaxSteps not above Step, a key over 200 bytes, a malformed label),
// keel.ErrNotFound or keel.ErrConflict (a source still advancing, or a
// key used for another run).
func (e *Engine) Fork(ctx context.Context, req ForkRequest) (keel.Run, error) {
	if len(req.IdempotencyKey) > 200 {
		return keel.Run{}, fmt.Errorf("idempotency key longer than 200 bytes: %w", keel.ErrInvalid)
	}
	if req.MaxSteps < 0 || req.MaxSteps != 0 && req.MaxSteps <= req.Step {
		return keel.Run{}, fmt.Errorf("max_steps %d must be above the step forked from (%d): %w", req.MaxSteps, req.Step, keel.ErrInvalid)
	}
	if req.IdempotencyKey != "" {
		if r, err := e.sameFork(ctx, req); err == nil || !errors.Is(err, keel.ErrNotFound) {
			return r, err
		}
	}
	src, err := e.cfg.Store.GetRun(ctx, req.From)
	if err != nil {
		return keel.Run{}, err
	}
	if src.KindOrAgent() != keel.KindAgent {
		return keel.Run{}, fmt.Errorf("run %s is a %s run; only agent runs can be forked: %w", src.ID, src.KindOrAgent(), keel.ErrInvalid)
	}
	if src.Status == keel.RunRunning || src.Status == keel.RunQueued {
		return keel.Run{}, fmt.Errorf("run %s is %s; pause it or let it end before forking it: %w", src.ID, src.Status, keel.ErrConflict)
	}
	evs, err := e.cfg.Store.Events(ctx, src.ID, 0)
	if err != nil {
		return keel.Run{}, err
	}
	copied, last, err := forkPrefix(evs, req.Step)
	if err != nil {
		return keel.Run{}, err
	}
	if req.Step < 0 || req.Step > last {
		return keel.Run{}, fmt.Errorf("run %s has steps 0..%d; cannot fork from step %d: %w", src.ID, last, req.Step, keel.ErrInvalid)
	}
	run := src
	run.ID = keel.RunID("run_" + e.cfg.NewID())
	run.Status, run.Result, run.Error, run.LastSeq, run.IdempotencyKey = keel.RunQueued, "", "", 0, req.IdempotencyKey
	if req.MaxSteps != 0 {
		run.MaxSteps = req.MaxSteps
	}
	run.Policy.Deadline = time.Time{} // a fork is a new run: the source's deadline is not its own
	if g := strings.TrimSpace(req.Goal); g != "" {
		run.Goal = g
	}
	if req.Model != "" {
		if run.Model, err = e.resolveModel(ctx, req.Model); err != nil {
			return keel.Run{}, err
		}
	}
	now := e.cfg.Now()
	run.CreatedAt, run.UpdatedAt = now, now
	if err := e.cfg.Store.CreateRun(ctx, run); err != nil {
		if req.IdempotencyKey != "" && errors.Is(err, keel.ErrConflict) {
			// Another fork with the key won the race.
			return e.sameFork(ctx, req)
		}
		return keel.Run{}, fmt.Errorf("fork: %w", err)
	}
	fork := keel.RunForkedData{From: src.ID, Step: req.Step}
	if run.Model != src.Model {
		fork.Model = run.Model
	}
	if run.Goal != src.Goal {
		fork.Goal = run.Goal
	}
	if _, err := e.appendEvent(ctx, run.ID, keel.EventRunForked, fork, nil); err != nil {
		return keel.Run{}, err
	}
	specs := e.toolsFor(ctx, run, e.cfg.Tools.Specs(ctx))
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	if _, err := e.appendEvent(ctx, run.ID, keel.EventRunStarted,
		keel.RunStartedData{Goal: run.Goal, Model: run.Model, Tools: names, MaxSteps: run.MaxSteps},
		&keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		return keel.Run{}, err
	}
	// Copied events get new sequence numbers; the human messages a model
	// step read are named by them, so those references are renumbered.
	seqs := map[int64]int64{}
	for _, ev := range copied {
		data := ev.Data
		if ev.Type == keel.EventModelResult {
			if data, err = renumberHumanSeqs(data, seqs); err != nil {
				return keel.Run{}, fmt.Errorf("fork: journal event %d: %w", ev.Seq, err)
			}
		}
		stored, err := e.cfg.Store.AppendAll(ctx, run.ID, []keel.Event{{Type: ev.Type, Time: ev.Time, Data: data}}, nil)
		if err != nil {
			return keel.Run{}, fmt.Errorf("fork: copy event %d: %w", ev.Seq, err)
		}
		seqs[ev.Seq] = stored[0].Seq
	}
	if req.Message != "" {
		labels := labelNames(e.labelPolicy(run).LabelsOf(policy.Source{Kind: policy.SourceHuman}))
		if _, err := e.appendEvent(ctx, run.ID, keel.EventHumanMessage, keel.HumanMessageData{Content: req.Message, Labels: labels}, nil); err != nil {
			return keel.Run{}, err
		}
	}
	// The fork now looks like a run the daemon stopped after step
	// req.Step: it goes on from its journal like a resumed one.
	if _, err := e.appendEvent(ctx, run.ID, keel.EventRunInterrupted, keel.RunEndData{Status: keel.RunInterrupted, Reason: "forked; starting"},
		&keel.RunUpdate{Status: keel.RunInterrupted}); err != nil {
		return keel.Run{}, err
	}
	run, err = e.cfg.Store.GetRun(ctx, run.ID)
	if err != nil {
		return keel.Run{}, err
	}
	if err := e.launch(run); err != nil {
		return run, err
	}
	return run, nil
}

// sameFork returns the run an earlier Fork with req's idempotency key
// created: keel.ErrNotFound if none did, keel.ErrConflict if that key
// made another run (a start, or a fork of another source).
func (e *Engine) sameFork(ctx context.Context, req ForkRequest) (keel.Run, error) {
	r, err := e.cfg.Store.RunByIdempotencyKey(ctx, req.IdempotencyKey)
	if err != nil {
		return keel.Run{}, err
	}
	evs, err := e.cfg.Store.Events(ctx, r.ID, 0)
	if err != nil {
		return keel.Run{}, err
	}
	var d keel.RunForkedData
	if len(evs) == 0 || evs[0].Type != keel.EventRunForked || json.Unmarshal(evs[0].Data, &d) != nil || d.From != req.From {
		return keel.Run{}, fmt.Errorf("idempotency key %q was used for run %s, not a fork of %s: %w", req.IdempotencyKey, r.ID, req.From, keel.ErrConflict)
	}
	return r, nil
}

// forkPrefix returns the events of evs a fork from step keeps (those of
// forkCopied up to the first model step after it, tool calls only with
// their results) and the source's last model step.
func forkPrefix(evs []keel.Event, step int) ([]keel.Event, int, error) {
	type stepped struct {
		Step   int    `json:"step"`
		CallID string `json:"call_id"`
		Call   struct {
			ID string `json:"id"`
		} `json:"call"`
	}
	last, cut := 0, len(evs)
	finished := map[string]bool{}
	for i, ev := range evs {
		if ev.Type != keel.EventModelResult && ev.Type != keel.EventToolResult {
			continue
		}
		var d stepped
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			return nil, 0, fmt.Errorf("journal event %d: %w", ev.Seq, err)
		}
		if ev.Type == keel.EventToolResult {
			finished[d.CallID] = true
			continue
		}
		last = max(last, d.Step)
		if d.Step > step && cut == len(evs) {
			cut = i
		}
	}
	var out []keel.Event
	for _, ev := range evs[:cut] {
		switch {
		case ev.Type == keel.EventToolCall:
			var d stepped
			if json.Unmarshal(ev.Data, &d) == nil && finished[d.Call.ID] {
				out = append(out, ev)
			}
		case slices.Contains(forkCopied, ev.Type):
			out = append(out, ev)
		}
	}
	return out, last, nil
}

// renumberHumanSeqs rewrites a model.result's human_seqs through seqs.
func renumberHumanSeqs(data json.RawMessage, seqs map[int64]int64) (json.RawMessage, error) {
	var d keel.ModelResultData
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, err
	}
	if len(d.HumanSeqs) == 0 {
		return data, nil
	}
	for i, s := range d.HumanSeqs {
		d.HumanSeqs[i] = seqs[s]
	}
	return json.Marshal(d)
}
