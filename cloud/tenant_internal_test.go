package cloud

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keel-runtime/keel"
)

func TestLimitsApply(t *testing.T) {
	l := Limits{BudgetTokens: 100, BudgetUSD: 1, Tools: []string{"a", "b"}}
	for _, c := range []struct {
		name     string
		in, want keel.RunPolicy
	}{
		{"none asked: the caps", keel.RunPolicy{}, keel.RunPolicy{BudgetTokens: 100, BudgetUSD: 1, Tools: []string{"a", "b"}}},
		{"more asked: the caps", keel.RunPolicy{BudgetTokens: 500, BudgetUSD: 9, Tools: []string{"a", "c"}},
			keel.RunPolicy{BudgetTokens: 100, BudgetUSD: 1, Tools: []string{"a"}}},
		{"less asked: kept", keel.RunPolicy{BudgetTokens: 50, BudgetUSD: 0.5, Tools: []string{"b"}},
			keel.RunPolicy{BudgetTokens: 50, BudgetUSD: 0.5, Tools: []string{"b"}}},
		{"none of its tools allowed: none", keel.RunPolicy{Tools: []string{"c"}}, keel.RunPolicy{BudgetTokens: 100, BudgetUSD: 1, Tools: []string{}}},
	} {
		got := l.Apply(keel.StartRequest{Goal: "g", Policy: c.in}).Policy
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("%s: Apply(%+v) (-want +got):\n%s", c.name, c.in, diff)
		}
	}
	if got := (Limits{}).Apply(keel.StartRequest{Policy: keel.RunPolicy{BudgetTokens: 7}}).Policy; got.BudgetTokens != 7 || got.Tools != nil {
		t.Errorf("no limits: Apply = %+v, want the request as asked", got)
	}
}
