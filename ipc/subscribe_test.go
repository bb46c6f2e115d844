package ipc_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// readSeqs reads run.event notifications until it has seen lastSeq and
// returns the Seqs of the persisted ones, in arrival order. Live-only
// events are counted in live.
func readSeqs(t *testing.T, c *tclient, lastSeq int64) (seqs []int64, live int) {
	t.Helper()
	for {
		ev := c.readEvent()
		if ev.Seq == 0 {
			live++
			continue
		}
		seqs = append(seqs, ev.Seq)
		if ev.Seq >= lastSeq {
			return seqs, live
		}
	}
}

func seqRange(from, to int64) []int64 {
	var s []int64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func equalSeqs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSubscribeExactlyOnce stores events 1..5, subscribes after 2 and
// emits more while the subscription is being set up:
//   - 6 is stored and announced while Events runs, before it reads the
//     store, so it is both replayed and delivered live: sent twice if
//     the server does not skip Seqs it has sent;
//   - 7 is stored and announced after Events has read the store, so
//     only the live listener sees it: lost if the server registers the
//     listener after reading;
//   - 8 and a live-only delta are emitted from another goroutine,
//     concurrently with the replay.
//
// Then the client disconnects, 9 and 10 happen, and a reconnect with
// after_seq = the last Seq seen gets exactly 9 and 10.
func TestSubscribeExactlyOnce(t *testing.T) {
	f := ipctest.New()
	f.AddRun("r1", keel.RunRunning)
	f.EmitSeq("r1", 1, 5)
	var wg sync.WaitGroup
	var calls atomic.Int32
	f.OnEvents = func(before bool) {
		if calls.Add(1) > 2 { // the first subscribe only
			return
		}
		if before {
			f.Emit(ipctest.Event("r1", 6))
			return
		}
		f.Emit(ipctest.Event("r1", 7))
		wg.Go(func() {
			f.Emit(keel.Event{RunID: "r1", Type: keel.EventModelDelta, Data: json.RawMessage(`{"step":8,"content":"hi"}`)})
			f.Emit(ipctest.Event("r1", 8))
		})
	}
	ts := startServer(t, f, ipc.Config{})
	c := dial(t, ts)

	// The response comes before any event.
	var sub protocol.SubscribeResult
	c.callOK(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "r1", AfterSeq: 2}, &sub)
	if sub.RunID != "r1" || sub.Status != keel.RunRunning {
		t.Errorf("run.subscribe = %+v, want r1 running", sub)
	}
	seqs, live := readSeqs(t, c, 8)
	wg.Wait()
	if want := seqRange(3, 8); !equalSeqs(seqs, want) {
		t.Errorf("events after 2 = %v, want %v", seqs, want)
	}
	// No duplicate after 8 either: the next frame is the response below.
	c.callOK(protocol.MethodInitialize, nil, nil)
	if live != 1 {
		t.Errorf("got %d live-only events, want 1", live)
	}

	// Reconnect: missed events come from the store, each once.
	c.ws.Close(websocket.StatusNormalClosure, "")
	f.EmitSeq("r1", 9, 10)
	c2 := dial(t, ts)
	c2.callOK(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "r1", AfterSeq: seqs[len(seqs)-1]}, nil)
	f.EmitSeq("r1", 11, 11)
	seqs2, _ := readSeqs(t, c2, 11)
	if want := seqRange(9, 11); !equalSeqs(seqs2, want) {
		t.Errorf("after reconnect with after_seq 8: events %v, want %v", seqs2, want)
	}
}

