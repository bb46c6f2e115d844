package ipc

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// runWatch serves runs.subscribe: it tells the connections that asked,
// with a runs.changed notification carrying the run's summary, when a
// run is created or changes state, so that a list of runs stays current
// without polling.
//
// The engine's callback only marks the run as changed (never blocking,
// never reading the store) and wakes one goroutine, which reads each
// marked run once and queues its summary to every watcher. A run marked
// several times before it is read is read once, after the last mark:
// the summary sent is at least as new as every change it reports, so the
// last notification of a run always shows its latest state. The watch
// subscribes to the runs' events only while it has watchers; with
// nothing changing, its goroutine sleeps (no timer).
//
// Which events change a run's state is known from their type (see
// changesState); a run's first event (Seq 1) announces a new run, and
// run.start and run.fork mark the run they created, for a run that is
// stored queued before its first event.
type runWatch struct {
	s *Server

	mu       sync.Mutex
	watchers map[*conn]struct{}
	// stop ends the Runs subscription, held only while there are
	// watchers: with none, the engine does not call back at all.
	stop   func()
	dirty  []keel.RunID // in the order they were marked, each once
	marked map[keel.RunID]bool
	wake   chan struct{} // capacity 1
}

func newRunWatch(s *Server) *runWatch {
	return &runWatch{
		s:        s,
		watchers: make(map[*conn]struct{}),
		marked:   make(map[keel.RunID]bool),
		wake:     make(chan struct{}, 1),
	}
}

// stateEvents are the event types journaled with a change of the run's
// state (a keel.RunUpdate with a Status, in package engine).
var stateEvents = map[keel.EventType]bool{
	keel.EventRunStarted:     true, // running
	keel.EventRunResumed:     true, // running
	keel.EventRunWaiting:     true, // waiting
	keel.EventApprovalAsked:  true, // waiting
	keel.EventRunPaused:      true, // paused
	keel.EventRunInterrupted: true, // interrupted
	keel.EventRunSucceeded:   true,
	keel.EventRunFailed:      true,
	keel.EventRunCancelled:   true,
}

// changesState reports whether ev tells of a new run or a change of
// state.
func changesState(ev keel.Event) bool {
	return ev.Seq == 1 || (ev.Seq > 0 && stateEvents[ev.Type])
}

// onEvent is the Runs callback. It never blocks.
func (w *runWatch) onEvent(ev keel.Event) {
	if changesState(ev) {
		w.mark(ev.RunID)
	}
}

// mark notes that run id changed, if anyone watches, and wakes the
// loop. It never blocks.
func (w *runWatch) mark(id keel.RunID) {
	w.mu.Lock()
	if len(w.watchers) == 0 || w.marked[id] {
		w.mu.Unlock()
		return
	}
	w.marked[id] = true
	w.dirty = append(w.dirty, id)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// add makes c a watcher; adding it again changes nothing. The first
// watcher subscribes to the runs' events (Runs calls back with none of
// its locks held, so w.mu may be held around Subscribe).
func (w *runWatch) add(c *conn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stop == nil {
		w.stop = w.s.svc.Runs.Subscribe(w.onEvent)
	}
	w.watchers[c] = struct{}{}
}

// remove stops c's notifications; summaries already queued to it are
// still sent. The last watcher's removal ends the subscription.
func (w *runWatch) remove(c *conn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.watchers, c)
	if len(w.watchers) == 0 {
		w.dirty, w.marked = nil, make(map[keel.RunID]bool)
		if w.stop != nil {
			w.stop()
			w.stop = nil
		}
	}
}

// loop sends the summaries of marked runs until ctx is done.
func (w *runWatch) loop(ctx context.Context) {
	for {
		select {
		case <-w.wake:
		case <-ctx.Done():
			return
		}
		for {
			w.mu.Lock()
			if len(w.dirty) == 0 {
				w.mu.Unlock()
				break
			}
			id := w.dirty[0]
			w.dirty = w.dirty[1:]
			delete(w.marked, id)
			w.mu.Unlock()
			w.send(ctx, id)
		}
	}
}

// send reads run id and queues its summary to every watcher; a watcher
// whose queue is full is dropped, as for run events.
func (w *runWatch) send(ctx context.Context, id keel.RunID) {
	run, err := w.s.svc.History.GetRun(ctx, id)
	if err != nil {
		if ctx.Err() == nil {
			w.s.log.Warn("ipc: read a changed run", logkey.Run, id, logkey.Err, err)
		}
		return
	}
	params, err := json.Marshal(run)
	if err != nil {
		w.s.log.Error("ipc: encode a changed run", logkey.Run, id, logkey.Err, err)
		return
	}
	data, err := json.Marshal(protocol.Notification{JSONRPC: "2.0", Method: protocol.NotifyRunsChanged, Params: params})
	if err != nil {
		return
	}
	w.mu.Lock()
	conns := make([]*conn, 0, len(w.watchers))
	for c := range w.watchers {
		conns = append(conns, c)
	}
	w.mu.Unlock()
	for _, c := range conns {
		if !c.q.tryPushLive(outMsg{data: data}) {
			c.end(websocket.StatusPolicyViolation, reasonTooSlow)
		}
	}
}

// handleRunsSubscribe makes c a watcher once its response is queued,
// so that the response comes before the first runs.changed.
func handleRunsSubscribe(_ context.Context, c *conn, _ struct{}) (any, error) {
	return followUp{result: struct{}{}, then: func() { c.s.watch.add(c) }}, nil
}

func handleRunsUnsubscribe(_ context.Context, c *conn, _ struct{}) (any, error) {
	c.s.watch.remove(c)
	return struct{}{}, nil
}
