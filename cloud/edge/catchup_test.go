package edge_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/cloud/edge"
)

// journal is a daemon's journal for an edge without a daemon: runs and
// their events, as ipc.History reads them.
type journal struct {
	mu   sync.Mutex
	runs map[keel.RunID][]keel.Event
}

// add journals the events of types for run id after its last, and
// returns them.
func (j *journal) add(id keel.RunID, types ...keel.EventType) []keel.Event {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.runs == nil {
		j.runs = map[keel.RunID][]keel.Event{}
	}
	var out []keel.Event
	for _, typ := range types {
		seq := int64(len(j.runs[id]) + 1)
		ev := keel.Event{RunID: id, Seq: seq, Type: typ, Time: time.Unix(1700000000+seq, 0).UTC(),
			Data: fmt.Appendf(nil, `{"n":%d}`, seq)}
		j.runs[id] = append(j.runs[id], ev)
		out = append(out, ev)
	}
	return out
}

func (j *journal) RunPage(_ context.Context, q keel.RunQuery) (keel.RunPage, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var page keel.RunPage
	for id, evs := range j.runs {
		page.Runs = append(page.Runs, keel.Run{ID: id, LastSeq: int64(len(evs))})
	}
	return page, nil
}

func (j *journal) Events(_ context.Context, id keel.RunID, after int64) ([]keel.Event, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	evs := j.runs[id]
	return slices.Clone(evs[min(after, int64(len(evs))):]), nil
}

// TestOutboxCatchUp: an edge dies between journaling a run's events and
// storing them in its outbox (a test seam cuts the outbox from the
// fourth event on, as a crash would: they are journaled and never
// stored). Its daemon starts again over the same data: the edge gives
// the outbox what it misses of the journal before the events of the
// restarted run, and the cloud's copy of the run equals the journal,
// event for event (run, seq, type, time, data), each once.
func TestOutboxCatchUp(t *testing.T) {
	t.Parallel()
	const name = "catchup-edge"
	const run = keel.RunID("run_catchup")
	dir := t.TempDir()
	j := &journal{}
	describe := func(context.Context) (capabilities.Environment, error) { return capabilities.Environment{}, nil }
	noLabels := func(context.Context, keel.RunID) ([]string, error) { return nil, nil }
	join := func() *edge.Edge {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		e, err := edge.Join(ctx, edge.Config{URL: cluster.LeafURLs(), Credentials: credentials(t), Name: name, Dir: dir,
			Heartbeat: 100 * time.Millisecond}, edge.Sources{Describe: describe, Labels: noLabels, Journal: j})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	closeEdge := func(e *edge.Edge) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		e.Close(ctx)
	}

	e := join()
	edge.CutOutbox(e, func(ev keel.Event) bool { return ev.Seq >= 4 })
	for _, ev := range j.add(run, keel.EventRunStarted, keel.EventModelResult, keel.EventToolCall, keel.EventToolResult, keel.EventModelResult) {
		e.OnEvent(ev)
	}
	if got := mirrored(t, name, run, 3); len(got) != 3 {
		t.Fatalf("the mirror before the crash holds %d events, want 3", len(got))
	}
	closeEdge(e) // what was queued after the cut is lost with it

	// The daemon starts again: its run is interrupted, then goes on.
	j.add(run, keel.EventRunInterrupted)
	e = join()
	defer closeEdge(e)
	for _, ev := range j.add(run, keel.EventRunResumed, keel.EventModelResult, keel.EventRunSucceeded) {
		e.OnEvent(ev)
	}
	got := mirrored(t, name, run, 0)
	want, _ := j.Events(context.Background(), run, 0)
	same := len(got) == len(want)
	for i := 0; same && i < len(got); i++ {
		g, w := got[i], want[i]
		same = g.RunID == w.RunID && g.Seq == w.Seq && g.Type == w.Type && g.Time.Equal(w.Time) && bytes.Equal(g.Data, w.Data)
	}
	if !same {
		t.Errorf("the cloud's copy of run %s:\n%v\nwant the journal:\n%v", run, got, want)
	}
}
