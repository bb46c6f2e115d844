package jsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/keel-runtime/keel"
	"github.com/nats-io/nats.go/jetstream"
)

// StartSpan records a running span; starting a span the run already has
// replaces it. It publishes without waiting: Sync, and every journal
// append, waits for it.
func (s *Store) StartSpan(ctx context.Context, sp keel.Span) error {
	sp = keel.Span{ID: sp.ID, RunID: sp.RunID, ParentID: sp.ParentID, Kind: sp.Kind, Name: sp.Name, Step: sp.Step, Start: sp.Start.UTC(),
		Status: keel.SpanRunning, Attrs: sp.Attrs}
	return s.putSpan(sp)
}

// FinishSpan records a span's outcome (sp whole, as the engine keeps
// it), without waiting, like StartSpan.
func (s *Store) FinishSpan(ctx context.Context, sp keel.Span) error {
	sp.Start = sp.Start.UTC()
	return s.putSpan(sp)
}

func (s *Store) putSpan(sp keel.Span) error {
	data, err := json.Marshal(sp)
	if err != nil {
		return fmt.Errorf("span %s: %w", sp.ID, err)
	}
	s.spanMu.Lock()
	defer s.spanMu.Unlock()
	f, err := s.js.PublishAsync(s.ns+".spans."+token(string(sp.RunID))+"."+token(sp.ID), data)
	if err != nil {
		return fmt.Errorf("span %s: %w", sp.ID, err)
	}
	s.pending = append(s.pending, f)
	return nil
}

// Sync returns once every span started or finished so far is stored (on
// a quorum of replicas), or with the first error of one that was not.
func (s *Store) Sync(ctx context.Context) error {
	s.spanMu.Lock()
	pending := s.pending
	s.pending = nil
	s.spanMu.Unlock()
	var errs []error
	for i, f := range pending {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs = append(errs, err)
		case <-ctx.Done():
			s.spanMu.Lock()
			s.pending = append(pending[i:], s.pending...)
			s.spanMu.Unlock()
			return fmt.Errorf("sync spans: %w", ctx.Err())
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sync spans: %w", err)
	}
	return nil
}

// readSpans returns the last version of every span on subject filter.
func (s *Store) readSpans(ctx context.Context, filter string) ([]keel.Span, error) {
	if err := s.Sync(ctx); err != nil {
		return nil, err
	}
	c, err := s.spans.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return nil, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, err
	}
	n := int(info.NumPending)
	out := make([]keel.Span, 0, n)
	for len(out) < n {
		batch, err := c.FetchNoWait(min(n-len(out), 512))
		if err != nil {
			return nil, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			var sp keel.Span
			if err := json.Unmarshal(m.Data(), &sp); err != nil {
				return nil, fmt.Errorf("span %s: %w", m.Subject(), err)
			}
			out = append(out, sp)
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
		if got == 0 {
			// FetchNoWait found none yet: wait for the next ones.
			batch, err := c.Fetch(min(n-len(out), 512))
			if err != nil {
				return nil, err
			}
			for m := range batch.Messages() {
				var sp keel.Span
				if err := json.Unmarshal(m.Data(), &sp); err != nil {
					return nil, fmt.Errorf("span %s: %w", m.Subject(), err)
				}
				out = append(out, sp)
			}
			if err := batch.Error(); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// Spans returns the run's spans in start order, every span started or
// finished before the call included.
func (s *Store) Spans(ctx context.Context, id keel.RunID) ([]keel.Span, error) {
	out, err := s.readSpans(ctx, s.ns+".spans."+token(string(id))+".*")
	if err != nil {
		return nil, fmt.Errorf("spans of %s: %w", id, err)
	}
	slices.SortFunc(out, func(a, b keel.Span) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// RunsWithOpenSpans returns the runs with a span still running, in ID
// order. It reads every run's spans: Recover calls it once at start.
func (s *Store) RunsWithOpenSpans(ctx context.Context) ([]keel.RunID, error) {
	all, err := s.readSpans(ctx, s.ns+".spans.>")
	if err != nil {
		return nil, fmt.Errorf("runs with open spans: %w", err)
	}
	var out []keel.RunID
	for _, sp := range all {
		if sp.Status == keel.SpanRunning && !slices.Contains(out, sp.RunID) {
			out = append(out, sp.RunID)
		}
	}
	slices.Sort(out)
	return out, nil
}
