package engine_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
)

// refused checks that err wraps want and that the run's journal still
// has n events: a refused request journals nothing.
func refused(t *testing.T, st *store.Store, id keel.RunID, n int, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: error = %v, want %v", what, err, want)
	}
	if got := len(journal(t, st, id)); got != n {
		t.Errorf("%s: the journal has %d events, want %d (nothing journaled)", what, got, n)
	}
}

// TestDecideRefusals: each way Decide can be wrong gets the error its
// doc comment names, and journals nothing; the run still waits and takes
// a good decision after them.
func TestDecideRefusals(t *testing.T) {
	t.Parallel()
	call := keel.ToolCall{ID: "c1", Name: "write", Arguments: json.RawMessage(`{}`)}
	p := scripted.New(nil, scripted.Answer("after the decision"))
	st, eng, _ := resumeHarness(t, p)
	ctx := context.Background()
	resumeWaiting(t, eng, st, "run_w", call)
	n := len(journal(t, st, "run_w"))
	for _, tt := range []struct {
		name     string
		id       keel.RunID
		callID   string
		decision string
		output   json.RawMessage
		want     error
	}{
		{"unknown decision", "run_w", "c1", "maybe", nil, keel.ErrInvalid},
		{"output not JSON", "run_w", "c1", keel.DecisionDone, json.RawMessage(`{"n":`), keel.ErrInvalid},
		{"unknown run", "run_nope", "c1", keel.DecisionSkip, nil, keel.ErrNotFound},
		{"another call", "run_w", "c9", keel.DecisionSkip, nil, keel.ErrConflict},
	} {
		_, err := eng.Decide(ctx, tt.id, tt.callID, tt.decision, tt.output, "")
		refused(t, st, "run_w", n, "Decide with "+tt.name, err, tt.want)
	}
	if _, err := eng.Decide(ctx, "run_w", "c1", keel.DecisionSkip, nil, ""); err != nil {
		t.Fatalf("Decide(skip) after the refusals: %v", err)
	}
	if r := waitRun(t, eng, st, "run_w"); r.Status != keel.RunSucceeded {
		t.Fatalf("run after the decision = %s %q, want succeeded", r.Status, r.Error)
	}
	n = len(journal(t, st, "run_w"))
	_, err := eng.Decide(ctx, "run_w", "c9", keel.DecisionSkip, nil, "")
	refused(t, st, "run_w", n, "Decide on a finished run", err, keel.ErrConflict)
}

// TestApproveRefusals: edited arguments that are not JSON, an unknown
// run, a call the run does not wait on, and a run that no longer waits
// are refused with their kind, and journal nothing.
func TestApproveRefusals(t *testing.T) {
	t.Parallel()
	args := json.RawMessage(`{"n":1}`)
	sum := sha256.Sum256(args)
	hash := hex.EncodeToString(sum[:])
	p := scripted.New(nil,
		scripted.CallTools(keel.ToolCall{ID: "c1", Name: "write", Arguments: args}),
		scripted.Answer("written"))
	st, eng, tools := resumeHarness(t, p, keel.SideEffectNonIdempotentWrite)
	ctx := context.Background()
	r := startWaiting(t, eng, st)
	n := len(journal(t, st, r.ID))
	for _, tt := range []struct {
		name string
		id   keel.RunID
		d    keel.ApprovalData
		want error
	}{
		{"edited arguments not JSON", r.ID, keel.ApprovalData{CallID: "c1", ArgsSHA256: hash, Approved: true, Arguments: json.RawMessage(`{"n":`)}, keel.ErrInvalid},
		{"an unknown run", "run_nope", keel.ApprovalData{CallID: "c1", ArgsSHA256: hash, Approved: true}, keel.ErrNotFound},
		{"another call", r.ID, keel.ApprovalData{CallID: "c9", ArgsSHA256: hash, Approved: true}, keel.ErrConflict},
	} {
		_, err := eng.Approve(ctx, tt.id, tt.d)
		refused(t, st, r.ID, n, "Approve with "+tt.name, err, tt.want)
	}
	if tools.writes != 0 {
		t.Fatalf("%d writes after refused approvals, want none", tools.writes)
	}
	if _, err := eng.Approve(ctx, r.ID, keel.ApprovalData{CallID: "c1", ArgsSHA256: hash, Approved: true}); err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunSucceeded || tools.writes != 1 {
		t.Fatalf("after the approval: %s with %d writes, want succeeded with 1", got.Status, tools.writes)
	}
	n = len(journal(t, st, r.ID))
	_, err := eng.Approve(ctx, r.ID, keel.ApprovalData{CallID: "c9", ArgsSHA256: hash, Approved: true})
	refused(t, st, r.ID, n, "Approve on a finished run", err, keel.ErrConflict)
}

// TestForkRefusals: a fork of an unknown run, of a run still advancing,
// from a step before the first, or onto a model that is not there is
// refused with its kind, and creates no run.
func TestForkRefusals(t *testing.T) {
	t.Parallel()
	p := scripted.ByGoal(nil, func(goal string) []scripted.Step {
		if goal == "hang" {
			return []scripted.Step{scripted.Block()}
		}
		return []scripted.Step{scripted.Answer("done")}
	})
	st, eng, _ := resumeHarness(t, p)
	ctx := context.Background()
	done, err := eng.Start(ctx, engine.StartRequest{Goal: "answer"})
	if err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng, st, done.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("source = %s, want succeeded", r.Status)
	}
	hang, err := eng.Start(ctx, engine.StartRequest{Goal: "hang"})
	if err != nil {
		t.Fatal(err)
	}
	waitRequests(t, p, 2) // the hanging run is in its model call
	defer eng.Cancel(ctx, hang.ID)

	for _, tt := range []struct {
		name string
		req  engine.ForkRequest
		want error
	}{
		{"an unknown run", engine.ForkRequest{From: "run_nope"}, keel.ErrNotFound},
		{"a running run", engine.ForkRequest{From: hang.ID}, keel.ErrConflict},
		{"a negative step", engine.ForkRequest{From: done.ID, Step: -1}, keel.ErrInvalid},
		{"an unknown model", engine.ForkRequest{From: done.ID, Model: "nosuchmodel"}, keel.ErrModelUnavailable},
	} {
		if _, err := eng.Fork(ctx, tt.req); !errors.Is(err, tt.want) {
			t.Errorf("Fork of %s = %v, want %v", tt.name, err, tt.want)
		}
	}
	if runs, err := st.ListRuns(ctx, 10); err != nil || len(runs) != 2 {
		t.Errorf("runs after the refused forks = %d, %v; want the 2 started", len(runs), err)
	}
}
