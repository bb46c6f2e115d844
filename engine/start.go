package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

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
		fresh.started, fresh.specs = true, e.toolsFor(ctx, *run, e.cfg.Tools.Specs(ctx))
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

// checkWorkspace checks a run's workspace: empty (none), or an absolute
// path of a directory that exists. It returns it cleaned; an error
// wraps keel.ErrInvalid.
func checkWorkspace(ws string) (string, error) {
	if ws == "" {
		return "", nil
	}
	if !filepath.IsAbs(ws) {
		return "", fmt.Errorf("workspace %q is not an absolute path: %w", ws, keel.ErrInvalid)
	}
	ws = filepath.Clean(ws)
	fi, err := os.Stat(ws)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("workspace %s does not exist: %w", ws, keel.ErrInvalid)
	case err != nil:
		return "", fmt.Errorf("workspace %s: %w: %w", ws, keel.ErrInvalid, err)
	case !fi.IsDir():
		return "", fmt.Errorf("workspace %s is not a directory: %w", ws, keel.ErrInvalid)
	}
	return ws, nil
}
