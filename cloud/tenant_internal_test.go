package cloud

import (
	"os"
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

func TestReadTenantsEdges(t *testing.T) {
	const tok = "0123456789abcdef"
	for _, c := range []struct {
		name, file string
		ok         bool
	}{
		{"an edge", `[{"name":"acme","token":"` + tok + `","edges":[{"name":"laptop","password":"` + tok + `"}]}]`, true},
		{"an edge named as its tenant", `[{"name":"acme","token":"` + tok + `","edges":[{"name":"acme","password":"` + tok + `"}]}]`, false},
		{"one edge name twice", `[{"name":"a","token":"` + tok + `","edges":[{"name":"e","password":"` + tok + `"}]},
			{"name":"b","token":"x` + tok + `","edges":[{"name":"e","password":"` + tok + `"}]}]`, false},
		{"an upper-case edge name", `[{"name":"acme","token":"` + tok + `","edges":[{"name":"Laptop","password":"` + tok + `"}]}]`, false},
		{"the cloud's name", `[{"name":"acme","token":"` + tok + `","edges":[{"name":"cloud","password":"` + tok + `"}]}]`, false},
		{"a short password", `[{"name":"acme","token":"` + tok + `","edges":[{"name":"laptop","password":"short"}]}]`, false},
	} {
		f := t.TempDir() + "/tenants.json"
		if err := os.WriteFile(f, []byte(c.file), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadTenants(f); (err == nil) != c.ok {
			t.Errorf("%s: ReadTenants = %v, want ok %v", c.name, err, c.ok)
		}
	}
}
