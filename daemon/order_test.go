package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestLiveEventsInOrderUnderConcurrentSays: people say things to a run
// from several connections at once while it runs; a subscriber over the
// real WebSocket gets every journaled event of the run, each once, in Seq
// order (issue 13, item 10: a later Seq published first made the server
// drop the earlier one as already sent).
func TestLiveEventsInOrderUnderConcurrentSays(t *testing.T) {
	release := make(chan struct{})
	p := scripted.New(nil,
		scripted.ReplyFunc(func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
			select {
			case <-release:
			case <-ctx.Done():
				return models.ChatResponse{}, ctx.Err()
			}
			return models.ChatResponse{Message: models.Message{Content: "first"}}, nil
		}),
	)
	d := startDaemon(t, daemon.Config{Provider: p})
	watcher := dial(t, d.dir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := startWaiting(t, watcher, p, "listen")
	if _, err := watcher.Subscribe(ctx, run.ID, 0); err != nil {
		t.Fatal(err)
	}

	const people, says = 6, 25
	var wg sync.WaitGroup
	for i := range people {
		c := dial(t, d.dir)
		wg.Go(func() {
			for j := range says {
				if _, err := c.SayToRun(ctx, run.ID, fmt.Sprintf("person %d, message %d", i, j)); err != nil {
					if pe, ok := errors.AsType[*protocol.Error](err); !ok || pe.Code != protocol.CodeConflict {
						t.Errorf("run.say: %v", err)
					}
					return
				}
				if i == 0 && j == says/2 {
					close(release)
				}
			}
		})
	}
	wg.Wait()

	var seqs []int64
	for done := false; !done; {
		select {
		case ev, ok := <-watcher.Events():
			if !ok {
				t.Fatalf("connection closed after seqs %v", seqs)
			}
			if ev.RunID != run.ID || ev.Seq == 0 {
				continue
			}
			seqs = append(seqs, ev.Seq)
			done = ev.Type == keel.EventRunSucceeded || ev.Type == keel.EventRunFailed || ev.Type == keel.EventRunCancelled
		case <-ctx.Done():
			t.Fatalf("run did not end; saw seqs %v", seqs)
		}
	}
	for i, seq := range seqs {
		if seq != int64(i+1) {
			t.Fatalf("event %d seen live has seq %d, want %d; saw %v", i, seq, i+1, seqs)
		}
	}
	det, err := watcher.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if last := int64(len(seqs)); det.Run.LastSeq != last {
		t.Fatalf("saw seqs 1..%d live, the journal has %d", last, det.Run.LastSeq)
	}
}
