package jsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/nats-io/nats.go/jetstream"
)

// lazyDelay is how long a span write may wait in memory for a journal
// append to carry it to the spans stream before it goes alone.
const lazyDelay = 50 * time.Millisecond

// Span writes are buffered and published in batches, one message per run
// (subject NS.spans.RUN, a JSON array of span versions; the last version
// of an ID wins): with the next journal append of the Store, with Sync,
// or lazyDelay after the first one buffered. A batch that holds a span
// that is the only record of something (recordsAlone) is stored before
// the journal append it goes with; any other goes beside it, unwaited.

// StartSpan records a running span; starting a span the run already has
// replaces it. It buffers the write (see above) and returns at once.
func (s *Store) StartSpan(ctx context.Context, sp keel.Span) error {
	sp = keel.Span{ID: sp.ID, RunID: sp.RunID, ParentID: sp.ParentID, Kind: sp.Kind, Name: sp.Name, Step: sp.Step, Start: sp.Start.UTC(),
		Status: keel.SpanRunning, Attrs: sp.Attrs}
	s.bufferSpan(sp)
	return nil
}

// FinishSpan records a span's outcome (sp whole, as the engine keeps
// it). It buffers the write, like StartSpan.
func (s *Store) FinishSpan(ctx context.Context, sp keel.Span) error {
	sp.Start = sp.Start.UTC()
	s.bufferSpan(sp)
	return nil
}

// recordsAlone reports whether a finished span is the only record of
// something the journal does not hold (as the SQLite store decides):
// what a failed model call spent, a person's answer ending a wait.
func recordsAlone(sp keel.Span) bool {
	return sp.Status != keel.SpanRunning && (sp.Kind == keel.SpanHuman || (sp.Kind == keel.SpanModelCall && sp.Status == keel.SpanError))
}

func (s *Store) bufferSpan(sp keel.Span) {
	s.spanMu.Lock()
	defer s.spanMu.Unlock()
	if len(s.buffered) == 0 && s.lazy == nil && !s.closed {
		s.lazy = time.AfterFunc(lazyDelay, func() {
			s.spanMu.Lock()
			s.lazy = nil
			s.spanMu.Unlock()
			if err := s.publishSpans(false); err != nil && s.onLazyError != nil {
				s.onLazyError(err)
			}
		})
	}
	s.buffered = append(s.buffered, sp)
	s.alone = s.alone || recordsAlone(sp)
}

