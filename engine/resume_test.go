package engine_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
)

// interrupted writes the journal a daemon leaves when it dies after the
// model asked for call and (when intent) the tool call's intent was
// journaled, then marks the run interrupted as Recover would.
func interrupted(t *testing.T, st *store.Store, id keel.RunID, call keel.ToolCall, intent bool) {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	if err := st.CreateRun(ctx, keel.Run{ID: id, Goal: "do it", Model: scripted.DefaultModel.Name, Status: keel.RunQueued, MaxSteps: 4, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	app := func(typ keel.EventType, data any, upd *keel.RunUpdate) {
		raw, _ := json.Marshal(data)
		if _, err := st.Append(ctx, id, typ, now, raw, upd); err != nil {
			t.Fatal(err)
		}
	}
	app(keel.EventRunStarted, keel.RunStartedData{Goal: "do it", Model: scripted.DefaultModel.Name, Tools: []string{"echo", "slow", "write"}, MaxSteps: 4},
		&keel.RunUpdate{Status: keel.RunRunning})
	app(keel.EventModelResult, keel.ModelResultData{Step: 1, ToolCalls: []keel.ToolCall{call}}, nil)
	if intent {
		app(keel.EventToolCall, keel.ToolCallData{Step: 1, Call: call}, nil)
	}
	app(keel.EventRunInterrupted, keel.RunEndData{Status: keel.RunInterrupted}, &keel.RunUpdate{Status: keel.RunInterrupted})
}

func resumeHarness(t *testing.T, p *scripted.Provider, approve ...keel.SideEffect) (*store.Store, *engine.Engine, *echoTools) {
	t.Helper()
	tools := &echoTools{}
	st, eng := newEngine(t, engine.Config{Model: p, Tools: tools, RequireApproval: approve})
	return st, eng, tools
}

// resumeWaiting journals run id as interrupted after call's intent (see
// interrupted), resumes it and waits until it waits for a decision.
func resumeWaiting(t *testing.T, eng *engine.Engine, st *store.Store, id keel.RunID, call keel.ToolCall) {
	t.Helper()
	interrupted(t, st, id, call, true)
	if _, err := eng.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng, st, id); r.Status != keel.RunWaiting {
		t.Fatalf("run = %s, want waiting", r.Status)
	}
}

// startWaiting starts a run with the goal "write it" and waits until it
// waits for approval of its write.
func startWaiting(t *testing.T, eng *engine.Engine, st *store.Store) keel.Run {
	t.Helper()
	r, err := eng.Start(context.Background(), engine.StartRequest{Goal: "write it"})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunWaiting {
		t.Fatalf("run = %s, want waiting for approval", got.Status)
	}
	return r
}

// replayMatches replays the finished run id and fails the test when the
// replay's events differ from its journal.
func replayMatches(t *testing.T, eng *engine.Engine, st *store.Store, id keel.RunID) {
	t.Helper()
	replay, err := eng.Replay(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if diff := engine.SameEvents(journal(t, st, id), replay); diff != "" {
		t.Errorf("replay of %s differs: %s", id, diff)
	}
}

func waitRun(t *testing.T, eng *engine.Engine, st *store.Store, id keel.RunID) keel.Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng.Wait(ctx, id); err != nil {
		t.Fatal(err)
	}
	r, err := st.GetRun(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestResumeReusesJournal: a resumed run never asks the model again for
// a step it journaled, and re-runs a read-only call whose outcome was
// not journaled, or a call that never started.
func TestResumeReusesJournal(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		call   keel.ToolCall
		intent bool
	}{
		{"read-only call, intent journaled", keel.ToolCall{ID: "c1", Name: "echo", Arguments: json.RawMessage(`{"text":"hi"}`)}, true},
		{"non-idempotent call never started", keel.ToolCall{ID: "c1", Name: "write", Arguments: json.RawMessage(`{}`)}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := scripted.New(nil, scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
				last := req.Messages[len(req.Messages)-1]
				return models.ChatResponse{Message: models.Message{Content: "after " + last.Content}}, nil
			}))
			st, eng, tools := resumeHarness(t, p)
			interrupted(t, st, "run_r", tt.call, tt.intent)
			if n, err := eng.Resume(context.Background()); err != nil || n != 1 {
				t.Fatalf("Resume = %d, %v", n, err)
			}
			r := waitRun(t, eng, st, "run_r")
			if r.Status != keel.RunSucceeded {
				t.Fatalf("resumed run = %s %q, want succeeded", r.Status, r.Error)
			}
			if n := len(p.Requests()); n != 1 {
				t.Errorf("model asked %d times on resume, want once (step 1 was journaled)", n)
			}
			if tools.calls != 1 {
				t.Errorf("tool ran %d times on resume, want once", tools.calls)
			}
			req := p.Requests()[0]
			if len(req.Messages) != 4 || req.Messages[2].ToolCalls[0].ID != "c1" || req.Messages[3].ToolCallID != "c1" {
				t.Errorf("resumed context = %+v, want system, goal, the journaled call, its result", req.Messages)
			}
			evs := journal(t, st, "run_r")
			for i, ev := range evs {
				if ev.Seq != int64(i+1) {
					t.Fatalf("journal seqs %v not gapless", evs)
				}
			}
			if !strings.Contains(string(evs[len(evs)-1].Data), "after") {
				t.Errorf("final event %s", evs[len(evs)-1].Data)
			}
		})
	}
}

