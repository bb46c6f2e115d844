package ipc_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// readRunChanged reads the next frame, which must be a runs.changed.
func (c *tclient) readRunChanged() keel.Run {
	c.t.Helper()
	m := c.read()
	if m.Method != protocol.NotifyRunsChanged || m.ID != nil {
		c.t.Fatalf("got frame id=%s method=%q error=%v, want a %s notification", m.ID, m.Method, m.Error, protocol.NotifyRunsChanged)
	}
	var r keel.Run
	if err := json.Unmarshal(m.Params, &r); err != nil {
		c.t.Fatalf("decode run %s: %v", m.Params, err)
	}
	return r
}

// TestRunsSubscribe follows the runs over real WebSockets: a watcher
// (runs.subscribe) hears of a new run (its first event, or run.start)
// and of each change of state, with the run's summary as stored after
// the change, and of nothing else (an event that changes no state, a
// live delta); a connection that did not subscribe, or unsubscribed,
// hears nothing.
func TestRunsSubscribe(t *testing.T) {
	t.Parallel()
	f := ipctest.New()
	ts := startServer(t, f, ipc.Config{})
	watcher, other, quitter := dial(t, ts), dial(t, ts), dial(t, ts)
	// Each connection follows the runs' events for its run.subscribe;
	// the watch adds one subscription while anyone watches, and only
	// then.
	subscribers := func(n int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.WaitUntil(ctx, func() bool { return f.Subscribers() == n }); err != nil {
			t.Fatalf("the backend has %d event subscribers, want %d", f.Subscribers(), n)
		}
	}
	subscribers(3)
	for _, c := range []*tclient{watcher, quitter} {
		var res struct{}
		c.callOK(protocol.MethodRunsSubscribe, nil, &res)
	}
	subscribers(4)
	check := func(what string, got keel.Run, id keel.RunID, st keel.RunStatus, seq int64) {
		t.Helper()
		if got.ID != id || got.Status != st || got.LastSeq != seq || got.Goal != "goal of "+string(id) {
			t.Errorf("%s: runs.changed %+v, want run %s %s at seq %d with its goal", what, got, id, st, seq)
		}
	}

	f.AddRun("r1", keel.RunRunning)
	f.Emit(keel.Event{RunID: "r1", Seq: 1, Type: keel.EventRunStarted})
	check("first event", watcher.readRunChanged(), "r1", keel.RunRunning, 1)
	// Neither a step nor a live delta changes the state: the next
	// notification is of another run's change, marked after them (runs
	// are read in the order they were marked).
	f.Emit(keel.Event{RunID: "r1", Seq: 2, Type: keel.EventModelResult})
	f.Emit(keel.Event{RunID: "r1", Type: keel.EventModelDelta})
	f.AddRun("r0", keel.RunRunning)
	f.Emit(keel.Event{RunID: "r0", Seq: 1, Type: keel.EventRunStarted})
	check("another run", watcher.readRunChanged(), "r0", keel.RunRunning, 1)
	f.AddRun("r1", keel.RunWaiting)
	f.Emit(keel.Event{RunID: "r1", Seq: 3, Type: keel.EventApprovalAsked})
	check("approval asked", watcher.readRunChanged(), "r1", keel.RunWaiting, 3)

	// run.start: a run stored queued, before any event of it.
	var started keel.Run
	other.callOK(protocol.MethodRunStart, protocol.RunStartParams{Goal: "goal of run-1"}, &started)
	check("run.start", watcher.readRunChanged(), started.ID, keel.RunQueued, 0)

	// The quitter saw the same, then stops.
	check("quitter, first event", quitter.readRunChanged(), "r1", keel.RunRunning, 1)
	check("quitter, another run", quitter.readRunChanged(), "r0", keel.RunRunning, 1)
	check("quitter, approval asked", quitter.readRunChanged(), "r1", keel.RunWaiting, 3)
	check("quitter, run.start", quitter.readRunChanged(), started.ID, keel.RunQueued, 0)
	quitter.callOK(protocol.MethodRunsUnsubscribe, nil, nil)

	f.AddRun("r1", keel.RunSucceeded)
	f.Emit(keel.Event{RunID: "r1", Seq: 4, Type: keel.EventRunSucceeded})
	f.AddRun("r2", keel.RunRunning)
	f.Emit(keel.Event{RunID: "r2", Seq: 1, Type: keel.EventRunStarted})
	check("run end", watcher.readRunChanged(), "r1", keel.RunSucceeded, 4)
	// r2's summary is sent after r1's reached every watcher: had the
	// quitter or the other connection been sent either, it would be
	// queued before the answer to a call made now.
	check("second run", watcher.readRunChanged(), "r2", keel.RunRunning, 1)
	for name, c := range map[string]*tclient{"a connection that never subscribed": other, "a connection that unsubscribed": quitter} {
		id := c.send(protocol.MethodInitialize, nil)
		if m := c.read(); string(m.ID) != id || m.Method != "" {
			t.Errorf("%s got frame id=%s method=%q before its answer, want no notification", name, m.ID, m.Method)
		}
	}
	// Subscribing twice is no error and does not double the
	// notifications.
	watcher.callOK(protocol.MethodRunsSubscribe, nil, nil)
	f.AddRun("r2", keel.RunPaused)
	f.Emit(keel.Event{RunID: "r2", Seq: 2, Type: keel.EventRunPaused})
	check("paused", watcher.readRunChanged(), "r2", keel.RunPaused, 2)
	watcher.callOK(protocol.MethodInitialize, nil, nil)
	// A watcher that disconnects stops watching; the last watcher gone,
	// the watch stops following the runs.
	other.callOK(protocol.MethodRunsSubscribe, nil, nil)
	other.ws.Close(websocket.StatusNormalClosure, "")
	subscribers(3) // two connections and the watch
	watcher.callOK(protocol.MethodRunsUnsubscribe, nil, nil)
	subscribers(2)
}
