package engine

import (
	"context"
	"fmt"

	"github.com/keel-runtime/keel"
)

// Adopt takes over one run that another engine over the same journal
// left in flight (a cloud worker that stopped or died; see docs/cloud.md),
// doing for that run what Recover and Resume do for every run at a
// daemon's start: it closes the spans the other engine left open, marks
// the run interrupted if it was queued or running, and launches its loop
// from the journal, under the same exactly-once rules as after a crash
// (a call journaled without its result runs again only if its tool is
// read-only or idempotent; otherwise the run waits for a person).
//
// A run that waits for a person is launched only when its wait is
// answered; a paused or ended run is not launched. Adopt returns the
// run as it then is. The caller makes sure the other engine is gone
// (cloud workers hold a lease); should it still be appending, the
// journal lets one of them through and the other's next append fails
// with keel.ErrConflict. Errors wrap keel.ErrNotFound, keel.ErrConflict
// (the run already runs in this engine) or keel.ErrUnavailable (closed).
func (e *Engine) Adopt(ctx context.Context, id keel.RunID) (keel.Run, error) {
	e.mu.Lock()
	busy := e.active[id] != nil
	e.mu.Unlock()
	if busy {
		return keel.Run{}, fmt.Errorf("run %s is already running: %w", id, keel.ErrConflict)
	}
	r, err := e.cfg.Store.GetRun(ctx, id)
	if err != nil {
		return keel.Run{}, err
	}
	e.closeSpans(ctx, id)
	switch r.Status {
	case keel.RunQueued, keel.RunRunning:
		const reason = "the worker running it stopped"
		if _, err := e.appendEvent(ctx, id, keel.EventRunInterrupted, keel.RunEndData{Status: keel.RunInterrupted, Reason: reason},
			&keel.RunUpdate{Status: keel.RunInterrupted, Error: reason}); err != nil {
			return r, fmt.Errorf("adopt %s: %w", id, err)
		}
		if r, err = e.cfg.Store.GetRun(ctx, id); err != nil {
			return r, err
		}
	case keel.RunInterrupted:
	case keel.RunWaiting:
		if r.KindOrAgent() == keel.KindAgent {
			j, err := e.restore(ctx, r)
			if err != nil {
				return r, fmt.Errorf("adopt %s: %w", id, err)
			}
			if !j.answered() {
				return r, nil
			}
		}
	default:
		return r, nil
	}
	if err := e.launch(r); err != nil {
		return r, fmt.Errorf("adopt %s: %w", id, err)
	}
	return r, nil
}