// TestResumeWaitsForHumanOnUnknownSideEffect: a non-idempotent call whose
// intent was journaled but whose result was not is never run again by
// itself; the run waits, and the human's decision releases it.
func TestResumeWaitsForHumanOnUnknownSideEffect(t *testing.T) {
	t.Parallel()
	call := keel.ToolCall{ID: "c1", Name: "write", Arguments: json.RawMessage(`{}`)}
	for _, tt := range []struct {
		decision   string
		wantWrites int
		wantInCtx  string
	}{
		{keel.DecisionSkip, 0, `"skipped"`},
		{keel.DecisionDone, 0, `"confirmed_by":"human"`},
		{keel.DecisionRetry, 1, `"written":{}`},
	} {
		t.Run(tt.decision, func(t *testing.T) {
			p := scripted.New(nil, scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
				return models.ChatResponse{Message: models.Message{Content: "model saw: " + req.Messages[len(req.Messages)-1].Content}}, nil
			}))
			st, eng, tools := resumeHarness(t, p)
			interrupted(t, st, "run_w", call, true)
			if _, err := eng.Resume(context.Background()); err != nil {
				t.Fatal(err)
			}
			r := waitRun(t, eng, st, "run_w")
			if r.Status != keel.RunWaiting || tools.writes != 0 || len(p.Requests()) != 0 {
				t.Fatalf("run = %s, %d writes, %d model calls; want waiting, nothing run", r.Status, tools.writes, len(p.Requests()))
			}
			if _, err := eng.Decide(context.Background(), "run_w", "other", tt.decision, nil, ""); err == nil {
				t.Errorf("Decide(wrong call) succeeded")
			}
			if _, err := eng.Decide(context.Background(), "run_w", "c1", tt.decision, nil, "checked by hand"); err != nil {
				t.Fatal(err)
			}
			r = waitRun(t, eng, st, "run_w")
			if r.Status != keel.RunSucceeded || tools.writes != tt.wantWrites || !strings.Contains(r.Result, tt.wantInCtx) {
				t.Errorf("after %s: %s %q with %d writes; want succeeded, %d writes, result showing %s", tt.decision, r.Status, r.Result, tools.writes, tt.wantWrites, tt.wantInCtx)
			}
			if _, err := eng.Decide(context.Background(), "run_w", "c1", tt.decision, nil, ""); err == nil {
				t.Errorf("a second Decide succeeded on an ended run")
			}
		})
	}
}

