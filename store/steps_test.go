package store_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/keel-runtime/keel"
)

// TestStepOffers: the first offer of a step's key keeps its origin and
// trace context; the
// offer is found from the run of that key, after the store is opened
// again; a run of no offer has none. Only the origin's cancel marks it
// cancelled, and a cancel that comes before the offer is kept for it.
func TestStepOffers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keel.db")
	s := open(t, path)
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	first := keel.StepOffer{Key: "step-p.s.1", Origin: "edge-a", TraceParent: tp}
	if o, err := s.OfferStep(ctx, first); err != nil || o != first {
		t.Fatalf("OfferStep(edge-a) = %+v, %v; want %+v, no run", o, err, first)
	}
	r := newRun("r1")
	r.IdempotencyKey = "step-p.s.1"
	if err := s.CreateRun(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateRun(ctx, newRun("r2")); err != nil {
		t.Fatal(err)
	}
	want := keel.StepOffer{Key: "step-p.s.1", Origin: "edge-a", TraceParent: tp, Run: "r1"}
	if o, err := s.OfferStep(ctx, keel.StepOffer{Key: "step-p.s.1", Origin: "edge-b"}); err != nil || o != want {
		t.Errorf("OfferStep(edge-b) after edge-a's = %+v, %v; want %+v", o, err, want)
	}
	s.Close()
	s = open(t, path)
	if o, err := s.StepOfferOf(ctx, "r1"); err != nil || o != want {
		t.Errorf("StepOfferOf(r1) after a reopen = %+v, %v; want %+v", o, err, want)
	}
	if _, err := s.StepOfferOf(ctx, "r2"); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("StepOfferOf(r2) = %v, want ErrNotFound", err)
	}

	// A cancel by another origin changes nothing; the origin's own
	// cancels; a cancel before any offer is kept, and the offer that
	// follows finds it.
	if o, err := s.CancelStepOffer(ctx, "step-p.s.1", "edge-b"); err != nil || o != want {
		t.Errorf("CancelStepOffer(edge-b) = %+v, %v; want %+v unchanged", o, err, want)
	}
	want.Cancelled = true
	if o, err := s.CancelStepOffer(ctx, "step-p.s.1", "edge-a"); err != nil || o != want {
		t.Errorf("CancelStepOffer(edge-a) = %+v, %v; want %+v", o, err, want)
	}
	early := keel.StepOffer{Key: "step-p.s.2", Origin: "edge-a", Cancelled: true}
	if o, err := s.CancelStepOffer(ctx, "step-p.s.2", "edge-a"); err != nil || o != early {
		t.Errorf("CancelStepOffer before an offer = %+v, %v; want %+v", o, err, early)
	}
	if o, err := s.OfferStep(ctx, keel.StepOffer{Key: "step-p.s.2", Origin: "edge-a"}); err != nil || o != early {
		t.Errorf("OfferStep after its cancel = %+v, %v; want %+v", o, err, early)
	}
}
