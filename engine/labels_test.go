package engine_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestDeclassifyClearsAndIsJournaled: a run started with the label pii
// holds it (ContextLabels); declassifying a label it does not hold, or
// without a reason or who, is refused with nothing journaled; declassifying
// pii journals labels.declassified with who and why and the labels left,
// and ContextLabels no longer holds it; a finished run refuses.
func TestDeclassifyClearsAndIsJournaled(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil, scripted.CallTool("write", `{"n":1}`), scripted.Answer("done"))
	st, eng := newEngine(t, engine.Config{Model: p, Tools: &echoTools{}, RequireApproval: []keel.SideEffect{keel.SideEffectNonIdempotentWrite}})
	ctx := context.Background()
	r, err := eng.Start(ctx, engine.StartRequest{Goal: "write it", Policy: keel.RunPolicy{Labels: []string{"pii", "secret"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunWaiting {
		t.Fatalf("run = %s %q, want waiting", got.Status, got.Error)
	}
	if got, err := eng.ContextLabels(ctx, r.ID); err != nil || !slices.Equal(got, []string{"pii", "secret"}) {
		t.Fatalf("ContextLabels = %v, %v; want [pii secret]", got, err)
	}
	n := len(journal(t, st, r.ID))
	for _, bad := range []keel.DeclassifyRequest{
		{RunID: r.ID, Label: "private", By: "ada", Reason: "fine"},
		{RunID: r.ID, Label: "pii", By: "ada"},
		{RunID: r.ID, Label: "pii", Reason: "fine"},
		{RunID: r.ID, Label: "PII!", By: "ada", Reason: "fine"},
	} {
		if _, err := eng.Declassify(ctx, bad); !errors.Is(err, keel.ErrInvalid) {
			t.Errorf("Declassify(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := eng.Declassify(ctx, keel.DeclassifyRequest{RunID: r.ID, Label: "private", By: "ada", Reason: "fine"}); err == nil || !strings.Contains(err.Error(), "pii, secret") {
		t.Errorf("Declassify of a label not held = %v, want it to name what the context holds", err)
	}
	if _, err := eng.Declassify(ctx, keel.DeclassifyRequest{RunID: "run_nope", Label: "pii", By: "ada", Reason: "fine"}); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("Declassify of an unknown run = %v, want ErrNotFound", err)
	}
	if got := len(journal(t, st, r.ID)); got != n {
		t.Fatalf("refused declassifications journaled %d events", got-n)
	}
	d, err := eng.Declassify(ctx, keel.DeclassifyRequest{RunID: r.ID, Label: "pii", By: "ada", Reason: "the customer consented"})
	if err != nil {
		t.Fatal(err)
	}
	want := keel.DeclassifyData{Label: "pii", By: "ada", Reason: "the customer consented", Labels: []string{"secret"}}
	if !slices.Equal(d.Labels, want.Labels) || d.Label != want.Label || d.By != want.By || d.Reason != want.Reason {
		t.Errorf("Declassify = %+v, want %+v", d, want)
	}
	got, ok := eventData[keel.DeclassifyData](t, journal(t, st, r.ID), keel.EventDeclassified)
	if !ok || got.Label != "pii" || got.By != "ada" || got.Reason != want.Reason || !slices.Equal(got.Labels, want.Labels) {
		t.Errorf("journaled labels.declassified = %+v (%v), want %+v", got, ok, want)
	}
	if got, err := eng.ContextLabels(ctx, r.ID); err != nil || !slices.Equal(got, []string{"secret"}) {
		t.Errorf("ContextLabels after = %v, %v; want [secret]", got, err)
	}
	if _, err := eng.Cancel(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Declassify(ctx, keel.DeclassifyRequest{RunID: r.ID, Label: "secret", By: "ada", Reason: "fine"}); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("Declassify on a cancelled run = %v, want ErrConflict", err)
	}
}

// TestStartRefusesMalformedLabels: a run's input labels are checked.
func TestStartRefusesMalformedLabels(t *testing.T) {
	t.Parallel()
	_, eng := newEngine(t, engine.Config{Model: scripted.New(nil), Tools: &echoTools{}})
	if _, err := eng.Start(context.Background(), engine.StartRequest{Goal: "g", Policy: keel.RunPolicy{Labels: []string{"Bad Label"}}}); !errors.Is(err, keel.ErrInvalid) {
		t.Errorf("Start with a malformed label = %v, want ErrInvalid", err)
	}
}