// TestSubscribeConcurrentEmits races the subscription setup against a
// steady stream of events, many times.
func TestSubscribeConcurrentEmits(t *testing.T) {
	const rounds, last = 20, 60
	for round := range rounds {
		f := ipctest.New()
		f.AddRun("r1", keel.RunRunning)
		f.EmitSeq("r1", 1, 5)
		ts := startServer(t, f, ipc.Config{})
		c := dial(t, ts)

		var wg sync.WaitGroup
		wg.Go(func() {
			for seq := int64(6); seq <= last; seq++ {
				f.Emit(ipctest.Event("r1", seq))
				if seq%7 == 0 {
					f.Emit(keel.Event{RunID: "r1", Type: keel.EventModelDelta})
				}
			}
		})
		c.callOK(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "r1", AfterSeq: 2}, nil)
		seqs, _ := readSeqs(t, c, last)
		wg.Wait()
		if want := seqRange(3, last); !equalSeqs(seqs, want) {
			t.Fatalf("round %d: events after 2 = %v, want %v", round, seqs, want)
		}
		c.ws.Close(websocket.StatusNormalClosure, "")
		if err := ts.stop(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSubscribeOnlyThatRun(t *testing.T) {
	f := ipctest.New()
	f.AddRun("r1", keel.RunRunning)
	f.AddRun("r2", keel.RunRunning)
	ts := startServer(t, f, ipc.Config{})
	c := dial(t, ts)
	c.callOK(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "r1"}, nil)
	f.Emit(ipctest.Event("r2", 1))
	f.Emit(ipctest.Event("r1", 1))
	if ev := c.readEvent(); ev.RunID != "r1" {
		t.Errorf("got an event of run %q, want only r1's", ev.RunID)
	}
}

func TestUnsubscribe(t *testing.T) {
	f := ipctest.New()
	f.AddRun("r1", keel.RunRunning)
	ts := startServer(t, f, ipc.Config{})
	c := dial(t, ts)
	c.callOK(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "r1"}, nil)
	f.Emit(ipctest.Event("r1", 1))
	if ev := c.readEvent(); ev.Seq != 1 {
		t.Fatalf("event seq %d, want 1", ev.Seq)
	}
	c.callOK(protocol.MethodRunUnsubscribe, protocol.RunRef{RunID: "r1"}, nil)
	f.Emit(ipctest.Event("r1", 2))
	// The next frame must be this response, not event 2.
	c.callOK(protocol.MethodInitialize, nil, nil)
	// Unsubscribing again is harmless, and subscribing again works.
	c.callOK(protocol.MethodRunUnsubscribe, protocol.RunRef{RunID: "r1"}, nil)
	c.callOK(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "r1", AfterSeq: 1}, nil)
	if ev := c.readEvent(); ev.Seq != 2 {
		t.Errorf("after resubscribing after 1: event seq %d, want 2", ev.Seq)
	}
}

func TestSubscribeErrors(t *testing.T) {
	f := ipctest.New()
	f.AddRun("r1", keel.RunRunning)
	ts := startServer(t, f, ipc.Config{})
	c := dial(t, ts)

	m := c.call(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "nope"})
	if m.Error == nil || m.Error.Code != protocol.CodeNotFound {
		t.Errorf("subscribe to a missing run: %+v, want code %d", m.Error, protocol.CodeNotFound)
	}
	c.callOK(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "r1"}, nil)
	m = c.call(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "r1"})
	if m.Error == nil || m.Error.Code != protocol.CodeConflict {
		t.Errorf("second subscribe to r1: %+v, want code %d", m.Error, protocol.CodeConflict)
	}
	// The failed subscribe left no subscription behind.
	f.Emit(ipctest.Event("nope", 1))
	f.Emit(ipctest.Event("r1", 1))
	if ev := c.readEvent(); ev.RunID != "r1" || ev.Seq != 1 {
		t.Errorf("event %q/%d, want r1/1", ev.RunID, ev.Seq)
	}
}

