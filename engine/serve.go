package engine

import (
	"context"

	"github.com/keel-runtime/keel"
)

// The methods below give the engine the shape of the protocol's run
// services (ipc.Runs, ipc.RunControl, ipc.RunSteering) where its own
// methods differ, so the daemon hands the engine to the server as is.

// ForkRun is Fork for a request as the protocol sends it.
func (e *Engine) ForkRun(ctx context.Context, req keel.ForkRequest) (keel.Run, error) {
	return e.Fork(ctx, ForkRequest{From: req.RunID, Step: req.Step, Model: req.Model, Goal: req.Goal,
		Message: req.Message, MaxSteps: req.MaxSteps, IdempotencyKey: req.IdempotencyKey})
}

// CheckReplay replays the finished run id (see Replay) and compares the
// replay with its journal (see SameEvents).
func (e *Engine) CheckReplay(ctx context.Context, id keel.RunID) (keel.ReplayCheck, error) {
	replay, err := e.Replay(ctx, id)
	if err != nil {
		return keel.ReplayCheck{}, err
	}
	journal, err := e.cfg.Store.Events(ctx, id, 0)
	if err != nil {
		return keel.ReplayCheck{}, err
	}
	diff := SameEvents(journal, replay)
	return keel.ReplayCheck{Events: replay, Matches: diff == "", Difference: diff}, nil
}
