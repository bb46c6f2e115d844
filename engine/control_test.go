package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestTakeOverAndHandBack: a person takes over a running run, which
// stops at its next step boundary and cannot be resumed by a plain
// resume; the person runs a tool for it and hands it back with a note;
// the run goes on and the model reads what the person did and said, once.
func TestTakeOverAndHandBack(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	p := scripted.New(nil,
		scripted.ReplyFunc(func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
			<-release
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "c1", Name: "echo", Arguments: json.RawMessage(`{"text":"model"}`)}}}}, nil
		}),
		scripted.Answer("finished"),
	)
	st, eng, tools := resumeHarness(t, p)
	ctx := context.Background()
	r, err := eng.Start(ctx, engine.StartRequest{Goal: "take me over"})
	if err != nil {
		t.Fatal(err)
	}
	waitRequests(t, p, 1)
	if _, err := eng.RunTool(ctx, r.ID, "echo", json.RawMessage(`{"text":"early"}`)); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("RunTool before take over = %v, want ErrConflict", err)
	}
	if _, err := eng.TakeOver(ctx, r.ID, "let me look"); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.TakeOver(ctx, r.ID, ""); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("a second TakeOver = %v, want ErrConflict", err)
	}
	close(release)
	got := waitRun(t, eng, st, r.ID)
	if got.Status != keel.RunPaused || tools.calls != 0 || !strings.Contains(got.Error, "taken over") {
		t.Fatalf("after take over: %s %q with %d tool calls; want paused (taken over) before the tool", got.Status, got.Error, tools.calls)
	}
	if _, err := eng.Unpause(ctx, r.ID); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("Unpause of a taken-over run = %v, want ErrConflict (hand it back)", err)
	}
	if _, err := eng.RunTool(ctx, r.ID, "nosuch", nil); err == nil {
		t.Error("RunTool of an unknown tool succeeded")
	}
	d, err := eng.RunTool(ctx, r.ID, "echo", json.RawMessage(`{"text":"by hand"}`))
	if err != nil || d.Error != nil || !strings.Contains(string(d.Output), "by hand") {
		t.Fatalf("RunTool = %+v, %v", d, err)
	}
	if _, err := eng.HandBack(ctx, r.ID, "use my result"); err != nil {
		t.Fatal(err)
	}
	got = waitRun(t, eng, st, r.ID)
	if got.Status != keel.RunSucceeded || got.Result != "finished" {
		t.Fatalf("after hand back: %s %q (%s)", got.Status, got.Result, got.Error)
	}
	if tools.calls != 2 {
		t.Errorf("tools ran %d times, want 2 (the person's call, then the model's)", tools.calls)
	}
	reqs := p.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d model calls, want 2", len(reqs))
	}
	var saw []string
	for _, m := range reqs[1].Messages {
		saw = append(saw, m.Content)
	}
	all := strings.Join(saw, "\n")
	if !strings.Contains(all, `{"echoed":"by hand"}`) {
		t.Errorf("the model's second request does not show the person's tool result:\n%s", all)
	}
	for _, want := range []string{"called tool echo", "handing the run back to you: use my result"} {
		if strings.Count(all, want) != 1 {
			t.Errorf("the model's second request shows %q %d times, want once:\n%s", want, strings.Count(all, want), all)
		}
	}
	if _, err := eng.HandBack(ctx, r.ID, ""); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("HandBack of a run not taken over = %v, want ErrConflict", err)
	}
	if _, err := eng.TakeOver(ctx, r.ID, ""); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("TakeOver of a finished run = %v, want ErrConflict", err)
	}
	types := map[keel.EventType]int{}
	for _, ev := range journal(t, st, r.ID) {
		types[ev.Type]++
	}
	if types[keel.EventTakeOver] != 1 || types[keel.EventHandBack] != 1 || types[keel.EventHumanTool] != 1 {
		t.Errorf("journal has %v; want one take over, one hand back, one human tool call", types)
	}
	replayMatches(t, eng, st, r.ID)
}
