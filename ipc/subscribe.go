package ipc

import (
	"context"
	"fmt"
	"sync"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// subscription is one run.subscribe on one connection.
//
// Exactly-once delivery of persisted events works like this: the
// subscription is registered (replaying, so live events are buffered)
// before the stored events are read; the handler then queues the
// response, the stored events after after_seq, and the buffered events,
// skipping every Seq it has already queued; only then does it switch
// the subscription to forwarding live events directly, still skipping
// any Seq not above the last one queued. An event stored before the
// read is in the read; one stored after it reaches the buffer, because
// the Backend calls fn after storing. Either way it is queued once, and
// in Seq order because the Backend calls fn in Seq order.
type subscription struct {
	runID keel.RunID

	mu        sync.Mutex
	replaying bool
	buf       []keel.Event // live events that arrived while replaying
	sent      int64        // highest persisted Seq queued
	closed    bool
}

// onEvent is the connection's Backend callback. It never blocks: it
// buffers or queues the event without waiting, and drops the client
// when its queue is full.
func (c *conn) onEvent(ev keel.Event) {
	c.subsMu.Lock()
	sub := c.subs[ev.RunID]
	c.subsMu.Unlock()
	if sub == nil {
		return
	}
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.closed {
		return
	}
	if sub.replaying {
		// A delta is folded into the buffered delta of its step right
		// away: nothing is sent before the replay ends, so the client
		// receives the same text, and a fast model streaming through a
		// slow replay cannot fill the buffer with deltas and get the
		// client dropped when the step's next persisted event comes.
		if last := len(sub.buf) - 1; last >= 0 && ev.Type == keel.EventModelDelta && sub.buf[last].Type == keel.EventModelDelta {
			items := []outMsg{{ev: sub.buf[last], isEv: true}}
			if mergeDelta(items, ev) {
				sub.buf[last] = items[0].ev
				return
			}
		}
		if len(sub.buf) >= c.s.cfg.QueueSize {
			c.end(websocket.StatusPolicyViolation, reasonTooSlow)
			return
		}
		sub.buf = append(sub.buf, ev)
		return
	}
	if ev.Seq > 0 {
		if ev.Seq <= sub.sent {
			return
		}
		sub.sent = ev.Seq
	}
	if !c.q.tryPushLive(outMsg{ev: ev, isEv: true}) {
		c.end(websocket.StatusPolicyViolation, reasonTooSlow)
	}
}

// subscribe registers a subscription and reads what it must replay. The
// replay runs as the followUp, after the response is queued.
func (c *conn) subscribe(ctx context.Context, p protocol.SubscribeParams) (any, error) {
	sub := &subscription{runID: p.RunID, replaying: true, sent: p.AfterSeq}
	c.subsMu.Lock()
	if _, dup := c.subs[p.RunID]; dup {
		c.subsMu.Unlock()
		return nil, &protocol.Error{
			Code:    protocol.CodeConflict,
			Message: fmt.Sprintf("already subscribed to run %q on this connection; unsubscribe first", p.RunID),
		}
	}
	c.subs[p.RunID] = sub
	c.subsMu.Unlock()

	run, err := c.s.svc.History.GetRun(ctx, p.RunID)
	if err != nil {
		c.removeSub(sub)
		return nil, err
	}
	stored, err := c.s.svc.History.Events(ctx, p.RunID, p.AfterSeq)
	if err != nil {
		c.removeSub(sub)
		return nil, err
	}
	return followUp{
		result: protocol.SubscribeResult{RunID: run.ID, Status: run.Status},
		then:   func() { c.replay(sub, stored) },
	}, nil
}

// replay queues the stored events, then the buffered ones, then lets
// live events through.
func (c *conn) replay(sub *subscription, stored []keel.Event) {
	sub.mu.Lock()
	sent := sub.sent
	sub.mu.Unlock()
	queue := func(events []keel.Event) bool {
		for _, ev := range events {
			if ev.Seq > 0 {
				if ev.Seq <= sent {
					continue
				}
				sent = ev.Seq
			}
			if c.q.push(c.ctx, outMsg{ev: ev, isEv: true}) != nil {
				return false
			}
		}
		return true
	}
	if !queue(stored) {
		return
	}
	for {
		sub.mu.Lock()
		if sub.closed {
			sub.mu.Unlock()
			return
		}
		buf := sub.buf
		sub.buf = nil
		if len(buf) == 0 {
			sub.replaying = false
			sub.sent = sent
			sub.mu.Unlock()
			return
		}
		sub.mu.Unlock()
		if !queue(buf) {
			return
		}
	}
}

// unsubscribe ends the subscription to id, if there is one. Events
// already queued are still sent.
func (c *conn) unsubscribe(id keel.RunID) {
	c.subsMu.Lock()
	sub := c.subs[id]
	delete(c.subs, id)
	c.subsMu.Unlock()
	if sub != nil {
		sub.close()
	}
}

// removeSub removes sub if it is still the subscription to its run.
func (c *conn) removeSub(sub *subscription) {
	c.subsMu.Lock()
	if c.subs[sub.runID] == sub {
		delete(c.subs, sub.runID)
	}
	c.subsMu.Unlock()
	sub.close()
}

// closeSubs ends every subscription of the connection.
func (c *conn) closeSubs() {
	c.subsMu.Lock()
	subs := c.subs
	c.subs = make(map[keel.RunID]*subscription)
	c.subsMu.Unlock()
	for _, sub := range subs {
		sub.close()
	}
}

func (sub *subscription) close() {
	sub.mu.Lock()
	sub.closed = true
	sub.buf = nil
	sub.mu.Unlock()
}
