package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
)

// Journaling a run's events and publishing them to subscribers, in Seq
// order, once they are stored.

// Subscribe calls fn for every event of every run: journaled events after
// they are stored, each once and, within a run, in Seq order whatever
// goroutines appended them (see pubOrder); and live-only model.delta
// events (Seq 0). fn is called from run goroutines, never with a lock of
// the engine held, and must not block. The returned func unregisters.
func (e *Engine) Subscribe(fn func(keel.Event)) (cancel func()) {
	e.mu.Lock()
	id := e.nextSub
	e.nextSub++
	e.subs[id] = fn
	e.mu.Unlock()
	return func() {
		e.mu.Lock()
		delete(e.subs, id)
		e.mu.Unlock()
	}
}

// publish calls the subscribers with live-only events (model.delta).
// Journaled events go through publishInOrder.
func (e *Engine) publish(evs ...keel.Event) {
	e.mu.Lock()
	fns := e.subscribers()
	e.mu.Unlock()
	for _, ev := range evs {
		for _, fn := range fns {
			fn(ev)
		}
	}
}

// subscribers returns the subscribers' callbacks. e.mu is held.
func (e *Engine) subscribers() []func(keel.Event) {
	fns := make([]func(keel.Event), 0, len(e.subs))
	for _, fn := range e.subs {
		fns = append(fns, fn)
	}
	return fns
}

// appendEvent journals an event and then publishes it. Journal writes use
// a context detached from the run's cancellation so a cancel or shutdown
// still records its own ending. An event that changes the labels the
// run's context holds is journaled under the run's label lock and
// applied to its live labels (see labelTracker), in journal order; the
// lock is released before subscribers see the event.
func (e *Engine) appendEvent(ctx context.Context, id keel.RunID, typ keel.EventType, data any, upd *keel.RunUpdate) (keel.Event, error) {
	d, labelled := eventLabels(typ, data)
	if !labelled {
		return e.appendThen(ctx, id, typ, data, upd, nil)
	}
	l, unlock := e.lockLabels(id)
	return e.appendThen(ctx, id, typ, data, upd, func(err error) {
		if err == nil && l != nil {
			l.ctx = d.apply(l.ctx)
		}
		unlock()
	})
}

// appendThen is appendEvent without the labels: stored, when not nil, is
// called once the store has the event (or failed to: its error), before
// subscribers see it. A caller that holds the run's label lock releases
// it there.
func (e *Engine) appendThen(ctx context.Context, id keel.RunID, typ keel.EventType, data any, upd *keel.RunUpdate, stored func(error)) (keel.Event, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		if stored != nil {
			stored(err)
		}
		return keel.Event{}, fmt.Errorf("encode %s: %w", typ, err)
	}
	e.endTrace(ctx, id, upd)
	e.mu.Lock()
	evs := append(e.held[id], keel.Event{Type: typ, Time: e.cfg.Now(), Data: raw})
	delete(e.held, id)
	o := e.ordered(id)
	e.mu.Unlock()
	evs, err = e.cfg.Store.AppendAll(context.WithoutCancel(ctx), id, evs, upd)
	if stored != nil {
		stored(err)
	}
	e.publishInOrder(id, o, evs)
	if err != nil {
		return keel.Event{}, err
	}
	if upd != nil && upd.Status.Terminal() {
		e.mu.Lock()
		e.dropPolicy(id) // the run's workspace is no longer in use by it
		e.mu.Unlock()
	}
	return evs[len(evs)-1], nil
}

// pubOrder makes a run's journaled events reach subscribers in Seq
// order, exactly once, although several goroutines may append to one
// run at once (the loop, a run.say, two people deciding): the store
// numbers events in commit order, but the appenders would publish them
// in whatever order they get back from the store.
//
// Every append registers (inflight) before it reaches the store and
// leaves its stored events in pending once it gets them back. When no
// append of the run is in flight, every event of the run the store has
// numbered so far is pending or published, and any later one will be
// numbered after them: pending is published then, sorted, by the
// appender that finds it so. One goroutine at a time publishes
// (publishing); one that finds another at it leaves its events to it.
// The appenders never wait for each other, and no lock is held while
// subscribers run.
type pubOrder struct {
	inflight   int
	publishing bool
	pending    []keel.Event
}

// ordered registers an append to run id with its pubOrder. e.mu is held.
func (e *Engine) ordered(id keel.RunID) *pubOrder {
	o := e.order[id]
	if o == nil {
		if e.order == nil {
			e.order = map[keel.RunID]*pubOrder{}
		}
		o = &pubOrder{}
		e.order[id] = o
	}
	o.inflight++
	return o
}

// publishInOrder ends an append registered by ordered, whose stored
// events (none if it failed) are published in Seq order with those of
// the run's other appends (see pubOrder).
func (e *Engine) publishInOrder(id keel.RunID, o *pubOrder, stored []keel.Event) {
	e.mu.Lock()
	o.inflight--
	o.pending = append(o.pending, stored...)
	if o.publishing {
		e.mu.Unlock()
		return
	}
	o.publishing = true
	for o.inflight == 0 && len(o.pending) > 0 {
		evs := o.pending
		o.pending = nil
		fns := e.subscribers()
		e.mu.Unlock()
		slices.SortFunc(evs, func(a, b keel.Event) int { return cmp.Compare(a.Seq, b.Seq) })
		for _, ev := range evs {
			for _, fn := range fns {
				fn(ev)
			}
		}
		e.mu.Lock()
	}
	o.publishing = false
	if o.inflight == 0 && len(o.pending) == 0 {
		delete(e.order, id)
	}
	e.mu.Unlock()
}

// hold keeps an event to be journaled in one transaction with the run's
// next event, whoever appends it, instead of in a transaction (an fsync)
// of its own. The agent loop holds a model result until what acts on it
// journals (a tool call's intent, the run's end, a wait for a person),
// and the intent of a call that is safe to repeat (a read-only or
// idempotent tool) until its result: such a step is one commit. Nothing
// leaves the engine before it is on disk: held events are published
// with the commit, a side effect that may not be repeated journals its
// intent first, and the model is only asked again once the results it
// reads are committed. A crash before the commit loses the whole step:
// the resumed run asks the model again (no recorded result is requested
// again) and may repeat the read-only or idempotent calls, which their
// manifests allow. flushHeld journals what is still held when the loop
// stops.
func (e *Engine) hold(id keel.RunID, typ keel.EventType, data any) error {
	raw, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("encode %s: %w", typ, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.held[id] = append(e.held[id], keel.Event{Type: typ, Time: e.cfg.Now(), Data: raw})
	return nil
}

// flushHeld journals the run's held events, if any.
func (e *Engine) flushHeld(ctx context.Context, id keel.RunID) {
	e.mu.Lock()
	evs := e.held[id]
	delete(e.held, id)
	if len(evs) == 0 {
		e.mu.Unlock()
		return
	}
	o := e.ordered(id)
	e.mu.Unlock()
	stored, err := e.cfg.Store.AppendAll(context.WithoutCancel(ctx), id, evs, nil)
	e.publishInOrder(id, o, stored)
	if err != nil {
		e.log.Error("journal held events", logkey.Run, id, logkey.Err, err)
	}
}