// TestResumeAfterDecisionBeforeGoingOn: the daemon died after journaling
// a human's decision but before the run went on. The run is still
// waiting, and Decide would refuse a second decision, so the next start
// must go on by itself, once.
func TestResumeAfterDecisionBeforeGoingOn(t *testing.T) {
	t.Parallel()
	call := keel.ToolCall{ID: "c1", Name: "write", Arguments: json.RawMessage(`{}`)}
	p := scripted.New(nil, scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
		return models.ChatResponse{Message: models.Message{Content: "model saw: " + req.Messages[len(req.Messages)-1].Content}}, nil
	}))
	st, eng, tools := resumeHarness(t, p)
	ctx := context.Background()
	resumeWaiting(t, eng, st, "run_d", call)
	// The decision as Decide journals it, without the going on.
	raw, _ := json.Marshal(keel.HumanDecisionData{CallID: "c1", Decision: keel.DecisionRetry})
	if _, err := st.Append(ctx, "run_d", keel.EventHumanDecision, time.Now(), raw, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Decide(ctx, "run_d", "c1", keel.DecisionRetry, nil, ""); err == nil {
		t.Fatal("a second decision on the same call was accepted")
	}
	n, err := eng.Resume(ctx)
	if err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v; want the decided run resumed", n, err)
	}
	r := waitRun(t, eng, st, "run_d")
	if r.Status != keel.RunSucceeded || tools.writes != 1 {
		t.Fatalf("after resume: %s with %d writes; want succeeded with the retried write once", r.Status, tools.writes)
	}
	if n, err := eng.Resume(ctx); err != nil || n != 0 {
		t.Errorf("a second Resume = %d, %v; want nothing to resume", n, err)
	}
}

// TestStartIdempotencyKey: retried starts with one key, even concurrent,
// make one run; the key with another goal is a conflict.
func TestStartIdempotencyKey(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil, scripted.Repeat(scripted.Answer("ok")))
	st, eng, _ := resumeHarness(t, p)
	ctx := context.Background()
	ids := make(chan keel.RunID, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			r, err := eng.Start(ctx, engine.StartRequest{Goal: "once", IdempotencyKey: "k-1"})
			if err != nil {
				t.Error(err)
				return
			}
			ids <- r.ID
		})
	}
	wg.Wait()
	close(ids)
	var first keel.RunID
	for id := range ids {
		if first == "" {
			first = id
		}
		if id != first {
			t.Errorf("starts with one key made runs %s and %s", first, id)
		}
	}
	waitRun(t, eng, st, first)
	runs, _ := st.ListRuns(ctx, 100)
	if len(runs) != 1 {
		t.Errorf("%d runs stored, want 1", len(runs))
	}
	if _, err := eng.Start(ctx, engine.StartRequest{Goal: "something else", IdempotencyKey: "k-1"}); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("the key with another goal = %v, want ErrConflict", err)
	}
	if r, err := eng.Start(ctx, engine.StartRequest{Goal: "other", IdempotencyKey: "k-2"}); err != nil || r.ID == first {
		t.Errorf("a new key = %v, %v; want a new run", r.ID, err)
	}
}

