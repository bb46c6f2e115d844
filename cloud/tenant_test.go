package cloud_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud"
	"github.com/keel-runtime/keel/cloud/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// tenants are the package cluster's accounts (TestMain).
var tenants = []natstest.Account{
	{Name: "acme", Token: "acme-0123456789abcdef"},
	{Name: "globex", Token: "globex-0123456789abcdef"},
}

// everything records every message a client of one account sees on
// every subject (">"): what a tenant could read of the server.
type everything struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (e *everything) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.buf.String()
}

func watchAll(t *testing.T, as *natstest.Account) *everything {
	nc := connect(t, nil, as)
	t.Cleanup(nc.Close)
	e := &everything{}
	if _, err := nc.Subscribe(">", func(m *nats.Msg) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.buf.WriteString(m.Subject + " " + string(m.Data) + "\n")
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestTenantsIsolated: two tenants, each a NATS account of its own with
// its own worker, use the same namespace and submit runs with the same
// idempotency key. Each run goes its own way under its tenant's policy
// (acme's calls of a non-idempotent tool wait for approval and its runs'
// budget is capped; globex's run unhindered), and neither tenant's
// clients see anything of the other's: a subscriber to every subject of
// one account never receives the other's journal, work items or leases;
// its store finds only its own run under the shared key; a client
// without credentials sees neither's streams; and the server refuses a
// tenant's name with another's token.
func TestTenantsIsolated(t *testing.T) {
	t.Parallel()
	// One namespace for both (a new one each time, for -count).
	ns, key := namespace("tenants"), "job"
	acme, globex := &tenants[0], &tenants[1]
	tools := toolsDir(t)
	c := &calls{}
	seenA, seenB := watchAll(t, acme), watchAll(t, globex)
	jsA, stA := clientAs(t, nil, acme, ns)
	jsB, stB := clientAs(t, nil, globex, ns)
	statusA, statusB := watchRunsAs(t, cluster, acme, ns), watchRunsAs(t, cluster, globex, ns)
	startWorker(t, ns, "acme-1", tools, c, workerOpts{as: acme, approve: []keel.SideEffect{keel.SideEffectNonIdempotentWrite},
		limits: cloud.Limits{BudgetTokens: 5000}})
	startWorker(t, ns, "globex-1", tools, c, workerOpts{as: globex})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	goalA, goalB := "acme-secret-goal", "globex-secret-goal"
	if err := cloud.Submit(ctx, jsA, ns, keel.StartRequest{Goal: goalA, IdempotencyKey: key}); err != nil {
		t.Fatal(err)
	}
	if err := cloud.Submit(ctx, jsB, ns, keel.StartRequest{Goal: goalB, IdempotencyKey: key, Policy: keel.RunPolicy{BudgetTokens: 1 << 40}}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, statusB, keel.RunSucceeded, 1)
	waitStatus(t, statusA, keel.RunWaiting, 1)

	rA, err := stA.RunByIdempotencyKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	rB, err := stB.RunByIdempotencyKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if rA.ID == rB.ID || rA.Goal != goalA || rB.Goal != goalB {
		t.Fatalf("key %q: acme's run %s %q, globex's %s %q; want two runs, each its tenant's goal", key, rA.ID, rA.Goal, rB.ID, rB.Goal)
	}
	// Policies and budgets per tenant.
	if rA.Status != keel.RunWaiting || rA.Policy.BudgetTokens != 5000 {
		t.Errorf("acme's run is %s with budget %d; want waiting (its policy asks approval) with its cap 5000", rA.Status, rA.Policy.BudgetTokens)
	}
	if rB.Status != keel.RunSucceeded || rB.Policy.BudgetTokens != 1<<40 {
		t.Errorf("globex's run is %s with budget %d; want succeeded with the %d it asked", rB.Status, rB.Policy.BudgetTokens, int64(1<<40))
	}
	if n := c.get(string(rA.ID) + "/" + goalA + "-c1"); n != 0 {
		t.Errorf("acme's first call ran %d times before its approval, want 0", n)
	}
	if n := c.get(string(rB.ID) + "/" + goalB + "-c3"); n != 1 {
		t.Errorf("globex's third call ran %d times, want 1", n)
	}

	// What each tenant's subscriber saw: its own, none of the other's.
	a, b := seenA.String(), seenB.String()
	for _, chk := range []struct {
		who, saw, own, other string
		ownID, otherID       keel.RunID
	}{{"acme", a, goalA, goalB, rA.ID, rB.ID}, {"globex", b, goalB, goalA, rB.ID, rA.ID}} {
		if !strings.Contains(chk.saw, chk.own) || !strings.Contains(chk.saw, string(chk.ownID)) {
			t.Errorf("%s's subscriber to every subject did not see its own run (the check is blind)", chk.who)
		}
		if strings.Contains(chk.saw, chk.other) || strings.Contains(chk.saw, string(chk.otherID)) {
			for _, line := range strings.Split(chk.saw, "\n") {
				if strings.Contains(line, chk.other) || strings.Contains(line, string(chk.otherID)) {
					t.Logf("%.300s", line)
				}
			}
			t.Errorf("%s's subscriber saw the other tenant's run %s", chk.who, chk.otherID)
		}
	}

	// Asked by ID (after the subscribers' check: the request names it),
	// acme's store finds no globex run.
	if _, err := stA.GetRun(ctx, rB.ID); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("acme reads globex's run %s: %v, want keel.ErrNotFound", rB.ID, err)
	}

	// A client without credentials (the default account) sees neither.
	nc := connect(t, nil, nil)
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.Stream(ctx, ns+"_JOURNAL"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("the default account finds the tenants' journal stream: %v, want not found", err)
	}
	// The server refuses a tenant's name with another's token.
	if nc, err := cluster.ConnectAs(natstest.Account{Name: acme.Name, Token: globex.Token}); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("connect as acme with globex's token: %v, want an authorization violation", err)
	}
}
