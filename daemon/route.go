package daemon

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud/edge"
)

// placerSlot is the engine's Placer in a daemon that joins a cloud
// (--join): the edge's (edge.Placer), once it has joined. The engine is
// built before the edge, which starts runs of it; until the edge is
// there, a step that needs another environment finds none.
type placerSlot struct {
	p atomic.Pointer[edge.Placer]
}

func (s *placerSlot) get() (*edge.Placer, error) {
	p := s.p.Load()
	if p == nil {
		return nil, fmt.Errorf("not joined to the cloud yet: %w", keel.ErrUnavailable)
	}
	return p, nil
}

func (s *placerSlot) Place(ctx context.Context, need keel.StepNeed) (keel.Placement, error) {
	p, err := s.get()
	if err != nil {
		return keel.Placement{}, err
	}
	return p.Place(ctx, need)
}

func (s *placerSlot) HandOff(ctx context.Context, env string, h keel.HandOff) (keel.RunID, error) {
	p, err := s.get()
	if err != nil {
		return "", err
	}
	return p.HandOff(ctx, env, h)
}

func (s *placerSlot) Await(ctx context.Context, env string, run keel.RunID, parentSpan string) (keel.StepOutcome, error) {
	p, err := s.get()
	if err != nil {
		return keel.StepOutcome{}, err
	}
	return p.Await(ctx, env, run, parentSpan)
}

func (s *placerSlot) Cancel(ctx context.Context, env string, key, run keel.RunID) (keel.RunStatus, error) {
	p, err := s.get()
	if err != nil {
		return "", err
	}
	return p.Cancel(ctx, env, key, run)
}
