package engine

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/keel-runtime/keel"
)

// spendingStore is a Store whose runs spend between two reads: a run in
// spendsAt shows what it spent (a model.result of that many tokens) from
// its second read of events on, as a sub-agent does whose model call ends
// while its parent computes a sibling's budget. Only what childPolicy
// reads is served.
type spendingStore struct {
	Store
	runs     map[keel.RunID]keel.Run
	spendsAt map[keel.RunID]int

	mu    sync.Mutex
	reads map[keel.RunID]int
}

func (s *spendingStore) GetRun(_ context.Context, id keel.RunID) (keel.Run, error) {
	r, ok := s.runs[id]
	if !ok {
		return keel.Run{}, keel.ErrNotFound
	}
	return r, nil
}

func (s *spendingStore) Spans(context.Context, keel.RunID) ([]keel.Span, error) { return nil, nil }

func (s *spendingStore) Events(_ context.Context, id keel.RunID, _ int64) ([]keel.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads[id]++
	tokens, ok := s.spendsAt[id]
	if !ok || s.reads[id] < 2 {
		return nil, nil
	}
	data, _ := json.Marshal(keel.ModelResultData{Step: 1, PromptTokens: tokens})
	return []keel.Event{{RunID: id, Seq: 1, Type: keel.EventModelResult, Data: data}}, nil
}

// TestBudgetOfASiblingIsReadOnce: a step that starts beside a running
// sub-agent holding all of the parent's budget waits, also when that
// sub-agent spends while the step's budget is computed. Its spending was
// read twice, for what the run spent and for what the sub-agent still
// holds: read as nothing, then as 37 tokens, the 37 were in neither, and
// the step started with a share of them (18 tokens), more than the parent
// had left. (TestDAGSubAgentsShareTheBudget/held failed so under load.)
func TestBudgetOfASiblingIsReadOnce(t *testing.T) {
	t.Parallel()
	parent, big := keel.RunID("run_p"), keel.RunID("run_p.big.1")
	st := &spendingStore{
		runs:     map[keel.RunID]keel.Run{big: {ID: big, Status: keel.RunRunning, Policy: keel.RunPolicy{BudgetTokens: 900}}},
		spendsAt: map[keel.RunID]int{big: 37},
		reads:    map[keel.RunID]int{},
	}
	rec := &recording{}
	e, err := New(Config{Store: st, Model: rec, Tools: rec})
	if err != nil {
		t.Fatal(err)
	}
	f := &flowRun{e: e, run: keel.Run{ID: parent, Kind: keel.KindDAG, Policy: keel.RunPolicy{BudgetTokens: 900}}, st: newFlowState()}
	f.st.running["big"] = keel.StepData{StepID: "big", Run: big, Attempt: 1}
	f.st.children = []keel.RunID{big}

	p, err := f.childPolicy(context.Background(), keel.PlanStep{ID: "x", Goal: "x"}, 2)
	if !errors.Is(err, errBudgetWait) {
		t.Errorf("childPolicy(x) beside big, which holds the run's 900 tokens = %d tokens, %v; want errBudgetWait", p.BudgetTokens, err)
	}
}
