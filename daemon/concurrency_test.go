package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
)

// TestLiveEventsInOrderUnderConcurrentSays: people say things to a run
// from several connections at once while it runs; a subscriber over the
// real WebSocket gets every journaled event of the run, each once, in Seq
// order (issue 13, item 10: a later Seq published first made the server
// drop the earlier one as already sent).
func TestLiveEventsInOrderUnderConcurrentSays(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	first, called := asked(func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return models.ChatResponse{}, ctx.Err()
		}
		return models.ChatResponse{Message: models.Message{Content: "first"}}, nil
	})
	d := startDaemon(t, daemon.Config{Provider: scripted.New(nil, first)})
	watcher := dial(t, d.dir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := startWaiting(t, watcher, called, "listen")
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

// TestConcurrentDecideOverWebSocket: several clients decide one wait at
// once over the real WebSocket; exactly one gets the run back, the others
// -32002 whose data names the decision that was journaled, and the
// journal holds that one decision (issue 13, item 11).
func TestConcurrentDecideOverWebSocket(t *testing.T) {
	t.Parallel()
	dir := noTools(t)
	call := keel.ToolCall{ID: "c1", Name: "send_invoice", Arguments: json.RawMessage(`{"to":"acme"}`)}
	st, err := store.Open(context.Background(), filepath.Join(dir, "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	now := time.Now()
	if err := st.CreateRun(ctx, keel.Run{ID: "run_w", Goal: "bill acme", Model: scripted.DefaultModel.Name, Status: keel.RunQueued, MaxSteps: 3, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	for _, e := range []struct {
		typ  keel.EventType
		data any
		upd  *keel.RunUpdate
	}{
		{keel.EventRunStarted, keel.RunStartedData{Goal: "bill acme"}, &keel.RunUpdate{Status: keel.RunRunning}},
		{keel.EventModelResult, keel.ModelResultData{Step: 1, ToolCalls: []keel.ToolCall{call}}, nil},
		{keel.EventToolCall, keel.ToolCallData{Step: 1, Call: call}, nil},
	} {
		raw, _ := json.Marshal(e.data)
		if _, err := st.Append(ctx, "run_w", e.typ, now, raw, e.upd); err != nil {
			t.Fatal(err)
		}
	}
	st.Close() // the daemon died here: the run waits for a decision on restart

	p := scripted.New(nil, scripted.Repeat(scripted.Answer("billed")))
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: p})
	c := dial(t, d.dir)
	waitEvent(t, dir, "run_w", keel.EventRunWaiting)

	// keel runs --status finds it among the runs.
	if out, errOut, code := runCLI(ctx, dir, "runs", "--status", "waiting,paused"); code != 0 || !strings.Contains(out, "run_w") {
		t.Errorf("keel runs --status waiting,paused = exit %d: %s%s; want run_w listed", code, out, errOut)
	}
	if out, errOut, code := runCLI(ctx, dir, "runs", "--status", "succeeded"); code != 0 || strings.Contains(out, "run_w") || !strings.Contains(out, "no runs match") {
		t.Errorf("keel runs --status succeeded = exit %d: %s%s; want no runs", code, out, errOut)
	}
	if _, _, code := runCLI(ctx, dir, "runs", "--status", "stuck"); code == 0 {
		t.Error("keel runs --status stuck exited 0")
	}

	decisions := []string{keel.DecisionSkip, keel.DecisionDone, keel.DecisionRetry}
	const people = 6
	errs := make([]error, people)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range people {
		pc := dial(t, d.dir)
		wg.Go(func() {
			<-start
			_, errs[i] = pc.Decide(ctx, protocol.RunDecideParams{RunID: "run_w", CallID: "c1", Decision: decisions[i%len(decisions)]})
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		if err == nil {
			if winner >= 0 {
				t.Fatalf("run.decide by client %d and %d both succeeded", winner, i)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatalf("no run.decide succeeded: %v", errs)
	}
	follow(t, c, "run_w")
	det, err := c.GetRun(ctx, "run_w")
	if err != nil {
		t.Fatal(err)
	}
	var journaled []int64
	for _, ev := range det.Events {
		if ev.Type == keel.EventHumanDecision {
			journaled = append(journaled, ev.Seq)
		}
	}
	if len(journaled) != 1 {
		t.Fatalf("journal has %d decisions (seqs %v), want 1", len(journaled), journaled)
	}
	for i, err := range errs {
		if i == winner {
			continue
		}
		pe := wantCode(t, err, protocol.CodeConflict, fmt.Sprintf("run.decide by client %d", i))
		var got protocol.AlreadyDecided
		if err := json.Unmarshal(pe.Data, &got); err != nil {
			t.Fatalf("error data %s: %v", pe.Data, err)
		}
		want := protocol.AlreadyDecided{RunID: "run_w", CallID: "c1", Decision: decisions[winner%len(decisions)], Seq: journaled[0]}
		if got != want {
			t.Errorf("run.decide by client %d: data %+v, want %+v", i, got, want)
		}
	}
}
