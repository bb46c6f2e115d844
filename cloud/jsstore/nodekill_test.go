package jsstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud/jsstore"
	"github.com/keel-runtime/keel/cloud/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestJournalLeaderKilled: the node leading a run's journal stream is
// shut down while a writer appends to the run. R3 keeps the journal: the
// writer's appends all succeed (its client reconnects to another node; a
// publish that found no leader is retried), and the journal holds each
// event once, numbered without gaps. (The node is shut down, not killed
// hard: an in-process server cannot be. An append whose acknowledgement
// a failover loses is refused when retried, by the append guard, as
// keel.ErrConflict: no event is stored twice.)
func TestJournalLeaderKilled(t *testing.T) {
	t.Parallel()
	cl, err := natstest.Start(natstest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	nc, err := cl.Connect(nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := jsstore.Open(ctx, js, jsstore.Config{Namespace: "kill"})
	if err != nil {
		t.Fatal(err)
	}
	r := keel.Run{ID: "run_k", Goal: "g", Status: keel.RunQueued, CreatedAt: time.Now()}
	if _, err := st.CreateRunWith(ctx, r, event(keel.EventRunStarted), &keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "kill_JOURNAL")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const appends = 60
	killed := false
	for i := range appends {
		if i == 10 {
			for _, srv := range cl.Servers {
				if srv.Name() == info.Cluster.Leader {
					srv.Shutdown()
					killed = true
				}
			}
		}
		if _, err := st.AppendAll(ctx, r.ID, event(keel.EventHumanMessage), nil); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if !killed {
		t.Fatalf("no node is the journal's leader %q", info.Cluster.Leader)
	}
	// The cluster's API may answer nothing for a moment after losing
	// its node: ask until it does.
	for {
		after, err := s.Info(ctx)
		if err == nil && after.Cluster.Leader != info.Cluster.Leader && after.Cluster.Leader != "" {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the journal's leader %s was not replaced: %v", info.Cluster.Leader, err)
		case <-time.After(50 * time.Millisecond): // the API's next try
		}
	}
	evs, err := st.Events(ctx, r.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1+appends {
		t.Fatalf("%d events, want %d", len(evs), 1+appends)
	}
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
	}
}
