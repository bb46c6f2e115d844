package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// seqWatcher subscribes to an engine and records the Seq of every
// journaled event of one run, in the order the subscriber saw them.
type seqWatcher struct {
	mu    sync.Mutex
	seqs  map[keel.RunID][]int64
	ended chan struct{} // a run ended
}

func watchSeqs(t *testing.T, eng *engine.Engine) *seqWatcher {
	w := &seqWatcher{seqs: map[keel.RunID][]int64{}, ended: make(chan struct{}, 1)}
	t.Cleanup(eng.Subscribe(func(ev keel.Event) {
		if ev.Seq == 0 {
			return
		}
		w.mu.Lock()
		w.seqs[ev.RunID] = append(w.seqs[ev.RunID], ev.Seq)
		w.mu.Unlock()
		switch ev.Type {
		case keel.EventRunSucceeded, keel.EventRunFailed, keel.EventRunCancelled:
			select {
			case w.ended <- struct{}{}:
			default:
			}
		}
	}))
	return w
}

// check fails the test unless the subscriber saw Seq 1 to last of run
// id, each once, in order.
func (w *seqWatcher) check(t *testing.T, id keel.RunID, last int64) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	want := int64(1)
	for i, seq := range w.seqs[id] {
		if seq != want {
			t.Fatalf("event %d seen live has seq %d, want %d (the subscriber saw %v)", i, seq, want, w.seqs[id])
		}
		want++
	}
	if want-1 != last {
		t.Fatalf("the subscriber saw seqs up to %d, want up to %d", want-1, last)
	}
}

// TestConcurrentAppendsPublishInOrder: while a run's loop journals its
// steps, several people say things to it at once; a subscriber sees every
// journaled event of the run exactly once and in Seq order (issue 13, item
// 10: an append used to publish after its own commit, so a later Seq could
// overtake an earlier one and a client that skips what it already saw lost
// the earlier one).
func TestConcurrentAppendsPublishInOrder(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	steps := []scripted.Step{scripted.ReplyFunc(func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
		<-release
		return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "c0", Name: "echo", Arguments: []byte(`{"text":"0"}`)}}}}, nil
	})}
	for i := 1; i < 12; i++ {
		steps = append(steps, scripted.CallTool("echo", fmt.Sprintf(`{"text":"%d"}`, i)))
	}
	steps = append(steps, scripted.Answer("done"))
	st, eng, _ := resumeHarness(t, scripted.New(nil, steps...))
	w := watchSeqs(t, eng)
	ctx := context.Background()

	run, err := eng.Start(ctx, engine.StartRequest{Goal: "echo a lot", MaxSteps: 20})
	if err != nil {
		t.Fatal(err)
	}
	const people, says = 8, 30
	var wg sync.WaitGroup
	for p := range people {
		wg.Go(func() {
			for i := range says {
				if _, err := eng.Say(ctx, run.ID, fmt.Sprintf("person %d, message %d", p, i)); err != nil && !errors.Is(err, keel.ErrConflict) {
					t.Errorf("Say: %v", err)
					return
				}
				if p == 0 && i == 2 {
					close(release)
				}
			}
		})
	}
	wg.Wait()
	select {
	case <-w.ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the run did not end")
	}
	if err := eng.Wait(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	got, err := st.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	w.check(t, run.ID, got.LastSeq)
}
