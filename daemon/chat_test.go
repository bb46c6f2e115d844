package daemon_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
)

// TestModelsChat calls the model layer without a run over the real
// WebSocket: a streamed reply arrives as deltas that add up to the
// result, a structured call is repaired until it fits its schema, and bad
// requests get invalid-params errors.
func TestModelsChat(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil,
		scripted.Answer("a streamed answer in words"),
		scripted.Answer(`{"n": "not a number"}`),
		scripted.Answer(`{"n": 3}`),
	)
	d := startDaemon(t, daemon.Config{Provider: p})
	c := dial(t, d.dir)
	ctx := context.Background()
	user := []protocol.ChatMessage{{Role: "user", Content: "hello"}}

	var streamed strings.Builder
	res, err := c.Chat(ctx, protocol.ModelsChatParams{Messages: user, Model: scripted.DefaultModel.Name}, func(d protocol.ChatDelta) {
		streamed.WriteString(d.Content)
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Message.Content != "a streamed answer in words" || streamed.String() != res.Message.Content || res.Provider != "ollama" {
		t.Errorf("Chat = %+v, streamed %q", res, streamed.String())
	}

	res, err = c.Chat(ctx, protocol.ModelsChatParams{Messages: user, Model: scripted.DefaultModel.Name,
		Format: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`), Repairs: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Message.Content != `{"n": 3}` || res.Attempts != 2 {
		t.Errorf("structured Chat = %q after %d attempts, want the repaired value after 2", res.Message.Content, res.Attempts)
	}
	if req := p.Requests()[2]; !strings.Contains(req.Messages[len(req.Messages)-1].Content, "/n") {
		t.Errorf("the repair request does not name the failing field: %+v", req.Messages)
	}

	_, err = c.Chat(ctx, protocol.ModelsChatParams{}, nil)
	wantCode(t, err, protocol.CodeInvalidParams, "no messages")
	_, err = c.Chat(ctx, protocol.ModelsChatParams{Messages: []protocol.ChatMessage{{Role: "wizard", Content: "x"}}}, nil)
	wantCode(t, err, protocol.CodeInvalidParams, "unknown role")
	_, err = c.Decide(ctx, protocol.RunDecideParams{RunID: "run_none", CallID: "c", Decision: "maybe"})
	wantCode(t, err, protocol.CodeInvalidParams, "unknown decision")
}

// TestResumeWaitsAndDecide: a daemon that finds a run interrupted while a
// tool call of unknown outcome was in flight (its intent journaled, no
// result; the tool is not known to be idempotent) leaves the run waiting
// rather than run the call again, and run.decide releases it.
func TestResumeWaitsAndDecide(t *testing.T) {
	t.Parallel()
	dir := noTools(t)
	call := keel.ToolCall{ID: "c1", Name: "send_invoice", Arguments: json.RawMessage(`{"to":"acme"}`)}
	st, err := store.Open(context.Background(), filepath.Join(dir, "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
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
	st.Close() // the daemon died here: no result, run still "running"

	p := scripted.New(nil, scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
		return models.ChatResponse{Message: models.Message{Content: "model saw " + req.Messages[len(req.Messages)-1].Content}}, nil
	}))
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: p})
	c := dial(t, d.dir)
	waitEvent(t, dir, "run_w", keel.EventRunWaiting)
	detail, err := c.GetRun(ctx, "run_w")
	if err != nil {
		t.Fatal(err)
	}
	if detail.Run.Status != keel.RunWaiting || len(p.Requests()) != 0 {
		t.Fatalf("resumed run = %s after %d model calls, want waiting before any", detail.Run.Status, len(p.Requests()))
	}
	last := detail.Events[len(detail.Events)-1]
	if last.Type != keel.EventRunWaiting || !strings.Contains(string(last.Data), `"c1"`) {
		t.Errorf("last event %s %s, want run.waiting naming call c1", last.Type, last.Data)
	}
	_, err = c.Decide(ctx, protocol.RunDecideParams{RunID: "run_w", CallID: "c2", Decision: keel.DecisionDone})
	wantCode(t, err, protocol.CodeConflict, "decision about another call")
	if out, _, code := runCLI(ctx, dir, "show", "run_w"); code != 0 || !strings.Contains(out, "keel decide run_w c1") {
		t.Errorf("keel show of a waiting run (exit %d) does not say how to decide:\n%s", code, out)
	}
	if _, errOut, code := runCLI(ctx, dir, "decide", "run_w", "c1", "done", "--output", "not json"); code != 2 {
		t.Errorf("keel decide --output 'not json' = exit %d (%s), want 2", code, errOut)
	}
	if out, errOut, code := runCLI(ctx, dir, "decide", "run_w", "c1", "done", "--output", `{"invoice":"sent by hand"}`, "--note", "checked"); code != 0 {
		t.Fatalf("keel decide = exit %d: %s%s", code, out, errOut)
	}
	follow(t, c, "run_w")
	detail, _ = c.GetRun(ctx, "run_w")
	if detail.Run.Status != keel.RunSucceeded || !strings.Contains(detail.Run.Result, "sent by hand") {
		t.Errorf("after the decision: %s %q, want succeeded with the model having seen the human's output", detail.Run.Status, detail.Run.Result)
	}
	audit, err := c.ToolAudit(ctx, "", 0)
	if err != nil || len(audit) != 0 {
		t.Errorf("tool audit = %+v, %v; want no tool run", audit, err)
	}
}

// TestPauseResumeCancelCLI drives run control from the CLI against the
// daemon: keel pause stops a run at its next step boundary, keel resume
// lets it finish, keel cancel of an ended run is refused.
func TestPauseResumeCancelCLI(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	first, called := asked(func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
		<-release
		return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "c1", Name: "wordcount", Arguments: json.RawMessage(`{"text":"a b"}`)}}}}, nil
	})
	p := scripted.New(nil, first, scripted.Answer("counted"))
	d := startDaemon(t, daemon.Config{Provider: p})
	c := dial(t, d.dir)
	ctx := context.Background()
	run := startWaiting(t, c, called, "count")
	if out, errOut, code := runCLI(ctx, d.dir, "pause", string(run.ID)); code != 0 || !strings.Contains(out, "pause requested") {
		t.Fatalf("keel pause = %d: %s%s", code, out, errOut)
	}
	if out, errOut, code := runCLI(ctx, d.dir, "say", string(run.ID), "count", "only", "nouns"); code != 0 {
		t.Fatalf("keel say = %d: %s%s", code, out, errOut)
	}
	close(release)
	status := func() keel.RunStatus {
		det, err := c.GetRun(ctx, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		return det.Run.Status
	}
	waitEvent(t, d.dir, run.ID, keel.EventRunPaused)
	if s := status(); s != keel.RunPaused {
		t.Fatalf("run is %s after run.paused, want paused", s)
	}
	if out, errOut, code := runCLI(ctx, d.dir, "resume", string(run.ID)); code != 0 {
		t.Fatalf("keel resume = %d: %s%s", code, out, errOut)
	}
	follow(t, c, run.ID)
	if s := status(); s != keel.RunSucceeded {
		t.Errorf("after resume: %s, want succeeded", s)
	}
	if _, _, code := runCLI(ctx, d.dir, "cancel", string(run.ID)); code == 0 {
		t.Errorf("keel cancel of a succeeded run exited 0")
	}
	if reqs := p.Requests(); len(reqs) != 2 || !strings.Contains(reqs[1].Messages[len(reqs[1].Messages)-1].Content, "count only nouns") {
		t.Errorf("the model's second request does not end with the person's message: %+v", reqs[len(reqs)-1].Messages)
	}
	// The paused-and-resumed run replays from its journal to the same events.
	requests := len(p.Requests())
	if out, errOut, code := runCLI(ctx, d.dir, "replay", string(run.ID)); code != 0 || !strings.Contains(out, "replay matches the journal") {
		t.Errorf("keel replay = %d:\n%s%s", code, out, errOut)
	}
	if len(p.Requests()) != requests {
		t.Errorf("replay called the model")
	}
}

// TestApprovalCLI: with --require-approval for the tool's side-effect
// class, a run waits before the call; keel approve --edit runs it with the
// edited arguments, which is what the model then sees.
func TestApprovalCLI(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil,
		scripted.CallTools(keel.ToolCall{ID: "c1", Name: "wordcount", Arguments: json.RawMessage(`{"text":"one two three"}`)}),
		scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
			return models.ChatResponse{Message: models.Message{Content: "tool said " + req.Messages[len(req.Messages)-1].Content}}, nil
		}),
	)
	d := startDaemon(t, daemon.Config{DataDir: withTools(t, "wordcount"), Provider: p, RequireApproval: []keel.SideEffect{keel.SideEffectReadOnly}})
	c := dial(t, d.dir)
	ctx := context.Background()
	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "count"})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(t, d.dir, run.ID, keel.EventApprovalAsked)
	if out, _, code := runCLI(ctx, d.dir, "show", string(run.ID)); code != 0 || !strings.Contains(out, "keel approve "+string(run.ID)+" c1") {
		t.Errorf("keel show does not say how to approve:\n%s", out)
	}
	if out, errOut, code := runCLI(ctx, d.dir, "approve", string(run.ID), "c1", "--edit", `{"text":"just two"}`); code != 0 {
		t.Fatalf("keel approve = %d: %s%s", code, out, errOut)
	}
	follow(t, c, run.ID)
	det, _ := c.GetRun(ctx, run.ID)
	if det.Run.Status != keel.RunSucceeded || !strings.Contains(det.Run.Result, `"words":2`) {
		t.Errorf("after approval with an edit: %s %q, want the edited input counted", det.Run.Status, det.Run.Result)
	}
}
