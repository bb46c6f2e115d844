package jsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/keel-runtime/keel"
	"github.com/nats-io/nats.go/jetstream"
)

// Follow calls fn with every event the namespace's journal stores from
// now on, as stored (an append the stream refused is never seen), in the
// journal's order, so one run's events in Seq order, and created, if
// created is not nil, with each run the journal stores from now on (its
// first message). Both are called from one goroutine, never
// concurrently, and must not block. stop ends the following: neither is
// called after it returns. It is what a front of the fleet (the
// WebSocket endpoint) follows runs with, wherever their workers run.
func (s *Store) Follow(ctx context.Context, fn func(keel.Event), created func(keel.Run)) (stop func(), err error) {
	c, err := s.journal.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{s.ns + ".journal.>"},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("follow the journal: %w", err)
	}
	var mu sync.Mutex
	stopped := false
	cc, err := c.Consume(func(m jetstream.Msg) {
		var b batch
		if json.Unmarshal(m.Data(), &b) != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if b.Run != nil && created != nil {
			created(*b.Run)
		}
		for _, ev := range b.Events {
			fn(ev)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("follow the journal: %w", err)
	}
	return func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		cc.Stop()
	}, nil
}

// AwaitRun returns the run created with idempotency key key, waiting
// until a worker creates it (the key's work item was queued) or ctx is
// done.
func (s *Store) AwaitRun(ctx context.Context, key string) (keel.Run, error) {
	found := make(chan keel.RunID, 1)
	stop, err := s.Follow(ctx, func(keel.Event) {}, func(r keel.Run) {
		if r.IdempotencyKey == key {
			select {
			case found <- r.ID:
			default:
			}
		}
	})
	if err != nil {
		return keel.Run{}, err
	}
	defer stop()
	// Created before the following began?
	if r, err := s.RunByIdempotencyKey(ctx, key); err == nil || !errors.Is(err, keel.ErrNotFound) {
		return r, err
	}
	select {
	case id := <-found:
		return s.GetRun(ctx, id)
	case <-ctx.Done():
		return keel.Run{}, fmt.Errorf("run with idempotency key: %w", ctx.Err())
	}
}
