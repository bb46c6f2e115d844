package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestConcurrentDecisionsOneWins: several people decide one wait at
// once, each differently; exactly one decision is journaled and acted on,
// and every other caller gets a *keel.AlreadyDecidedError naming it, with
// nothing journaled for them (issue 13, item 11: two decisions were
// journaled for one wait, and a stale retry journaled after the retried
// call's intent could run a non-idempotent call again after a crash).
func TestConcurrentDecisionsOneWins(t *testing.T) {
	t.Parallel()
	call := keel.ToolCall{ID: "c1", Name: "write", Arguments: json.RawMessage(`{}`)}
	p := scripted.New(nil, scripted.Repeat(scripted.Answer("after the decision")))
	st, eng, tools := resumeHarness(t, p)
	ctx := context.Background()
	resumeWaiting(t, eng, st, "run_race", call)

	decisions := []string{keel.DecisionRetry, keel.DecisionSkip, keel.DecisionDone}
	const people = 12
	errs := make([]error, people)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range people {
		wg.Go(func() {
			<-start
			_, errs[i] = eng.Decide(ctx, "run_race", "c1", decisions[i%len(decisions)], nil, "")
		})
	}
	close(start)
	wg.Wait()

	winner := -1
	for i, err := range errs {
		if err == nil {
			if winner >= 0 {
				t.Errorf("Decide by person %d and %d both succeeded", winner, i)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatalf("no Decide succeeded: %v", errs)
	}
	won := decisions[winner%len(decisions)]
	var journaled []keel.HumanDecisionData
	var wonSeq int64
	for _, ev := range journal(t, st, "run_race") {
		if ev.Type == keel.EventHumanDecision {
			var d keel.HumanDecisionData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatal(err)
			}
			journaled, wonSeq = append(journaled, d), ev.Seq
		}
	}
	if len(journaled) != 1 || journaled[0].Decision != won {
		t.Fatalf("journaled decisions %+v, want exactly the winner's %s", journaled, won)
	}
	for i, err := range errs {
		if i == winner {
			continue
		}
		var ad *keel.AlreadyDecidedError
		if !errors.As(err, &ad) || !errors.Is(err, keel.ErrConflict) {
			t.Errorf("Decide by person %d = %v, want a *keel.AlreadyDecidedError wrapping keel.ErrConflict", i, err)
			continue
		}
		if ad.Decision != won || ad.Seq != wonSeq || ad.CallID != "c1" {
			t.Errorf("Decide by person %d = %+v, want already decided %s by event %d", i, ad, won, wonSeq)
		}
	}
	r := waitRun(t, eng, st, "run_race")
	if r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q, want succeeded", r.Status, r.Error)
	}
	if want := map[string]int{keel.DecisionRetry: 1}[won]; tools.writes != want {
		t.Errorf("write ran %d times after the decision %s, want %d", tools.writes, won, want)
	}
	// A decision after the run went on is refused the same way.
	var ad *keel.AlreadyDecidedError
	if _, err := eng.Decide(ctx, "run_race", "c1", keel.DecisionSkip, nil, ""); !errors.As(err, &ad) || ad.Decision != won {
		t.Errorf("a late Decide = %v, want already decided %s", err, won)
	}
}

// TestDecideWhileWaitingLoopEnds: a decision that comes while the loop
// that journaled the wait is still on its way out lets the run go on
// (it used to fail with "already running" although it was journaled,
// leaving the run waiting on a decision nothing acted on).
func TestDecideWhileWaitingLoopEnds(t *testing.T) {
	t.Parallel()
	call := keel.ToolCall{ID: "c1", Name: "write", Arguments: json.RawMessage(`{}`)}
	p := scripted.New(nil, scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
		return models.ChatResponse{Message: models.Message{Content: "saw " + req.Messages[len(req.Messages)-1].Content}}, nil
	}))
	st, eng, tools := resumeHarness(t, p)
	ctx := context.Background()
	interrupted(t, st, "run_quick", call, true)
	var once sync.Once
	var decideErr error
	decided, ended := make(chan struct{}), make(chan keel.EventType, 1)
	// Subscribers run on the goroutine that published, here the loop
	// that journaled run.waiting, before that loop ends.
	defer eng.Subscribe(func(ev keel.Event) {
		if ev.RunID != "run_quick" {
			return
		}
		switch ev.Type {
		case keel.EventRunWaiting:
			once.Do(func() {
				_, decideErr = eng.Decide(ctx, "run_quick", "c1", keel.DecisionRetry, nil, "")
				close(decided)
			})
		case keel.EventRunSucceeded, keel.EventRunFailed, keel.EventRunCancelled:
			ended <- ev.Type
		}
	})()
	if _, err := eng.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	<-decided
	if decideErr != nil {
		t.Fatalf("Decide while the waiting loop ends = %v, want nil", decideErr)
	}
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the decided run did not go on")
	}
	r := waitRun(t, eng, st, "run_quick")
	if r.Status != keel.RunSucceeded || tools.writes != 1 {
		t.Fatalf("run = %s %q with %d writes, want succeeded after one retried write", r.Status, r.Error, tools.writes)
	}
}

// TestConcurrentApprovalsOneWins: several people approve or deny one
// call at once; exactly one answer is journaled and acted on, the others
// get a *keel.AlreadyDecidedError naming it.
func TestConcurrentApprovalsOneWins(t *testing.T) {
	t.Parallel()
	args := json.RawMessage(`{"n":1}`)
	p := scripted.New(nil,
		scripted.CallTools(keel.ToolCall{ID: "c1", Name: "write", Arguments: args}),
		scripted.Repeat(scripted.Answer("after the answer")))
	st, eng, tools := resumeHarness(t, p, keel.SideEffectNonIdempotentWrite)
	ctx := context.Background()
	r := startWaiting(t, eng, st)
	var asked keel.ApprovalRequestData
	for _, ev := range journal(t, st, r.ID) {
		if ev.Type == keel.EventApprovalAsked {
			if err := json.Unmarshal(ev.Data, &asked); err != nil {
				t.Fatal(err)
			}
		}
	}
	const people = 8
	errs := make([]error, people)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range people {
		wg.Go(func() {
			<-start
			_, errs[i] = eng.Approve(ctx, r.ID, keel.ApprovalData{CallID: "c1", ArgsSHA256: asked.ArgsSHA256, Approved: i%2 == 0, Reason: "no"})
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		if err == nil {
			if winner >= 0 {
				t.Fatalf("Approve by person %d and %d both succeeded", winner, i)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatalf("no Approve succeeded: %v", errs)
	}
	want := map[bool]string{true: "approved", false: "denied"}[winner%2 == 0]
	var answers int
	for _, ev := range journal(t, st, r.ID) {
		if ev.Type == keel.EventApproval {
			answers++
		}
	}
	if answers != 1 {
		t.Fatalf("journal has %d approval decisions, want 1", answers)
	}
	for i, err := range errs {
		var ad *keel.AlreadyDecidedError
		if i != winner && (!errors.As(err, &ad) || ad.Decision != want) {
			t.Errorf("Approve by person %d = %v, want already decided: %s", i, err, want)
		}
	}
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q, want succeeded", got.Status, got.Error)
	}
	if w := map[string]int{"approved": 1}[want]; tools.writes != w {
		t.Errorf("write ran %d times after %s, want %d", tools.writes, want, w)
	}
}
