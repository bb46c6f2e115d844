package engine

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/keel-runtime/keel"
)

// Storing a new run, with its first events when they are known at once.

// create stores a new run. A DAG run is stored with its start and its
// plan (revision 0) in the same transaction, so that no crash can leave
// it without the plan it must resume from; an agent run with its start,
// when its tools are known without waiting (see Loading), which saves
// the run a commit. *run is then as stored, and the run's loop is told
// what was journaled.
func (e *Engine) create(ctx context.Context, run *keel.Run, plan *keel.Plan) (*created, error) {
	var evs []keel.Event
	fresh := &created{}
	switch {
	case plan != nil:
		for _, ev := range []struct {
			typ  keel.EventType
			data any
		}{
			{keel.EventRunStarted, keel.RunStartedData{Goal: run.Goal, Model: run.Model, Tools: planTools(*plan), MaxSteps: run.MaxSteps}},
			{keel.EventPlanProposed, keel.PlanData{Plan: *plan}},
		} {
			raw, err := json.Marshal(ev.data)
			if err != nil {
				return nil, fmt.Errorf("encode %s: %w", ev.typ, err)
			}
			evs = append(evs, keel.Event{Type: ev.typ, Time: e.cfg.Now(), Data: raw})
		}
	case run.KindOrAgent() == keel.KindAgent && !e.toolsLoading():
		fresh.started, fresh.specs = true, toolsFor(*run, e.cfg.Tools.Specs(ctx))
		raw, err := json.Marshal(startedData(*run, fresh.specs))
		if err != nil {
			return nil, fmt.Errorf("encode %s: %w", keel.EventRunStarted, err)
		}
		evs = append(evs, keel.Event{Type: keel.EventRunStarted, Time: e.cfg.Now(), Data: raw})
	default:
		return fresh, e.cfg.Store.CreateRun(ctx, *run)
	}
	e.mu.Lock()
	o := e.ordered(run.ID)
	e.mu.Unlock()
	stored, err := e.cfg.Store.CreateRunWith(ctx, *run, evs, &keel.RunUpdate{Status: keel.RunRunning})
	e.publishInOrder(run.ID, o, stored)
	if err != nil {
		return nil, err
	}
	last := stored[len(stored)-1]
	run.Status, run.LastSeq, run.UpdatedAt = keel.RunRunning, last.Seq, last.Time
	return fresh, nil
}

// toolsLoading reports whether the engine's Tools.Specs would wait.
func (e *Engine) toolsLoading() bool {
	l, ok := e.cfg.Tools.(Loading)
	return ok && l.Loading()
}
