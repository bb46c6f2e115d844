package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
)

// eventsOf returns the run's journaled events of type typ.
func eventsOf(t *testing.T, st *store.Store, id keel.RunID, typ keel.EventType) []keel.Event {
	t.Helper()
	var out []keel.Event
	for _, ev := range journal(t, st, id) {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// TestModelRetries: a model step that fails with a transient error is
// tried again as the run's policy allows, each retry journaled and
// traced, and a replay reproduces it; without retries the run fails.
func TestModelRetries(t *testing.T) {
	t.Parallel()
	for _, retries := range []int{0, 2} {
		t.Run(map[int]string{0: "none", 2: "two"}[retries], func(t *testing.T) {
			var calls atomic.Int32
			p := scripted.New(nil, scripted.Repeat(scripted.AnswerFunc(func(models.ChatRequest) (models.ChatResponse, error) {
				if calls.Add(1) <= 2 {
					return models.ChatResponse{}, &models.Error{Kind: models.KindOverloaded, Msg: "busy"}
				}
				return models.ChatResponse{Message: models.Message{Content: "fine"}}, nil
			})))
			st, eng, _ := resumeHarness(t, p)
			ctx := context.Background()
			run, err := eng.Start(ctx, engine.StartRequest{Goal: "g", Policy: keel.RunPolicy{ModelRetries: retries, RetryBackoff: time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			r := waitRun(t, eng, st, run.ID)
			retriesJournaled := eventsOf(t, st, run.ID, keel.EventStepRetry)
			if retries == 0 {
				if r.Status != keel.RunFailed || len(retriesJournaled) != 0 || calls.Load() != 1 {
					t.Fatalf("without retries: %s after %d calls and %d retries; want failed after one call", r.Status, calls.Load(), len(retriesJournaled))
				}
				return
			}
			if r.Status != keel.RunSucceeded || r.Result != "fine" {
				t.Fatalf("run = %s %q (%s), want succeeded", r.Status, r.Result, r.Error)
			}
			if len(retriesJournaled) != 2 {
				t.Fatalf("%d step.retry events, want 2", len(retriesJournaled))
			}
			var d keel.StepRetryData
			_ = json.Unmarshal(retriesJournaled[1].Data, &d)
			if d.Step != 1 || d.Attempt != 3 || !strings.Contains(d.Error, "busy") || d.WaitMS != 2 {
				t.Errorf("second retry = %+v, want step 1 attempt 3 after 2 ms (doubled), naming the error", d)
			}
			spans, _ := st.Spans(ctx, run.ID)
			var retrySpans int
			for _, sp := range spans {
				if sp.Kind == keel.SpanRetry {
					retrySpans++
				}
			}
			if retrySpans != 2 {
				t.Errorf("%d retry spans, want 2", retrySpans)
			}
			replayMatches(t, eng, st, run.ID)
		})
	}
}

// TestToolStepTimeoutAndRetries: a tool call that outlives the step
// timeout fails as timeout; a read-only tool is tried again as the policy
// allows, a non-idempotent one never.
func TestToolStepTimeoutAndRetries(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		tool, args   string
		wantAttempts int
	}{{"slow", `{}`, 3}, {"write", `{"crash":true}`, 1}} {
		t.Run(tt.tool, func(t *testing.T) {
			p := scripted.New(nil, scripted.CallTool(tt.tool, tt.args), scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
				return models.ChatResponse{Message: models.Message{Content: "saw " + req.Messages[len(req.Messages)-1].Content}}, nil
			}))
			st, eng, tools := resumeHarness(t, p)
			ctx := context.Background()
			pol := keel.RunPolicy{StepTimeout: 50 * time.Millisecond, ToolRetries: 2, RetryBackoff: time.Millisecond}
			run, err := eng.Start(ctx, engine.StartRequest{Goal: "g", Policy: pol})
			if err != nil {
				t.Fatal(err)
			}
			r := waitRun(t, eng, st, run.ID)
			if r.Status != keel.RunSucceeded {
				t.Fatalf("run = %s %q", r.Status, r.Error)
			}
			if tools.calls != tt.wantAttempts {
				t.Errorf("tool ran %d times, want %d", tools.calls, tt.wantAttempts)
			}
			if tt.tool == "slow" && !strings.Contains(r.Result, "step timeout") {
				t.Errorf("the model saw %q, want the step timeout named", r.Result)
			}
			if n := len(eventsOf(t, st, run.ID, keel.EventStepRetry)); n != tt.wantAttempts-1 {
				t.Errorf("%d step.retry events, want %d", n, tt.wantAttempts-1)
			}
			if n := len(eventsOf(t, st, run.ID, keel.EventToolCall)); n != 1 {
				t.Errorf("%d tool.call intents, want 1 (retries reuse the intent)", n)
			}
			replayMatches(t, eng, st, run.ID)
		})
	}
}

// TestRunDeadline: a run still going at its deadline fails saying so,
// and a resumed run past its deadline fails at once.
func TestRunDeadline(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil, scripted.CallTool("slow", `{}`), scripted.Answer("never"))
	st, eng, _ := resumeHarness(t, p)
	ctx := context.Background()
	run, err := eng.Start(ctx, engine.StartRequest{Goal: "g", Policy: keel.RunPolicy{Deadline: time.Now().Add(100 * time.Millisecond)}})
	if err != nil {
		t.Fatal(err)
	}
	r := waitRun(t, eng, st, run.ID)
	if r.Status != keel.RunFailed || !strings.Contains(r.Error, "deadline") {
		t.Fatalf("run = %s %q, want failed at its deadline", r.Status, r.Error)
	}

	// A run interrupted while the daemon was down, past its deadline.
	p2 := scripted.New(nil, scripted.Answer("too late"))
	st2, eng2, tools2 := resumeHarness(t, p2)
	now := time.Now()
	if err := st2.CreateRun(ctx, keel.Run{ID: "run_past", Goal: "g", Model: scripted.DefaultModel.Name, Status: keel.RunQueued, MaxSteps: 3,
		Policy: keel.RunPolicy{Deadline: now.Add(-time.Minute)}, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(keel.RunEndData{Status: keel.RunInterrupted})
	if _, err := st2.Append(ctx, "run_past", keel.EventRunInterrupted, now, raw, &keel.RunUpdate{Status: keel.RunInterrupted}); err != nil {
		t.Fatal(err)
	}
	if _, err := eng2.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	r = waitRun(t, eng2, st2, "run_past")
	if r.Status != keel.RunFailed || !strings.Contains(r.Error, "deadline") || len(p2.Requests()) != 0 || tools2.calls != 0 {
		t.Errorf("resumed past its deadline: %s %q, %d model calls; want failed at once, nothing called", r.Status, r.Error, len(p2.Requests()))
	}
}

// TestStartRefusesBadPolicy: out-of-range step limits are refused.
func TestStartRefusesBadPolicy(t *testing.T) {
	t.Parallel()
	_, eng, _ := resumeHarness(t, scripted.New(nil))
	for name, pol := range map[string]keel.RunPolicy{
		"negative timeout": {StepTimeout: -time.Second},
		"too many retries": {ModelRetries: 11},
		"negative retries": {ToolRetries: -1},
		"past deadline":    {Deadline: time.Now().Add(-time.Minute)},
		"negative budget":  {BudgetTokens: -1},
	} {
		if _, err := eng.Start(context.Background(), engine.StartRequest{Goal: "g", Policy: pol}); !errors.Is(err, keel.ErrInvalid) {
			t.Errorf("%s: Start = %v, want ErrInvalid", name, err)
		}
	}
}
