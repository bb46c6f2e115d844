package ipc_test

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestDeltaFloodIsFolded: a model streaming deltas faster than a
// client reads (a fast local model) used to fill the client's queue and
// drop it as too slow, mid-run. Deltas are folded into the queued one of
// their step instead: the client stays, receives every byte of the text
// in order, and then the run's next persisted event.
func TestDeltaFloodIsFolded(t *testing.T) {
	t.Parallel()
	f := ipctest.New()
	f.AddRun("r1", keel.RunRunning)
	ts := startSmallBufServer(t, f, ipc.Config{QueueSize: 4})
	c := dialWith(t, ts, dialOpts{smallReadBuffer: true})
	c.callOK(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "r1"}, nil)

	// 200 deltas of 1 KiB, more than the small socket buffers hold, with
	// the client not reading.
	var want strings.Builder
	for i := range 200 {
		piece := strings.Repeat(string(rune('a'+i%26)), 1<<10)
		want.WriteString(piece)
		data, _ := json.Marshal(keel.ModelDeltaData{Step: 1, Content: piece})
		f.Emit(keel.Event{RunID: "r1", Type: keel.EventModelDelta, Data: data})
	}
	f.Emit(ipctest.Event("r1", 1))
	ts.grow()
	c.grow()

	got := readDeltas(t, c, 1)
	if got.String() != want.String() {
		t.Errorf("the client received %d bytes of text, want the %d streamed, in order", got.Len(), want.Len())
	}
}

// TestDeltasDuringReplayAreFolded: deltas that arrive while a
// subscription's stored events are read (a slow replay on a loaded
// machine, a fast local model) were buffered one by one; with the
// buffer full of them, the step's next persisted event dropped the
// client as too slow (seen against the real Ollama under load). They
// are folded as they arrive: the client stays and receives the stored
// event, every byte of the text in order, then the persisted one.
func TestDeltasDuringReplayAreFolded(t *testing.T) {
	t.Parallel()
	f := ipctest.New()
	f.AddRun("r1", keel.RunRunning)
	f.Emit(ipctest.Event("r1", 1))
	var want strings.Builder
	var once sync.Once
	f.OnEvents = func(before bool) {
		if before {
			return
		}
		// The subscription is registered and the replay not yet queued:
		// what is emitted now waits in its buffer.
		once.Do(func() {
			for i := range 20 {
				piece := strings.Repeat(string(rune('a'+i)), 8)
				want.WriteString(piece)
				data, _ := json.Marshal(keel.ModelDeltaData{Step: 1, Content: piece})
				f.Emit(keel.Event{RunID: "r1", Type: keel.EventModelDelta, Data: data})
			}
			f.Emit(ipctest.Event("r1", 2))
		})
	}
	ts := startSmallBufServer(t, f, ipc.Config{QueueSize: 4})
	c := dialWith(t, ts, dialOpts{})
	c.callOK(protocol.MethodRunSubscribe, protocol.SubscribeParams{RunID: "r1"}, nil)

	if ev := c.readEvent(); ev.Seq != 1 {
		t.Fatalf("first event %+v, want the stored seq 1", ev)
	}
	got := readDeltas(t, c, 2)
	if got.String() != want.String() {
		t.Errorf("the client received %q, want the %q streamed, in order", got.String(), want.String())
	}
}

// readDeltas reads step 1's deltas up to the persisted event seq and
// returns their text, failing on any other event.
func readDeltas(t *testing.T, c *tclient, seq int64) *strings.Builder {
	t.Helper()
	var got strings.Builder
	for {
		ev := c.readEvent()
		if ev.Seq == seq {
			return &got
		}
		var d keel.ModelDeltaData
		if ev.Type != keel.EventModelDelta || json.Unmarshal(ev.Data, &d) != nil || d.Step != 1 {
			t.Fatalf("unexpected event %+v", ev)
		}
		got.WriteString(d.Content)
	}
}