// TestPauseAtStepBoundary: a pause asked during a model call takes effect
// once the call is journaled, before the tool runs; the paused run stays
// paused until Unpause, then goes on from its journal without asking the
// model again for that step.
func TestPauseAtStepBoundary(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	p := scripted.New(nil,
		scripted.ReplyFunc(func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
			<-release
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "c1", Name: "echo", Arguments: json.RawMessage(`{"text":"x"}`)}}}}, nil
		}),
		scripted.Answer("finished"),
		scripted.Block(),
	)
	st, eng, tools := resumeHarness(t, p)
	ctx := context.Background()
	r, err := eng.Start(ctx, engine.StartRequest{Goal: "pausable"})
	if err != nil {
		t.Fatal(err)
	}
	waitRequests(t, p, 1)
	if _, err := eng.Pause(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	close(release)
	got := waitRun(t, eng, st, r.ID)
	if got.Status != keel.RunPaused || tools.calls != 0 {
		t.Fatalf("after pause: %s with %d tool calls, want paused before the tool", got.Status, tools.calls)
	}
	if _, err := eng.Pause(ctx, r.ID); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("Pause(paused) = %v, want ErrConflict", err)
	}
	if _, err := eng.Unpause(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	got = waitRun(t, eng, st, r.ID)
	if got.Status != keel.RunSucceeded || got.Result != "finished" || tools.calls != 1 || len(p.Requests()) != 2 {
		t.Errorf("after unpause: %s %q, %d tool calls, %d model calls; want succeeded, 1, 2", got.Status, got.Result, tools.calls, len(p.Requests()))
	}
	if _, err := eng.Unpause(ctx, r.ID); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("Unpause(succeeded) = %v, want ErrConflict", err)
	}

	// A paused run can be cancelled for good.
	r2, _ := eng.Start(ctx, engine.StartRequest{Goal: "another"})
	waitRequests(t, p, 3)
	eng.Pause(ctx, r2.ID)
	eng.Cancel(ctx, r2.ID) // the blocked model call ends by the cancel
	if got := waitRun(t, eng, st, r2.ID); got.Status != keel.RunCancelled {
		t.Errorf("cancelled while pausing: %s", got.Status)
	}
}

// TestReplayReproducesEvents: replaying finished runs from their journals
// gives the same events without calling the model or a tool — a run with
// a tool call and a tool error, and a run resumed after an interruption.
func TestReplayReproducesEvents(t *testing.T) {
	t.Parallel()
	p := scripted.ByGoal(nil, func(goal string) []scripted.Step {
		return []scripted.Step{
			scripted.CallTool("echo", `{"text":"one"}`),
			scripted.CallTool("echo", `{"wrong":true}`),
			scripted.Answer("done with " + goal),
		}
	})
	st, eng, tools := resumeHarness(t, p)
	ctx := context.Background()
	r, err := eng.Start(ctx, engine.StartRequest{Goal: "g1"})
	if err != nil {
		t.Fatal(err)
	}
	waitRun(t, eng, st, r.ID)
	interrupted(t, st, "run_i", keel.ToolCall{ID: "c1", Name: "echo", Arguments: json.RawMessage(`{"text":"hi"}`)}, true)
	if _, err := eng.Replay(ctx, "run_i"); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("Replay(unfinished) = %v, want ErrConflict", err)
	}
	if _, err := eng.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, "run_i"); got.Status != keel.RunSucceeded {
		t.Fatalf("resumed run: %s %q", got.Status, got.Error)
	}
	for _, id := range []keel.RunID{r.ID, "run_i"} {
		journal := journal(t, st, id)
		calls, requests := tools.calls, len(p.Requests())
		replay, err := eng.Replay(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if diff := engine.SameEvents(journal, replay); diff != "" {
			t.Errorf("replay of %s differs: %s", id, diff)
		}
		if tools.calls != calls || len(p.Requests()) != requests {
			t.Errorf("replay called %d tools and %d models", tools.calls-calls, len(p.Requests())-requests)
		}
	}
	// A different journal must not pass: SameEvents can fail.
	j := journal(t, st, r.ID)
	tampered := append([]keel.Event(nil), j...)
	tampered[len(tampered)-1].Data = json.RawMessage(`{"status":"succeeded","result":"something else"}`)
	if engine.SameEvents(j, tampered) == "" {
		t.Error("SameEvents found no difference in a tampered replay")
	}
}

