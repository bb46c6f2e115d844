package cloud

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud/jsstore"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrBudget is returned for a run that cannot start because its tenant's
// budget over all its runs (Limits.TotalTokens, TotalUSD) is spent. It
// wraps keel.ErrUnavailable (the protocol's unavailable, -32003).
var ErrBudget = fmt.Errorf("the tenant's budget is spent: %w", keel.ErrUnavailable)

// Spend is tokens and dollars: what a tenant's runs spent or hold.
type Spend struct {
	Tokens int64   `json:"tokens"`
	USD    float64 `json:"usd"`
}

// budgetBucket is the namespace's budget bucket: key spentKey holds
// what the tenant's runs spent and hold (Spend), and one key per run
// that holds a share (reservation) what it holds.
func budgetBucket(ns string) string { return ns + "_budget" }

const spentKey = "spent"

// reservation is a run's share of its tenant's budget, held from its
// start to its end.
type reservation struct {
	Spend
	Run keel.RunID `json:"run,omitempty"`
}

func reservationKey(idem string) string { return "run." + leaseKey(idem) }

// hasTotal reports whether l caps the tenant's runs together.
func (l Limits) hasTotal() bool { return l.TotalTokens > 0 || l.TotalUSD > 0 }

// ReadSpent returns what the runs of namespace ns spent and hold (in its
// tenant's account). No bucket yet is nothing spent.
func ReadSpent(ctx context.Context, js jetstream.JetStream, ns string) (Spend, error) {
	if ns == "" {
		ns = "keel"
	}
	kv, err := js.KeyValue(ctx, budgetBucket(ns))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return Spend{}, nil
	}
	if err != nil {
		return Spend{}, fmt.Errorf("budget: %w", err)
	}
	s, _, err := readSpent(ctx, kv)
	return s, err
}

func readSpent(ctx context.Context, kv jetstream.KeyValue) (Spend, uint64, error) {
	e, err := kv.Get(ctx, spentKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Spend{}, 0, nil
	}
	if err != nil {
		return Spend{}, 0, fmt.Errorf("budget: %w", err)
	}
	var s Spend
	if err := json.Unmarshal(e.Value(), &s); err != nil {
		return Spend{}, 0, fmt.Errorf("budget: %w", err)
	}
	return s, e.Revision(), nil
}

// CheckBudget returns an error wrapping ErrBudget if l caps the
// tenant's runs together and spent leaves nothing of it.
func (l Limits) CheckBudget(spent Spend) error {
	switch {
	case l.TotalTokens > 0 && spent.Tokens >= l.TotalTokens:
		return fmt.Errorf("%w: %d of %d tokens spent or held by its runs", ErrBudget, spent.Tokens, l.TotalTokens)
	case l.TotalUSD > 0 && spent.USD >= l.TotalUSD:
		return fmt.Errorf("%w: $%.4f of $%.4f spent or held by its runs", ErrBudget, spent.USD, l.TotalUSD)
	}
	return nil
}