// TestSlowClientDropped subscribes, stops reading and floods the run
// with events. The Backend's callback must never wait for the client:
// the emits finish while the client reads nothing, the client is
// disconnected with 1008, and its listener is unregistered. Another
// client is unaffected.
func TestSlowClientDropped(t *testing.T) {
	f := ipctest.New()
	f.AddRun("r1", keel.RunRunning)
	ts := startSmallBufServer(t, f, ipc.Config{QueueSize: 4})
	slow := dialWith(t, ts, dialOpts{smallReadBuffer: true})
	slow.callOK(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "r1"}, nil)
	other := dial(t, ts)
	other.callOK(protocol.MethodInitialize, nil, nil)

	// 400 events of 4 KiB: far more than the socket buffers hold, so
	// the server's writer blocks and the queue fills.
	data, _ := json.Marshal(map[string]string{"content": strings.Repeat("x", 4<<10)})
	emitted := make(chan time.Duration, 1)
	go func() {
		var slowest time.Duration
		for seq := int64(1); seq <= 400; seq++ {
			t0 := time.Now()
			f.Emit(keel.Event{RunID: "r1", Seq: seq, Type: keel.EventModelResult, Data: data})
			slowest = max(slowest, time.Since(t0))
		}
		emitted <- slowest
	}()
	select {
	case slowest := <-emitted:
		if slowest > time.Second {
			t.Errorf("slowest emit took %v; the callback must not wait for the client", slowest)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("emitting to a client that does not read blocked the backend")
	}

	// The slow client now reads: whatever was sent, then the close.
	var err error
	for err == nil {
		_, err = slow.tryRead(10 * time.Second)
	}
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, "too slow") {
		t.Errorf("slow client's connection ended with %v, want close status 1008 with reason \"client too slow...\"", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.WaitUntil(ctx, func() bool { return f.Subscribers() == 1 }); err != nil { // the other client's
		t.Fatalf("backend has %d subscribers, want 1 after the slow client was dropped", f.Subscribers())
	}
	other.callOK(protocol.MethodInitialize, nil, nil)
}

// TestLargeReplayDoesNotDrop checks that replaying a history larger than
// the queue applies backpressure instead of dropping the client, even
// when a live event of another subscription arrives while the replay
// has filled the queue.
func TestLargeReplayDoesNotDrop(t *testing.T) {
	f := ipctest.New()
	f.AddRun("big", keel.RunSucceeded)
	f.AddRun("live", keel.RunRunning)
	data, _ := json.Marshal(strings.Repeat("y", 4<<10))
	for seq := int64(1); seq <= 500; seq++ { // 2 MB: more than the socket buffers hold
		f.Emit(keel.Event{RunID: "big", Seq: seq, Type: keel.EventModelResult, Data: data})
	}
	ts := startSmallBufServer(t, f, ipc.Config{QueueSize: 4})
	c := dialWith(t, ts, dialOpts{smallReadBuffer: true})
	c.callOK(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "live"}, nil)
	id := c.send(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "big"})
	time.Sleep(200 * time.Millisecond) // not reading: the replay fills the queue
	f.Emit(ipctest.Event("live", 1))
	ts.grow()
	c.grow()

	if m := c.read(); string(m.ID) != id || m.Error != nil {
		t.Fatalf("first frame: id %s error %v, want the subscribe response", m.ID, m.Error)
	}
	var bigSeqs []int64
	gotLive := false
	for len(bigSeqs) < 500 || !gotLive {
		ev := c.readEvent()
		switch ev.RunID {
		case "big":
			bigSeqs = append(bigSeqs, ev.Seq)
		case "live":
			gotLive = true
		}
	}
	if want := seqRange(1, 500); !equalSeqs(bigSeqs, want) {
		t.Errorf("replay of 500 events: got %d events, not 1..500 in order", len(bigSeqs))
	}
}

// TestSubscribeReplayCancelledOnClose checks that a replay blocked on a
// client that does not read ends when the server stops.
func TestSubscribeReplayCancelledOnClose(t *testing.T) {
	f := ipctest.New()
	f.AddRun("big", keel.RunSucceeded)
	data, _ := json.Marshal(strings.Repeat("y", 4<<10))
	for seq := int64(1); seq <= 500; seq++ {
		f.Emit(keel.Event{RunID: "big", Seq: seq, Type: keel.EventModelResult, Data: data})
	}
	ts := startSmallBufServer(t, f, ipc.Config{QueueSize: 2})
	c := dialWith(t, ts, dialOpts{smallReadBuffer: true})
	c.send(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "big"})
	time.Sleep(100 * time.Millisecond) // let the replay fill every buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- ts.stop() }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("Run = %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Run did not return while a replay was blocked")
	}
}
