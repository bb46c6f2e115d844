package jsstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud/jsstore"
	"github.com/keel-runtime/keel/cloud/natstest"
	"github.com/keel-runtime/keel/internal/storetest"
	"github.com/nats-io/nats.go/jetstream"
)

// cluster is the package's 3-node cluster; each test has a namespace.
var cluster *natstest.Cluster

func TestMain(m *testing.M) {
	var err error
	if cluster, err = natstest.Start(natstest.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	cluster.Close()
	os.Exit(code)
}

var namespaces atomic.Int64

// open returns a Store in a namespace of its own over a connection of
// its own, closed when t ends.
func open(t *testing.T, ns string) *jsstore.Store {
	t.Helper()
	if ns == "" {
		ns = fmt.Sprintf("t%d", namespaces.Add(1))
	}
	nc, err := cluster.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := jsstore.Open(ctx, js, jsstore.Config{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestConformance runs the store seam's suite (the SQLite store passes
// it too) on R3 streams.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Store { return open(t, "") })
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func event(typ keel.EventType) []keel.Event {
	return []keel.Event{{Type: typ, Time: time.Now(), Data: json.RawMessage(`{}`)}}
}

// TestStaleWriterConflicts is the fence between two workers of one run:
// a Store that appended, then lost the run to another Store that read
// and appended after it, cannot append again (keel.ErrConflict), and
// nothing of its refused append is stored; it appends nothing more until
// it reads the run again, and then it can.
func TestStaleWriterConflicts(t *testing.T) {
	t.Parallel()
	ns := fmt.Sprintf("t%d", namespaces.Add(1))
	a, b := open(t, ns), open(t, ns)
	c := ctx(t)
	r := keel.Run{ID: "run_x", Goal: "g", Status: keel.RunQueued, CreatedAt: time.Now()}
	if _, err := a.CreateRunWith(c, r, event(keel.EventRunStarted), &keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Events(c, r.ID, 0); err != nil { // b takes the run over
		t.Fatal(err)
	}
	if _, err := b.AppendAll(c, r.ID, event(keel.EventRunResumed), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AppendAll(c, r.ID, event(keel.EventToolCall), nil); !errors.Is(err, keel.ErrConflict) {
		t.Fatalf("the stale writer's AppendAll = %v, want keel.ErrConflict", err)
	}
	evs, err := b.Events(c, r.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[1].Type != keel.EventRunResumed {
		t.Fatalf("journal = %+v, want run.started, run.resumed", evs)
	}
	// a appends nothing more to the run until it reads it: a writer that
	// lost its run must not journal, say, the run's failure after it.
	if _, err := a.AppendAll(c, r.ID, event(keel.EventRunFailed), &keel.RunUpdate{Status: keel.RunFailed}); !errors.Is(err, keel.ErrConflict) {
		t.Fatalf("the stale writer's next AppendAll = %v, want keel.ErrConflict", err)
	}
	if run, err := a.GetRun(c, r.ID); err != nil || run.LastSeq != 2 {
		t.Fatalf("a.GetRun = last_seq %d, %v; want 2", run.LastSeq, err)
	}
	got, err := a.AppendAll(c, r.ID, event(keel.EventToolCall), nil)
	if err != nil {
		t.Fatalf("AppendAll after the conflict: %v", err)
	}
	if got[0].Seq != 3 {
		t.Errorf("appended as seq %d, want 3", got[0].Seq)
	}
	if run, _ := b.GetRun(c, r.ID); run.LastSeq != 3 {
		t.Errorf("the other Store reads last_seq %d, want 3", run.LastSeq)
	}
}

// TestHeadRepaired: a head left behind by a writer that stopped between
// its journal append and its head write is repaired by the next Store
// that reads the run, so listing by status finds the run as its journal
// says.
func TestHeadRepaired(t *testing.T) {
	t.Parallel()
	ns := fmt.Sprintf("t%d", namespaces.Add(1))
	a := open(t, ns)
	c := ctx(t)
	r := keel.Run{ID: "run_h", Goal: "g", Status: keel.RunQueued, CreatedAt: time.Now()}
	if err := a.CreateRun(c, r); err != nil {
		t.Fatal(err)
	}
	// The journal gets run.started (running) without its head: written
	// straight to the stream, as a writer killed in between leaves it.
	nc, err := cluster.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	raw, _ := json.Marshal(map[string]any{"events": []keel.Event{{RunID: r.ID, Seq: 1, Type: keel.EventRunStarted, Time: time.Now().UTC()}},
		"update": keel.RunUpdate{Status: keel.RunRunning}})
	if _, err := js.Publish(c, ns+".journal.run_h", raw); err != nil {
		t.Fatal(err)
	}
	if got, err := open(t, ns).RunsWithStatus(c, keel.RunRunning); err != nil || len(got) != 1 || got[0].LastSeq != 1 {
		t.Fatalf("RunsWithStatus(running) = %+v, %v; want run_h at seq 1", got, err)
	}
	kv, err := js.KeyValue(c, ns+"_runs")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(c, "run_h")
	if err != nil {
		t.Fatal(err)
	}
	var h struct{ Run keel.Run }
	json.Unmarshal(e.Value(), &h)
	if h.Run.Status != keel.RunRunning {
		t.Errorf("head after a read = %s, want running (repaired)", h.Run.Status)
	}
}