// TestApprovalBoundToPayload: a call whose side-effect class needs
// approval waits; an approval naming another payload's hash is refused;
// approve runs it (with edited arguments when given), deny gives the model
// the reason; the wait is a span of its own.
func TestApprovalBoundToPayload(t *testing.T) {
	t.Parallel()
	args := json.RawMessage(`{"n":1}`)
	sum := sha256.Sum256(args)
	hash := hex.EncodeToString(sum[:])
	for _, tt := range []struct {
		name       string
		decision   keel.ApprovalData
		wantWrites int
		wantSeen   string
	}{
		{"approve", keel.ApprovalData{CallID: "c1", ArgsSHA256: hash, Approved: true}, 1, `"written":{"n":1}`},
		{"edit", keel.ApprovalData{CallID: "c1", ArgsSHA256: hash, Approved: true, Arguments: json.RawMessage(`{"n":2}`)}, 1, `"written":{"n":2}`},
		{"deny", keel.ApprovalData{CallID: "c1", ArgsSHA256: hash, Reason: "not on a Friday"}, 0, "not on a Friday"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := scripted.New(nil,
				scripted.CallTools(keel.ToolCall{ID: "c1", Name: "write", Arguments: args}),
				scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
					return models.ChatResponse{Message: models.Message{Content: "saw " + req.Messages[len(req.Messages)-1].Content}}, nil
				}))
			st, eng, tools := resumeHarness(t, p, keel.SideEffectNonIdempotentWrite)
			ctx := context.Background()
			r, err := eng.Start(ctx, engine.StartRequest{Goal: "write it"})
			if err != nil {
				t.Fatal(err)
			}
			if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunWaiting || tools.writes != 0 {
				t.Fatalf("run = %s with %d writes, want waiting for approval before any", got.Status, tools.writes)
			}
			other := tt.decision
			other.ArgsSHA256 = strings.Repeat("0", 64)
			if _, err := eng.Approve(ctx, r.ID, other); !errors.Is(err, keel.ErrConflict) {
				t.Errorf("approval of another payload = %v, want ErrConflict", err)
			}
			if _, err := eng.Approve(ctx, r.ID, tt.decision); err != nil {
				t.Fatal(err)
			}
			got := waitRun(t, eng, st, r.ID)
			if got.Status != keel.RunSucceeded || tools.writes != tt.wantWrites || !strings.Contains(got.Result, tt.wantSeen) {
				t.Errorf("after %s: %s %q, %d writes; want succeeded, %d writes, the model seeing %s", tt.name, got.Status, got.Result, tools.writes, tt.wantWrites, tt.wantSeen)
			}
			spans, _ := st.Spans(ctx, r.ID)
			human := 0
			for _, sp := range spans {
				if sp.Kind == keel.SpanHuman && sp.Status != keel.SpanRunning {
					human++
				}
			}
			if human != 1 {
				t.Errorf("spans %+v: want one closed human.wait span", spans)
			}
		})
	}
}

// TestSayReachesTheModel: a message said while the model works reaches
// it at the next step, once; one said to a paused run reaches it when
// the run goes on (read back from the journal).
func TestSayReachesTheModel(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	p := scripted.New(nil,
		scripted.ReplyFunc(func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
			<-release
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "c1", Name: "echo", Arguments: json.RawMessage(`{"text":"x"}`)}}}}, nil
		}),
		scripted.CallTool("echo", `{"text":"y"}`),
		scripted.Answer("done"),
	)
	st, eng, _ := resumeHarness(t, p)
	ctx := context.Background()
	r, err := eng.Start(ctx, engine.StartRequest{Goal: "listen"})
	if err != nil {
		t.Fatal(err)
	}
	waitRequests(t, p, 1)
	if _, err := eng.Say(ctx, r.ID, "use the short form"); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Pause(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	close(release)
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunPaused {
		t.Fatalf("run %s, want paused", got.Status)
	}
	if _, err := eng.Say(ctx, r.ID, "and be brief"); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Unpause(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunSucceeded {
		t.Fatalf("run %s %q, want succeeded", got.Status, got.Error)
	}
	count := func(req models.ChatRequest, s string) int {
		n := 0
		for _, m := range req.Messages {
			if m.Role == models.RoleUser && strings.Contains(m.Content, s) {
				n++
			}
		}
		return n
	}
	reqs := p.Requests()
	if len(reqs) != 3 || count(reqs[1], "short form") != 1 || count(reqs[1], "brief") != 1 || count(reqs[2], "short form") != 1 {
		t.Errorf("the model did not read each message exactly once from step 2 on: %+v", reqs[1:])
	}
	if count(reqs[0], "short form") != 0 {
		t.Errorf("a message reached a model call already in flight")
	}
	if _, err := eng.Say(ctx, r.ID, "too late"); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("Say(ended run) = %v, want ErrConflict", err)
	}
	// The replay still matches: a person's words are input, like results.
	replayMatches(t, eng, st, r.ID)
}

