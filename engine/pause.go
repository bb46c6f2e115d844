package engine

import (
	"context"
	"fmt"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
)

// Pause asks a running run to stop at its next step boundary (before its
// next model call or tool call; a call in flight finishes and is
// journaled). The run then becomes paused, and stays so across restarts
// until Unpause or Cancel. It returns the run as it is now.
func (e *Engine) Pause(ctx context.Context, id keel.RunID) (keel.Run, error) {
	e.mu.Lock()
	_, active := e.active[id]
	if active {
		e.pausing[id] = true
	}
	e.mu.Unlock()
	r, err := e.cfg.Store.GetRun(ctx, id)
	if err != nil {
		return keel.Run{}, err
	}
	if !active {
		return r, fmt.Errorf("run %s is %s; only a running run can be paused: %w", id, r.Status, keel.ErrConflict)
	}
	return r, nil
}

// Unpause lets a paused run go on from its journal.
func (e *Engine) Unpause(ctx context.Context, id keel.RunID) (keel.Run, error) {
	r, err := e.cfg.Store.GetRun(ctx, id)
	if err != nil {
		return keel.Run{}, err
	}
	if r.Status != keel.RunPaused {
		return r, fmt.Errorf("run %s is %s, not paused: %w", id, r.Status, keel.ErrConflict)
	}
	if over, err := e.takenOver(ctx, id); err != nil {
		return r, err
	} else if over {
		return r, fmt.Errorf("run %s is taken over by a person; hand it back to let it go on: %w", id, keel.ErrConflict)
	}
	if err := e.launch(r); err != nil {
		return r, err
	}
	return e.cfg.Store.GetRun(ctx, id)
}

// paused journals the pause if one was asked for the run and reports
// whether the loop must stop here.
func (e *Engine) paused(ctx context.Context, id keel.RunID) bool {
	e.mu.Lock()
	asked := e.pausing[id]
	delete(e.pausing, id)
	e.mu.Unlock()
	if !asked {
		return false
	}
	why := "paused by a client; resume it to go on"
	if over, _ := e.takenOver(ctx, id); over {
		why = "taken over by a person; it goes on when they hand it back"
	}
	if _, err := e.appendEvent(ctx, id, keel.EventRunPaused, keel.RunEndData{Status: keel.RunPaused, Reason: why},
		&keel.RunUpdate{Status: keel.RunPaused, Error: why}); err != nil {
		e.log.Error("journal pause", logkey.Run, id, logkey.Err, err)
	}
	return true
}
