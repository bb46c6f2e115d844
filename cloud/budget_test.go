package cloud_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud"
	keelclient "github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/nats-io/nats.go/jetstream"
)

// TestTenantBudget: acme's runs share a budget of total tokens, kept in
// its budget bucket. A run started over the gateway holds what is left
// as its own budget while it runs and gives back what it did not spend:
// afterwards the bucket counts exactly what its journal's model results
// spent. With 20 tokens left, a run gets 20 and is stopped by its
// budget before its first model call, spending nothing. With nothing
// left, run.start is refused with a clear error and nothing is queued.
func TestTenantBudget(t *testing.T) {
	t.Parallel()
	ns := namespace("budget")
	acme := &tenants[0]
	const total = 100000
	limits := cloud.Limits{TotalTokens: total}
	c := &calls{}
	js, st := clientAs(t, nil, acme, ns)
	startWorker(t, ns, "budget-acme-1", toolsDir(t), c, workerOpts{as: acme, limits: limits})
	url, roots := startGateway(t, ns, "keel.example", gwOpts{limits: map[string]cloud.Limits{acme.Name: limits}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, err := keelclient.DialTLS(ctx, url, acme.Token, &tls.Config{RootCAs: roots})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	kv, err := js.KeyValue(ctx, ns+"_budget")
	if err != nil {
		t.Fatal(err)
	}
	// settled waits for a run's share to be given back: its key deleted,
	// then what is spent written (settle does the two in that order; a
	// read between them sees the share still counted).
	watch, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	settled := func() {
		t.Helper()
		deleted := false
		for {
			select {
			case e := <-watch.Updates():
				switch {
				case e == nil:
				case e.Key() != "spent" && e.Operation() == jetstream.KeyValueDelete:
					deleted = true
				case deleted && e.Key() == "spent" && e.Operation() == jetstream.KeyValuePut:
					return
				}
			case <-ctx.Done():
				t.Fatal("no run's share was given back within a minute")
			}
		}
	}
	run := func(goal string, want keel.EventType) keel.Run {
		t.Helper()
		r, err := a.StartRun(ctx, protocol.RunStartParams{Goal: goal})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Subscribe(ctx, r.ID, 0); err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case ev := <-a.Events():
				if ev.RunID == r.ID && (ev.Type == keel.EventRunSucceeded || ev.Type == keel.EventRunFailed || ev.Type == keel.EventRunCancelled) {
					if ev.Type != want {
						t.Fatalf("run %s ended %s (%s), want %s", r.ID, ev.Type, ev.Data, want)
					}
					settled()
					if r, err = st.GetRun(ctx, r.ID); err != nil {
						t.Fatal(err)
					}
					return r
				}
			case <-ctx.Done():
				t.Fatalf("run %s did not end within a minute", r.ID)
			}
		}
	}
	spent := func(id keel.RunID) int64 {
		evs, err := st.Events(ctx, id, 0)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, ev := range evs {
			if ev.Type == keel.EventModelResult {
				var d keel.ModelResultData
				json.Unmarshal(ev.Data, &d)
				n += int64(d.PromptTokens + d.CompletionTokens)
			}
		}
		return n
	}
	put := func(tokens int64) {
		b, _ := json.Marshal(cloud.Spend{Tokens: tokens})
		if _, err := kv.Put(ctx, "spent", b); err != nil {
			t.Fatal(err)
		}
	}

	r1 := run("budget-1", keel.EventRunSucceeded)
	n1 := spent(r1.ID)
	if got, err := cloud.ReadSpent(ctx, js, ns); err != nil || got.Tokens != n1 || n1 == 0 || r1.Policy.BudgetTokens != total {
		t.Errorf("after run %s (budget %d, spent %d by its journal): the tenant spent %+v, %v; want its budget all that was left (%d) and exactly what it spent counted",
			r1.ID, r1.Policy.BudgetTokens, n1, got, err, total)
	}

	put(total - 20)
	r2 := run("budget-2", keel.EventRunFailed)
	if r2.Policy.BudgetTokens != 20 || !strings.Contains(r2.Error, "budget") {
		t.Errorf("run %s with 20 tokens left: budget %d, error %q; want 20, stopped by its budget", r2.ID, r2.Policy.BudgetTokens, r2.Error)
	}
	if got, _ := cloud.ReadSpent(ctx, js, ns); got.Tokens != total-20+spent(r2.ID) || got.Tokens > total {
		t.Errorf("after run %s the tenant spent %d tokens, want %d (its journal: %d) and at most %d", r2.ID, got.Tokens, total-20+spent(r2.ID), spent(r2.ID), total)
	}

	put(total)
	_, err = a.StartRun(ctx, protocol.RunStartParams{Goal: "budget-3"})
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeUnavailable || !strings.Contains(pe.Message, "budget is spent") {
		t.Errorf("run.start with the budget spent: %v, want unavailable (%d) saying the budget is spent", err, protocol.CodeUnavailable)
	}
	if s, err := js.Stream(ctx, ns+"_WORK"); err != nil {
		t.Fatal(err)
	} else if info, err := s.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Errorf("the work queue after a refused run.start: %+v, %v; want nothing queued", info.State, err)
	}
}
