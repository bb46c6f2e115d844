package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
)

// What a plan or DAG run's sub-agents may spend: each is given a share of
// what the parent's budget has left.

// errBudgetWait says a step cannot start yet: the running sub-agents
// were given all that the parent's budget has left. It starts when one of
// them ends and gives back what it did not spend.
var errBudgetWait = errors.New("the running sub-agents hold what is left of the run's budget")

// childPolicy is a sub-agent's policy: the parent's, with the step's tool
// subset (none when the step names none) and a budget taken from what the
// parent's budget has left, less what the running sub-agents may still
// spend: the step's own budget if it names one and it fits, else 1/share
// of that. So sub-agents running together never hold more than the
// parent has left. It returns errBudgetWait when nothing is left but
// running sub-agents hold some.
func (f *flowRun) childPolicy(ctx context.Context, s keel.PlanStep, share int) (keel.RunPolicy, error) {
	p := f.run.Policy
	p.Tools = append([]string{}, s.Tools...) // non-nil: an empty subset is no tools
	// Its goal holds the parent's goal and earlier steps' results: its
	// inputs carry the labels the parent's context holds.
	p.Labels = labelNames(f.e.labelsNow(ctx, f.run))
	p.BudgetTokens, p.BudgetUSD = s.BudgetTokens, 0
	if f.run.Policy.BudgetTokens <= 0 && f.run.Policy.BudgetUSD <= 0 {
		return p, nil
	}
	share = max(share, 1)
	tok, usd, heldTok, heldUSD, err := f.held(ctx)
	if err != nil {
		return p, err
	}
	if lim := f.run.Policy.BudgetTokens; lim > 0 {
		if lim-tok <= 0 {
			return p, fmt.Errorf("the run's token budget (%d) is spent; step %q cannot start", lim, s.ID)
		}
		left := lim - tok - heldTok
		if left <= 0 {
			return p, errBudgetWait
		}
		if s.BudgetTokens > 0 {
			p.BudgetTokens = min(s.BudgetTokens, left)
		} else {
			p.BudgetTokens = max(1, left/int64(share))
		}
	}
	if lim := f.run.Policy.BudgetUSD; lim > 0 {
		if usd >= lim {
			return p, fmt.Errorf("the run's budget of $%g is spent; step %q cannot start", lim, s.ID)
		}
		left := lim - usd - heldUSD
		if left <= 0 {
			return p, errBudgetWait
		}
		p.BudgetUSD = left / float64(share)
	}
	return p, nil
}

// held is what the parent's model calls and all its sub-agents spent
// (tok, usd), and what the running sub-agents may still spend: each one's
// budget less what it spent (heldTok, heldUSD). Each run's spending is
// read once, for both: a sub-agent that spends meanwhile moves what it
// spent from held to spent, and never out of both (read twice, it was
// missing from spent when read before and from held when read after, and
// a step started beside it with more than the parent had left). A
// sub-agent's status is read before its spending, so one that ends
// meanwhile holds no less than it may still spend.
func (f *flowRun) held(ctx context.Context) (tok int64, usd float64, heldTok int64, heldUSD float64, err error) {
	tok, usd = f.e.spent(ctx, f.run.ID)
	rt, ru := f.remoteSpent()
	tok, usd = tok+rt, usd+ru
	running := map[keel.RunID]bool{}
	for _, d := range f.st.running {
		running[d.Run] = true
	}
	for _, c := range f.st.children {
		var child keel.Run
		if running[c] {
			child, err = f.e.cfg.Store.GetRun(ctx, c)
			switch {
			case errors.Is(err, keel.ErrNotFound):
				running[c] = false // not created yet: it holds nothing
			case err != nil:
				return 0, 0, 0, 0, err
			case child.Status.Terminal():
				running[c] = false
			}
		}
		t, u := f.e.spent(ctx, c)
		tok, usd = tok+t, usd+u
		if running[c] {
			heldTok += max(0, child.Policy.BudgetTokens-t)
			heldUSD += max(0, child.Policy.BudgetUSD-u)
		}
	}
	return tok, usd, heldTok, heldUSD, nil
}

// spent is what the parent's model calls and all its sub-agents spent,
// here and elsewhere.
func (f *flowRun) spent(ctx context.Context) (int64, float64) {
	tok, usd := f.e.spent(ctx, f.run.ID)
	rt, ru := f.remoteSpent()
	tok, usd = tok+rt, usd+ru
	for _, c := range f.st.children {
		t, u := f.e.spent(ctx, c)
		tok, usd = tok+t, usd+u
	}
	return tok, usd
}

func (f *flowRun) budget(ctx context.Context) *models.Budget {
	tok, usd := f.spent(ctx)
	return models.NewBudget("run", models.Limits{Tokens: f.run.Policy.BudgetTokens, CostUSD: f.run.Policy.BudgetUSD}, tok, usd)
}
