package daemon_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestTakeOverHandBackForkCLI drives take over, a person's tool call,
// hand back and fork from the CLI against the daemon, over the real
// WebSocket and the real wordcount tool.
func TestTakeOverHandBackForkCLI(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	first, called := asked(func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
		<-release
		return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "c1", Name: "wordcount", Arguments: json.RawMessage(`{"text":"a b"}`)}}}}, nil
	})
	p := scripted.New(nil,
		first,
		scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
			var all []string
			for _, m := range req.Messages {
				all = append(all, m.Content)
			}
			return models.ChatResponse{Message: models.Message{Content: "saw: " + strings.Join(all, " | ")}}, nil
		}),
		scripted.Answer("fork done"),
	)
	d := startDaemon(t, daemon.Config{DataDir: withTools(t, "wordcount"), Provider: p})
	c := dial(t, d.dir)
	ctx := context.Background()
	run := startWaiting(t, c, called, "count")
	id := string(run.ID)
	if out, errOut, code := runCLI(ctx, d.dir, "takeover", id, "--note", "checking"); code != 0 || !strings.Contains(out, "taken over") {
		t.Fatalf("keel takeover = %d: %s%s", code, out, errOut)
	}
	close(release)
	waitEvent(t, d.dir, run.ID, keel.EventRunPaused)
	if _, _, code := runCLI(ctx, d.dir, "resume", id); code == 0 {
		t.Error("keel resume of a taken-over run exited 0")
	}
	out, errOut, code := runCLI(ctx, d.dir, "tool", "call", "--run", id, "wordcount", `{"text":"one two three"}`)
	if code != 0 || !strings.Contains(out, `"words": 3`) {
		t.Fatalf("keel tool call --run = %d: %s%s", code, out, errOut)
	}
	if out, errOut, code := runCLI(ctx, d.dir, "handback", id, "I", "counted", "by", "hand"); code != 0 {
		t.Fatalf("keel handback = %d: %s%s", code, out, errOut)
	}
	follow(t, c, run.ID)
	det, _ := c.GetRun(ctx, run.ID)
	if det.Run.Status != keel.RunSucceeded || !strings.Contains(det.Run.Result, "called tool wordcount") || !strings.Contains(det.Run.Result, "I counted by hand") {
		t.Fatalf("after hand back: %s %q; want the model to have read the person's call and note", det.Run.Status, det.Run.Result)
	}
	audit, err := c.ToolAudit(ctx, "wordcount", 0)
	if err != nil || len(audit) != 2 {
		t.Errorf("wordcount audit = %d records, %v; want 2 (the person's call and the model's)", len(audit), err)
	}

	// Fork from step 1: the wordcount result is reused, the model asked once.
	out, errOut, code = runCLI(ctx, d.dir, "fork", id, "--step", "1", "--goal", "count again")
	if code != 0 || !strings.Contains(out, "forked from "+id) {
		t.Fatalf("keel fork = %d: %s%s", code, out, errOut)
	}
	forkID := keel.RunID(strings.Fields(out)[1])
	follow(t, c, forkID)
	fd, _ := c.GetRun(ctx, forkID)
	if fd.Run.Status != keel.RunSucceeded || fd.Run.Result != "fork done" || fd.Run.Goal != "count again" {
		t.Errorf("fork = %s %q goal %q", fd.Run.Status, fd.Run.Result, fd.Run.Goal)
	}
	if audit, _ := c.ToolAudit(ctx, "wordcount", 0); len(audit) != 2 {
		t.Errorf("wordcount ran %d times after the fork, want still 2", len(audit))
	}
	if fd.Events[0].Type != keel.EventRunForked {
		t.Errorf("fork journal starts with %s", fd.Events[0].Type)
	}
}