// TestToolSubset: a run whose policy names a subset of tools offers the
// model only those, and a call to any other fails with permission_denied
// without running.
func TestToolSubset(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil, scripted.CallTool("write", `{}`), scripted.Answer("done"))
	st, eng, tools := resumeHarness(t, p)
	run, err := eng.Start(context.Background(), engine.StartRequest{Goal: "write it", Policy: keel.RunPolicy{Tools: []string{"echo"}}})
	if err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng, st, run.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	if tools.writes != 0 {
		t.Errorf("the write tool ran %d times outside the run's subset", tools.writes)
	}
	reqs := p.Requests()
	if len(reqs[0].Tools) != 1 || reqs[0].Tools[0].Name != "echo" {
		t.Errorf("the model was offered %v, want only echo", reqs[0].Tools)
	}
	last := reqs[1].Messages[len(reqs[1].Messages)-1]
	if !strings.Contains(last.Content, string(keel.ToolPermissionDenied)) {
		t.Errorf("the model saw %q, want a permission_denied result", last.Content)
	}
}

// TestRetryDecisionIsUsedOnce: a human's "retry" releases one more
// attempt of a non-idempotent call. If the daemon dies during that
// attempt, its outcome is unknown again: the run waits for a new
// decision instead of running the call a third time by itself.
func TestRetryDecisionIsUsedOnce(t *testing.T) {
	t.Parallel()
	call := keel.ToolCall{ID: "c1", Name: "write", Arguments: json.RawMessage(`{}`)}
	p := scripted.New(nil, scripted.Answer("done"))
	st, eng, tools := resumeHarness(t, p)
	ctx := context.Background()
	interrupted(t, st, "run_rr", call, true)
	app := func(typ keel.EventType, data any, upd *keel.RunUpdate) {
		raw, _ := json.Marshal(data)
		if _, err := st.Append(ctx, "run_rr", typ, time.Now(), raw, upd); err != nil {
			t.Fatal(err)
		}
	}
	// What the journal holds when the retried attempt was cut short:
	// waiting, the decision, the attempt's intent, the crash.
	app(keel.EventRunWaiting, keel.RunWaitingData{Reason: "unknown", Call: &call}, &keel.RunUpdate{Status: keel.RunWaiting})
	app(keel.EventHumanDecision, keel.HumanDecisionData{CallID: "c1", Decision: keel.DecisionRetry}, nil)
	app(keel.EventRunResumed, keel.RunResumedData{}, &keel.RunUpdate{Status: keel.RunRunning})
	app(keel.EventToolCall, keel.ToolCallData{Step: 1, Call: call}, nil)
	app(keel.EventRunInterrupted, keel.RunEndData{Status: keel.RunInterrupted}, &keel.RunUpdate{Status: keel.RunInterrupted})
	if _, err := eng.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	r := waitRun(t, eng, st, "run_rr")
	if r.Status != keel.RunWaiting || tools.writes != 0 {
		t.Fatalf("after a crash during the retried attempt: %s with %d writes; want waiting, nothing run", r.Status, tools.writes)
	}
	if _, err := eng.Decide(ctx, "run_rr", "c1", keel.DecisionDone, nil, "it went through"); err != nil {
		t.Fatalf("a new decision is refused: %v", err)
	}
	if r := waitRun(t, eng, st, "run_rr"); r.Status != keel.RunSucceeded || tools.writes != 0 {
		t.Errorf("after done: %s with %d writes", r.Status, tools.writes)
	}
}

