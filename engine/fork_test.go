package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestFork: a fork from step N keeps the source's steps up to N with
// their tool results (nothing is done again), uses the edited goal, asks
// the model only for the steps after N, and replays to its own journal;
// the source is untouched.
func TestFork(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil,
		scripted.CallTool("write", `{"n":1}`),
		scripted.CallTool("echo", `{"text":"two"}`),
		scripted.Answer("original"),
		scripted.Answer("forked answer"),
	)
	st, eng, tools := resumeHarness(t, p)
	ctx := context.Background()
	src, err := eng.Start(ctx, engine.StartRequest{Goal: "first goal"})
	if err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng, st, src.ID); r.Status != keel.RunSucceeded || r.Result != "original" {
		t.Fatalf("source = %s %q", r.Status, r.Result)
	}
	srcEvents := len(journal(t, st, src.ID))

	if _, err := eng.Fork(ctx, engine.ForkRequest{From: src.ID, Step: 4}); !errors.Is(err, keel.ErrInvalid) {
		t.Errorf("Fork past the last step = %v, want ErrInvalid", err)
	}
	fork, err := eng.Fork(ctx, engine.ForkRequest{From: src.ID, Step: 1, Goal: "edited goal"})
	if err != nil {
		t.Fatal(err)
	}
	r := waitRun(t, eng, st, fork.ID)
	if r.Status != keel.RunSucceeded || r.Result != "forked answer" || r.Goal != "edited goal" {
		t.Fatalf("fork = %s %q goal %q", r.Status, r.Result, r.Goal)
	}
	if tools.writes != 1 {
		t.Errorf("the non-idempotent write ran %d times, want once (the fork reuses its result)", tools.writes)
	}
	reqs := p.Requests()
	if len(reqs) != 4 {
		t.Fatalf("%d model calls in all, want 4 (three for the source, one for the fork)", len(reqs))
	}
	var ctxText []string
	for _, m := range reqs[3].Messages {
		ctxText = append(ctxText, m.Content)
	}
	got := strings.Join(ctxText, "\n")
	if !strings.Contains(got, "edited goal") || strings.Contains(got, "first goal") || !strings.Contains(got, `"written"`) || strings.Contains(got, "two") {
		t.Errorf("the fork's model saw:\n%s\nwant the edited goal and step 1's write result, nothing of step 2", got)
	}
	evs := journal(t, st, fork.ID)
	if evs[0].Type != keel.EventRunForked || !strings.Contains(string(evs[0].Data), string(src.ID)) {
		t.Errorf("the fork's journal starts with %s %s, want run.forked naming the source", evs[0].Type, evs[0].Data)
	}
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			t.Fatalf("fork journal not gapless at %d", i)
		}
	}
	if n := len(journal(t, st, src.ID)); n != srcEvents {
		t.Errorf("the source's journal changed: %d events, was %d", n, srcEvents)
	}
	replayMatches(t, eng, st, fork.ID)
}

// TestForkWithMessage: a fork of a run that answered, with a message, is
// the next turn of a conversation: its model reads the whole earlier
// exchange and the message, and answers anew (without the message the
// fork ends with the source's answer); max_steps gives the turn room; a
// fork asked for again with the same idempotency key is the same run.
func TestForkWithMessage(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil,
		scripted.CallTool("echo", `{"text":"one"}`),
		scripted.Answer("first answer"),
		scripted.Answer("second answer"),
	)
	st, eng, _ := resumeHarness(t, p)
	ctx := context.Background()
	src, err := eng.Start(ctx, engine.StartRequest{Goal: "first turn", MaxSteps: 2})
	if err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng, st, src.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("source = %s %q", r.Status, r.Error)
	}
	if _, err := eng.Fork(ctx, engine.ForkRequest{From: src.ID, Step: 2, Message: "x", MaxSteps: 2}); !errors.Is(err, keel.ErrInvalid) {
		t.Errorf("Fork with max_steps not above the step = %v, want ErrInvalid", err)
	}
	req := engine.ForkRequest{From: src.ID, Step: 2, Message: "second turn", MaxSteps: 4, IdempotencyKey: "conversation/2"}
	fork, err := eng.Fork(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	r := waitRun(t, eng, st, fork.ID)
	if r.Status != keel.RunSucceeded || r.Result != "second answer" || r.MaxSteps != 4 {
		t.Fatalf("fork = %s %q (max_steps %d), want succeeded with the second answer", r.Status, r.Result, r.MaxSteps)
	}
	reqs := p.Requests()
	if len(reqs) != 3 {
		t.Fatalf("%d model calls, want 3", len(reqs))
	}
	var seen []string
	for _, m := range reqs[2].Messages {
		seen = append(seen, string(m.Role)+": "+m.Content)
	}
	got := strings.Join(seen, "\n")
	if !strings.Contains(got, "first turn") || !strings.Contains(got, "first answer") || !strings.HasSuffix(got, "second turn") {
		t.Errorf("the fork's model saw:\n%s\nwant the first exchange, then the message last", got)
	}
	again, err := eng.Fork(ctx, req)
	if err != nil || again.ID != fork.ID {
		t.Errorf("Fork again with the key = %s, %v; want %s", again.ID, err, fork.ID)
	}
	other := req
	other.From = fork.ID
	if _, err := eng.Fork(ctx, other); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("Fork of another run with the key = %v, want ErrConflict", err)
	}
	replayMatches(t, eng, st, fork.ID)
}
