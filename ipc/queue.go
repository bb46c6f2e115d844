package ipc

import (
	"context"
	"errors"
	"sync"

	"github.com/keel-runtime/keel"
)

// outMsg is one frame waiting to be written: either bytes ready to send
// or an event, encoded by the writer so that the Backend's callback does
// not pay for it.
type outMsg struct {
	data []byte
	ev   keel.Event
	isEv bool
	live bool // pushed by tryPushLive
}

var errQueueClosed = errors.New("queue closed")

// outQueue is a connection's outbound FIFO. One FIFO keeps every frame
// in the order it was queued, which is what makes "the response to
// run.subscribe comes before its first event" and "replayed events come
// before live ones" hold. Two bounds share it:
//
//   - responses and replayed events (reliable items) are pushed with
//     backpressure: push waits while limit of them are queued;
//   - live events never wait: tryPushLive fails when limit live events
//     are queued, and the caller drops the client; a model.delta is
//     folded into its run's queued delta instead (mergeDelta).
//
// Keeping the bounds apart means a large replay cannot make a live event
// look like an overflow.
type outQueue struct {
	limit int

	mu       sync.Mutex
	items    []outMsg
	live     int
	reliable int
	closed   bool
	ready    chan struct{} // capacity 1: wakes the writer
	space    chan struct{} // closed when a reliable slot frees up
}

func newOutQueue(limit int) *outQueue {
	return &outQueue{
		limit: limit,
		ready: make(chan struct{}, 1),
		space: make(chan struct{}),
	}
}

// push appends m, waiting while the reliable bound is reached. It fails
// when ctx is done or the queue is closed.
func (q *outQueue) push(ctx context.Context, m outMsg) error {
	for {
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return errQueueClosed
		}
		if q.reliable < q.limit {
			q.items = append(q.items, m)
			q.reliable++
			q.mu.Unlock()
			q.wake()
			return nil
		}
		space := q.space
		q.mu.Unlock()
		select {
		case <-space:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// tryPushLive appends a live event without waiting. It reports false if
// limit live events are already queued. On a closed queue it drops m and
// reports true: there is no client left to be too slow.
func (q *outQueue) tryPushLive(m outMsg) bool {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return true
	}
	if q.live >= q.limit && m.isEv && mergeDelta(q.items, m.ev) {
		q.mu.Unlock()
		return true
	}
	if q.live >= q.limit {
		q.items, q.live = compactDeltas(q.items, q.live)
	}
	if q.live >= q.limit {
		q.mu.Unlock()
		return false
	}
	m.live = true
	q.items = append(q.items, m)
	q.live++
	q.mu.Unlock()
	q.wake()
	return true
}

func (q *outQueue) wake() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop removes the oldest item, waiting for one. It fails when ctx is
// done or the queue is closed.
func (q *outQueue) pop(ctx context.Context) (outMsg, error) {
	for {
		if err := ctx.Err(); err != nil {
			return outMsg{}, err
		}
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return outMsg{}, errQueueClosed
		}
		if len(q.items) > 0 {
			m := q.items[0]
			q.items[0] = outMsg{}
			q.items = q.items[1:]
			if m.live {
				q.live--
			} else {
				if q.reliable == q.limit {
					close(q.space)
					q.space = make(chan struct{})
				}
				q.reliable--
			}
			q.mu.Unlock()
			return m, nil
		}
		q.mu.Unlock()
		select {
		case <-q.ready:
		case <-ctx.Done():
		}
	}
}

// close discards the queued items and wakes every waiter.
func (q *outQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.closed = true
	q.items = nil
	close(q.space)
	q.wake()
}