// TestResumedBudgetCountsJournaledUsage: what a resumed run already spent
// is read from the journal's model results, not only from trace spans,
// which are written lazily and may be lost in a crash. A run whose
// journaled step used its whole budget, with no span left, is refused
// its next model call on resume.
func TestResumedBudgetCountsJournaledUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	local := scripted.New(nil, scripted.Answer("too late"))
	r, err := models.NewRouter(models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: local}}})
	if err != nil {
		t.Fatal(err)
	}
	st := openStore(t)
	eng, err := engine.New(engine.Config{Store: st, Model: r, Tools: &echoTools{}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	now := time.Now()
	model := "local/" + scripted.DefaultModel.Name
	if err := st.CreateRun(ctx, keel.Run{ID: "run_b", Goal: "spend", Model: model, Status: keel.RunQueued, MaxSteps: 4, CreatedAt: now, UpdatedAt: now,
		Policy: keel.RunPolicy{BudgetTokens: 5000}}); err != nil {
		t.Fatal(err)
	}
	call := keel.ToolCall{ID: "c1", Name: "echo", Arguments: json.RawMessage(`{"text":"hi"}`)}
	for _, ev := range []struct {
		typ  keel.EventType
		data any
		upd  *keel.RunUpdate
	}{
		{keel.EventRunStarted, keel.RunStartedData{Goal: "spend", Model: model, MaxSteps: 4}, &keel.RunUpdate{Status: keel.RunRunning}},
		{keel.EventModelResult, keel.ModelResultData{Step: 1, ToolCalls: []keel.ToolCall{call}, PromptTokens: 4000, CompletionTokens: 1000}, nil},
		{keel.EventToolCall, keel.ToolCallData{Step: 1, Call: call}, nil},
		{keel.EventToolResult, keel.ToolResultData{Step: 1, CallID: "c1", Name: "echo", Output: json.RawMessage(`{"text":"hi"}`)}, nil},
		{keel.EventRunInterrupted, keel.RunEndData{Status: keel.RunInterrupted}, &keel.RunUpdate{Status: keel.RunInterrupted}},
	} {
		raw, _ := json.Marshal(ev.data)
		if _, err := st.Append(ctx, "run_b", ev.typ, now, raw, ev.upd); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := eng.Resume(ctx); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v", n, err)
	}
	run := waitRun(t, eng, st, "run_b")
	if run.Status != keel.RunFailed || !strings.Contains(run.Error, "budget") {
		t.Errorf("resumed run = %s %q, want failed naming the budget its journaled step used up", run.Status, run.Error)
	}
	if n := len(local.Requests()); n != 0 {
		t.Errorf("the model was asked %d times, want none", n)
	}
}

// TestReplayOfCancelledRun: a run cancelled while its model call or its
// tool call was in flight has no result for that call; its replay is
// cancelled there as the run was, and equals its journal (it failed with
// "the journal has no model result" before).
func TestReplayOfCancelledRun(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		steps []scripted.Step
		tool  bool // cancelled in the tool call, not the model call
	}{
		{"in a model call", []scripted.Step{scripted.CallTool("echo", `{"text":"one"}`), scripted.Block()}, false},
		{"in a tool call", []scripted.Step{scripted.CallTool("echo", `{"text":"one"}`), scripted.CallTool("slow", `{}`)}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := scripted.New(nil, tt.steps...)
			tools := &echoTools{slowEntered: make(chan struct{}, 1)}
			st, eng := newEngine(t, engine.Config{Model: p, Tools: tools})
			ctx := context.Background()
			r, err := eng.Start(ctx, engine.StartRequest{Goal: "g"})
			if err != nil {
				t.Fatal(err)
			}
			if tt.tool {
				<-tools.slowEntered
			} else {
				waitRequests(t, p, 2)
			}
			if _, err := eng.Cancel(ctx, r.ID); err != nil {
				t.Fatal(err)
			}
			if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunCancelled {
				t.Fatalf("run = %s %q, want cancelled", got.Status, got.Error)
			}
			replay, err := eng.Replay(ctx, r.ID)
			if err != nil {
				t.Fatal(err)
			}
			if diff := engine.SameEvents(journal(t, st, r.ID), replay); diff != "" {
				t.Errorf("replay differs: %s", diff)
			}
		})
	}
}