// updateSpent applies f to what the bucket says is spent, by
// compare-and-set, again while another writer changed it meanwhile.
func updateSpent(ctx context.Context, kv jetstream.KeyValue, f func(Spend) (Spend, error)) error {
	for {
		cur, rev, err := readSpent(ctx, kv)
		if err != nil {
			return err
		}
		next, err := f(cur)
		if err != nil {
			return err
		}
		b, _ := json.Marshal(next)
		if rev == 0 {
			_, err = kv.Create(ctx, spentKey, b)
		} else {
			_, err = kv.Update(ctx, spentKey, b, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue // another writer's: read again
		}
		if err != nil {
			return fmt.Errorf("budget: %w", err)
		}
		return nil
	}
}

// reserve takes req's share of the tenant's budget before the run is
// created: the run's own budget, or what is left if it asks none or
// more, added to what is spent by compare-and-set and recorded under
// the run's key; req comes back capped at its share. A share already
// recorded for the key (an item given again before its run was
// created) is used as it is. Nothing left: ErrBudget.
func (w *Worker) reserve(ctx context.Context, req keel.StartRequest) (keel.StartRequest, error) {
	l := w.cfg.Limits
	key := reservationKey(req.IdempotencyKey)
	apply := func(r Spend) keel.StartRequest {
		if l.TotalTokens > 0 {
			req.Policy.BudgetTokens = r.Tokens
		}
		if l.TotalUSD > 0 {
			req.Policy.BudgetUSD = r.USD
		}
		return req
	}
	if e, err := w.budget.Get(ctx, key); err == nil {
		var r reservation
		if json.Unmarshal(e.Value(), &r) == nil {
			return apply(r.Spend), nil
		}
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return req, fmt.Errorf("budget: %w", err)
	}
	var share Spend
	err := updateSpent(ctx, w.budget, func(s Spend) (Spend, error) {
		if err := l.CheckBudget(s); err != nil {
			return s, err
		}
		share = Spend{}
		if l.TotalTokens > 0 {
			left := l.TotalTokens - s.Tokens
			share.Tokens = req.Policy.BudgetTokens
			if share.Tokens <= 0 || share.Tokens > left {
				share.Tokens = left
			}
		}
		if l.TotalUSD > 0 {
			left := l.TotalUSD - s.USD
			share.USD = req.Policy.BudgetUSD
			if share.USD <= 0 || share.USD > left {
				share.USD = left
			}
		}
		return Spend{Tokens: s.Tokens + share.Tokens, USD: s.USD + share.USD}, nil
	})
	if err != nil {
		return req, err
	}
	// Recorded after it is counted: a worker that dies in between
	// leaves the share counted and unrecorded, which no one gives back
	// (the tenant's budget errs on the side of spending less).
	b, _ := json.Marshal(reservation{Spend: share})
	if _, err := w.budget.Put(ctx, key, b); err != nil {
		return req, fmt.Errorf("budget: %w", err)
	}
	return apply(share), nil
}

// settle gives back what an ended run held of its tenant's budget and
// did not spend: its share is taken off what is spent and what its
// journal's model results spent is put on. The share's key is deleted
// first, by revision, so one settle of a run counts.
func (w *Worker) settle(ctx context.Context, r keel.Run) {
	if !w.cfg.Limits.hasTotal() || r.IdempotencyKey == "" || !r.Status.Terminal() {
		return
	}
	key := reservationKey(r.IdempotencyKey)
	e, err := w.budget.Get(ctx, key)
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			w.log.Warn("budget: read a run's share", logkey.Run, r.ID, logkey.Err, err)
		}
		return
	}
	var held reservation
	if err := json.Unmarshal(e.Value(), &held); err != nil {
		return
	}
	spent, err := runSpent(ctx, w.st, r.ID)
	if err != nil {
		w.log.Warn("budget: what a run spent", logkey.Run, r.ID, logkey.Err, err)
		return // its share stays counted
	}
	if err := w.budget.Delete(ctx, key, jetstream.LastRevision(e.Revision())); err != nil {
		return // another worker settles it
	}
	if err := updateSpent(ctx, w.budget, func(s Spend) (Spend, error) {
		return Spend{Tokens: max(0, s.Tokens-held.Tokens+spent.Tokens), USD: max(0, s.USD-held.USD+spent.USD)}, nil
	}); err != nil {
		w.log.Warn("budget: give back a run's share", logkey.Run, r.ID, logkey.Err, err)
	}
}

// runSpent sums what the model results of run id's journal spent.
func runSpent(ctx context.Context, st *jsstore.Store, id keel.RunID) (Spend, error) {
	evs, err := st.Events(ctx, id, 0)
	if err != nil {
		return Spend{}, err
	}
	var s Spend
	for _, ev := range evs {
		if ev.Type != keel.EventModelResult {
			continue
		}
		var d keel.ModelResultData
		if json.Unmarshal(ev.Data, &d) == nil {
			s.Tokens += int64(d.PromptTokens + d.CompletionTokens)
			s.USD += d.CostUSD
		}
	}
	return s, nil
}