// publishSpans publishes the buffered span writes, one message per run,
// without waiting for their acks (Sync does); with mustStore, it waits
// for them if a span among them records something alone.
func (s *Store) publishSpans(mustStore bool) error {
	s.spanMu.Lock()
	buf, alone := s.buffered, s.alone
	s.buffered, s.alone = nil, false
	if len(buf) == 0 {
		s.spanMu.Unlock()
		return nil
	}
	byRun := map[keel.RunID][]keel.Span{}
	var order []keel.RunID
	for _, sp := range buf {
		if byRun[sp.RunID] == nil {
			order = append(order, sp.RunID)
		}
		byRun[sp.RunID] = append(byRun[sp.RunID], sp)
	}
	type write struct {
		subj string
		data []byte
		w    *spanWrite
	}
	var errs []error
	var mine []write
	for _, id := range order {
		data, err := json.Marshal(byRun[id])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		subj := s.ns + ".spans." + token(string(id))
		f, err := s.js.PublishAsync(subj, data)
		if err != nil {
			if mustStore && alone {
				mine = append(mine, write{subj, data, nil})
				continue
			}
			errs = append(errs, fmt.Errorf("spans of %s: %w", id, err))
			continue
		}
		w := s.track(f)
		s.pending = append(s.pending, w)
		mine = append(mine, write{subj, data, w})
	}
	s.spanMu.Unlock()
	if mustStore && alone {
		// Sent again until stored: a span write is idempotent (the last
		// version of a span wins), so a copy of one that was stored
		// does no harm.
		for _, m := range mine {
			if m.w != nil {
				if <-m.w.done; m.w.err == nil {
					continue
				}
			}
			if err := retry(context.Background(), func(ctx context.Context) error {
				_, err := s.js.Publish(ctx, m.subj, m.data)
				return err
			}); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", m.subj, err))
			} else if m.w != nil {
				s.spanMu.Lock() // stored after all: not an error for Sync
				s.pending = slices.DeleteFunc(s.pending, func(w *spanWrite) bool { return w == m.w })
				s.spanMu.Unlock()
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("write spans: %w", err)
	}
	return nil
}

// Sync returns once every span started or finished so far is stored (on
// a quorum of replicas), or with the first error of one that was not.
func (s *Store) Sync(ctx context.Context) error {
	perr := s.publishSpans(false)
	s.spanMu.Lock()
	pending := s.pending
	s.pending = nil
	s.spanMu.Unlock()
	errs := []error{perr}
	for i, w := range pending {
		select {
		case <-w.done:
			if w.err != nil {
				errs = append(errs, w.err)
			}
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

// settle drops the acknowledged futures from pending, so that a Store
// that never calls Sync does not keep them all.
func (s *Store) settle() {
	s.spanMu.Lock()
	defer s.spanMu.Unlock()
	s.pending = slices.DeleteFunc(s.pending, func(w *spanWrite) bool {
		select {
		case <-w.done:
			return w.err == nil // an error stays for Sync to return
		default:
			return false
		}
	})
}

// spanWrite is a published span batch: done is closed once the stream
// acknowledged it (err nil) or refused it, so that any number of callers
// can wait for it (a future's channels deliver their value once).
type spanWrite struct {
	done chan struct{}
	err  error
}

// track waits for f in a goroutine of its own, which ends with the
// acknowledgement, the refusal, Close, or after spanAckWait: an
// acknowledgement lost while a stream's leader changed never comes (the
// client resolves a future only on a reconnect of its own), and Sync,
// a span read and an append that waits for a span would wait for it for
// ever. (They did: a worker adopting a dead worker's run read the run's
// spans, and waited for a span write of another run it published as the
// journal's leader node shut down; it held the run's lease all the while,
// so no other worker adopted the run: TestKillWorkerAndNode, now and
// then.)
func (s *Store) track(f jetstream.PubAckFuture) *spanWrite {
	w := &spanWrite{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTimer(spanAckWait)
		defer t.Stop()
		select {
		case <-f.Ok():
		case w.err = <-f.Err():
		case <-s.quit:
			w.err = errClosed
		case <-t.C:
			w.err = errNoAck
		}
	}()
	return w
}

// spanAckWait bounds the wait for a span write's acknowledgement (as the
// journal's appends wait for theirs, per attempt).
const spanAckWait = 5 * time.Second

var (
	errClosed = errors.New("jsstore: closed")
	errNoAck  = errors.New("jsstore: a span write was not acknowledged in time: it may be stored or not")
)

// readSpans returns the last version of every span of the runs on
// subject filter. A read that finds no responder (the spans stream's
// leader changing, or not yet known to the node asked) is made again
// from the start.
func (s *Store) readSpans(ctx context.Context, filter string) ([]keel.Span, error) {
	if err := s.Sync(ctx); err != nil {
		return nil, err
	}
	var out []keel.Span
	err := retry(ctx, func(ctx context.Context) (err error) {
		out, err = s.readSpansOnce(ctx, filter)
		return err
	})
	return out, err
}

func (s *Store) readSpansOnce(ctx context.Context, filter string) ([]keel.Span, error) {
	c, err := s.spans.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return nil, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, err
	}
	n := int(info.NumPending)
	byID := map[string]int{}
	var out []keel.Span
	for read := 0; read < n; {
		batch, err := c.Fetch(min(n-read, 512))
		if err != nil {
			return nil, err
		}
		for m := range batch.Messages() {
			read++
			var sps []keel.Span
			if err := json.Unmarshal(m.Data(), &sps); err != nil {
				return nil, fmt.Errorf("spans %s: %w", m.Subject(), err)
			}
			for _, sp := range sps {
				k := string(sp.RunID) + "\x00" + sp.ID
				if i, ok := byID[k]; ok {
					out[i] = sp
					continue
				}
				byID[k] = len(out)
				out = append(out, sp)
			}
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Spans returns the run's spans in start order, every span started or
// finished before the call included.
func (s *Store) Spans(ctx context.Context, id keel.RunID) ([]keel.Span, error) {
	out, err := s.readSpans(ctx, s.ns+".spans."+token(string(id)))
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
	all, err := s.readSpans(ctx, s.ns+".spans.*")
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
