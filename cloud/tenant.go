package cloud

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/keel-runtime/keel"
)

// Tenant is one tenant of a cloud: a NATS account of its own, so that
// its streams, buckets and subjects (its runs' journals, work queue,
// leases, spans) are a namespace at the server that no other tenant's
// client can see or name; a token, the password of the account's user,
// that its clients and workers present; and the limits and approvals
// its runs keep. Workers serve one tenant each (a connection is in one
// account).
type Tenant struct {
	// Name names the account and its user: letters, digits, '-', '_'
	// or '.'.
	Name string `json:"name"`
	// Token is the user's password: at least 16 characters of letters,
	// digits, '-', '_' or '.'.
	Token string `json:"token"`
	// Limits are what every run of the tenant keeps.
	Limits Limits `json:"limits,omitzero"`
	// RequireApproval lists the side-effect classes whose tool calls
	// wait for a person's approval in the tenant's runs
	// (engine.Config.RequireApproval); default none.
	RequireApproval []keel.SideEffect `json:"require_approval,omitempty"`
	// Edges are the tenant's edges, each a user of the tenant's account
	// that may join as a leaf node under its own name only
	// (edge.Permissions); keel cloud serve --embedded configures them.
	Edges []EdgeUser `json:"edges,omitempty"`
}

// EdgeUser is an edge's credentials: its name (an edge name: lower-case
// letters, digits, '-' and '_') is its user; its password is at least
// 16 characters of letters, digits, '-', '_' or '.'. The edge presents
// them as its credentials file's one line NAME:PASSWORD.
type EdgeUser struct {
	Name     string `json:"name"`
	Password string `json:"password"`
}

// Limits are what every run of a worker keeps, whatever its request
// asks. The zero value limits nothing.
type Limits struct {
	// BudgetTokens caps each run's token budget: a run that asks for
	// none or for more gets this much. 0: no cap.
	BudgetTokens int64 `json:"budget_tokens,omitempty"`
	// BudgetUSD caps each run's budget in dollars, as BudgetTokens.
	BudgetUSD float64 `json:"budget_usd,omitempty"`
	// TotalTokens caps the tokens all of the tenant's runs spend
	// together, kept in the namespace's budget bucket (NS_budget) by
	// compare-and-set: a run holds a share from its start (its own
	// budget, or what is left of the tenant's if it asks none or more)
	// and gives back what it did not spend when it ends; a run cannot
	// start when nothing is left (ErrBudget), and one that would spend
	// more than its share is stopped by its budget. 0: no cap.
	TotalTokens int64 `json:"total_tokens,omitempty"`
	// TotalUSD caps the dollars they spend together, as TotalTokens.
	TotalUSD float64 `json:"total_usd,omitempty"`
	// Tools are the only tools the runs may call: a run that names
	// others keeps those of them listed here, one that names none gets
	// these. Nil: every tool of the worker.
	Tools []string `json:"tools,omitempty"`
}

// Apply returns req within l.
func (l Limits) Apply(req keel.StartRequest) keel.StartRequest {
	p := &req.Policy
	if l.BudgetTokens > 0 && (p.BudgetTokens <= 0 || p.BudgetTokens > l.BudgetTokens) {
		p.BudgetTokens = l.BudgetTokens
	}
	if l.BudgetUSD > 0 && (p.BudgetUSD <= 0 || p.BudgetUSD > l.BudgetUSD) {
		p.BudgetUSD = l.BudgetUSD
	}
	if l.Tools != nil {
		if p.Tools == nil {
			p.Tools = slices.Clone(l.Tools)
		} else {
			p.Tools = slices.DeleteFunc(slices.Clone(p.Tools), func(t string) bool { return !slices.Contains(l.Tools, t) })
		}
	}
	return req
}

// ReadTenants reads a tenants file: a JSON array of Tenant. Names must
// be unique and tokens long enough (see Tenant).
func ReadTenants(path string) ([]Tenant, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tenants: %w", err)
	}
	var ts []Tenant
	if err := json.Unmarshal(data, &ts); err != nil {
		return nil, fmt.Errorf("tenants %s: %w", path, err)
	}
	if len(ts) == 0 {
		return nil, fmt.Errorf("tenants %s: none", path)
	}
	// Tenants' and edges' names are all users of one server: each once.
	seen := map[string]bool{}
	for _, t := range ts {
		if err := t.check(); err != nil {
			return nil, fmt.Errorf("tenants %s: %w", path, err)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("tenants %s: %q twice", path, t.Name)
		}
		seen[t.Name] = true
	}
	for _, t := range ts {
		for _, e := range t.Edges {
			if seen[e.Name] {
				return nil, fmt.Errorf("tenants %s: edge %q: the name of a tenant or of another edge", path, e.Name)
			}
			seen[e.Name] = true
		}
	}
	return ts, nil
}

// errTenant is a tenant that cannot be one.
var errTenant = errors.New("a tenant needs a name and a token of at least 16 characters, both letters, digits, '-', '_' or '.'")

func (t Tenant) check() error {
	plain := func(s string) bool {
		return s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == ""
	}
	if !plain(t.Name) || !plain(t.Token) || len(t.Token) < 16 {
		return fmt.Errorf("tenant %q: %w", t.Name, errTenant)
	}
	for _, e := range t.Edges {
		if e.Name == "" || strings.Trim(e.Name, "abcdefghijklmnopqrstuvwxyz0123456789-_") != "" || e.Name == "cloud" ||
			!plain(e.Password) || len(e.Password) < 16 {
			return fmt.Errorf("tenant %q: edge %q: an edge needs a name of lower-case letters, digits, '-' and '_' (not \"cloud\") and a password of at least 16 characters, letters, digits, '-', '_' or '.'", t.Name, e.Name)
		}
	}
	return nil
}
