package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
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
func (e *Engine) Fork(ctx context.Context, req ForkRequest) (keel.Run, error) {
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
	run.Status, run.Result, run.Error, run.LastSeq, run.IdempotencyKey = keel.RunQueued, "", "", 0, ""
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
	specs := toolsFor(run, e.cfg.Tools.Specs(ctx))
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
