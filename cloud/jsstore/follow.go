package jsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

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
	// From the stream's next sequence, named: an ordered consumer that
	// is reset before it delivered anything (a missed heartbeat, under
	// load) is made again from where it was asked to start, where
	// "deliver new" would skip what was stored in between.
	var info *jetstream.StreamInfo
	if err := retry(ctx, func(ctx context.Context) (err error) {
		info, err = s.journal.Info(ctx)
		return err
	}); err != nil {
		return nil, fmt.Errorf("follow the journal: %w", err)
	}
	c, err := s.journal.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{s.ns + ".journal.>"},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    info.State.LastSeq + 1,
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
	// Created before the following began? And now and then after, in
	// case the following misses it.
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		if r, err := s.RunByIdempotencyKey(ctx, key); err == nil || !errors.Is(err, keel.ErrNotFound) {
			return r, err
		}
		select {
		case id := <-found:
			return s.GetRun(ctx, id)
		case <-t.C:
		case <-ctx.Done():
			return keel.Run{}, fmt.Errorf("run with idempotency key: %w", ctx.Err())
		}
	}
}
