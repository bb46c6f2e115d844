// Package storetest is the conformance suite of the engine's store seam
// (engine.Store: a Journal and a Tracer): what every implementation must
// do, checked the same way against each. The SQLite store (store) and
// the JetStream store (cloud/jsstore) both pass it, in the style of
// testing/fstest.TestFS and models/modelstest.
//
// It imports the root types only: Store repeats the seam's method set, so
// that a store's tests need not import the engine.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
)

// Store is the method set of engine.Store.
type Store interface {
	CreateRun(ctx context.Context, r keel.Run) error
	CreateRunWith(ctx context.Context, r keel.Run, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error)
	GetRun(ctx context.Context, id keel.RunID) (keel.Run, error)
	AppendAll(ctx context.Context, id keel.RunID, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error)
	Events(ctx context.Context, id keel.RunID, afterSeq int64) ([]keel.Event, error)
	RunsWithStatus(ctx context.Context, states ...keel.RunStatus) ([]keel.Run, error)
	RunByIdempotencyKey(ctx context.Context, key string) (keel.Run, error)

	StartSpan(ctx context.Context, sp keel.Span) error
	FinishSpan(ctx context.Context, sp keel.Span) error
	Sync(ctx context.Context) error
	Spans(ctx context.Context, id keel.RunID) ([]keel.Span, error)
	RunsWithOpenSpans(ctx context.Context) ([]keel.RunID, error)
}

// Run runs the suite. open returns an empty store, cleaned up by the
// test it is given; it is called once per subtest, and subtests run in
// parallel.
func Run(t *testing.T, open func(t *testing.T) Store) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, s Store)
	}{
		{"CreateGet", testCreateGet},
		{"Missing", testMissing},
		{"Append", testAppend},
		{"Lifecycle", testLifecycle},
		{"CreateWith", testCreateWith},
		{"RunsWithStatus", testRunsWithStatus},
		{"IdempotencyKey", testIdempotencyKey},
		{"ConcurrentAppends", testConcurrentAppends},
		{"Spans", testSpans},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open(t))
		})
	}
}

// t0 is the suite's clock: whole microseconds, so every store keeps it.
var t0 = time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func newRun(id string, at time.Duration) keel.Run {
	return keel.Run{ID: keel.RunID(id), Kind: keel.KindAgent, Goal: "goal of " + id, Model: "m", Status: keel.RunQueued, MaxSteps: 8,
		CreatedAt: t0.Add(at), UpdatedAt: t0.Add(at), Workspace: "/ws", ParentID: "run_parent", ParentStep: "s1"}
}

func evs(at time.Duration, types ...keel.EventType) []keel.Event {
	out := make([]keel.Event, len(types))
	for i, typ := range types {
		out[i] = keel.Event{Type: typ, Time: t0.Add(at + time.Duration(i)*time.Millisecond), Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	return out
}

func testCreateGet(t *testing.T, s Store) {
	c := ctx(t)
	want := newRun("run_a", 0)
	want.Policy.BudgetTokens = 1000
	if err := s.CreateRun(c, want); err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	got, err := s.GetRun(c, want.ID)
	if err != nil {
		t.Fatalf("GetRun: %v", err)
	}
	if !sameRun(got, want) {
		t.Errorf("GetRun = %+v, want %+v", got, want)
	}
	if err := s.CreateRun(c, want); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("CreateRun of an existing ID = %v, want keel.ErrConflict", err)
	}
}

// sameRun compares what a store keeps of a run.
func sameRun(a, b keel.Run) bool {
	pa, _ := json.Marshal(a.Policy)
	pb, _ := json.Marshal(b.Policy)
	return a.ID == b.ID && a.KindOrAgent() == b.KindOrAgent() && a.Goal == b.Goal && a.Model == b.Model && a.Status == b.Status &&
		a.Result == b.Result && a.Error == b.Error && a.MaxSteps == b.MaxSteps && string(pa) == string(pb) &&
		a.IdempotencyKey == b.IdempotencyKey && a.CreatedAt.Equal(b.CreatedAt) && a.UpdatedAt.Equal(b.UpdatedAt) &&
		a.LastSeq == b.LastSeq && a.ParentID == b.ParentID && a.ParentStep == b.ParentStep && a.Workspace == b.Workspace
}

func testMissing(t *testing.T, s Store) {
	c := ctx(t)
	if _, err := s.GetRun(c, "run_none"); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("GetRun(unknown) = %v, want keel.ErrNotFound", err)
	}
	if _, err := s.Events(c, "run_none", 0); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("Events(unknown) = %v, want keel.ErrNotFound", err)
	}
	if _, err := s.AppendAll(c, "run_none", evs(0, keel.EventRunStarted), nil); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("AppendAll(unknown) = %v, want keel.ErrNotFound", err)
	}
	if _, err := s.RunByIdempotencyKey(c, "none"); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("RunByIdempotencyKey(unknown) = %v, want keel.ErrNotFound", err)
	}
}

func testAppend(t *testing.T, s Store) {
	c := ctx(t)
	r := newRun("run_a", 0)
	if err := s.CreateRun(c, r); err != nil {
		t.Fatal(err)
	}
	first, err := s.AppendAll(c, r.ID, evs(time.Second, keel.EventRunStarted), &keel.RunUpdate{Status: keel.RunRunning})
	if err != nil {
		t.Fatalf("AppendAll: %v", err)
	}
	more, err := s.AppendAll(c, r.ID, evs(2*time.Second, keel.EventModelResult, keel.EventToolCall, keel.EventToolResult), nil)
	if err != nil {
		t.Fatalf("AppendAll: %v", err)
	}
	stored := append(first, more...)
	for i, ev := range stored {
		if ev.Seq != int64(i+1) || ev.RunID != r.ID {
			t.Errorf("stored event %d = seq %d run %s, want seq %d run %s", i, ev.Seq, ev.RunID, i+1, r.ID)
		}
	}
	all, err := s.Events(c, r.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if d := diffEvents(all, stored); d != "" {
		t.Errorf("Events(0): %s", d)
	}
	after, err := s.Events(c, r.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	if d := diffEvents(after, stored[2:]); d != "" {
		t.Errorf("Events(2): %s", d)
	}
	got, err := s.GetRun(c, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	last := stored[len(stored)-1]
	if got.Status != keel.RunRunning || got.LastSeq != last.Seq || !got.UpdatedAt.Equal(last.Time) {
		t.Errorf("GetRun = status %s last_seq %d updated %v, want running %d %v", got.Status, got.LastSeq, got.UpdatedAt, last.Seq, last.Time)
	}
	if _, err := s.AppendAll(c, r.ID, evs(3*time.Second, keel.EventRunSucceeded), &keel.RunUpdate{Status: keel.RunSucceeded, Result: "42"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetRun(c, r.ID); got.Status != keel.RunSucceeded || got.Result != "42" || got.LastSeq != 5 {
		t.Errorf("GetRun after its end = %s %q last_seq %d, want succeeded \"42\" 5", got.Status, got.Result, got.LastSeq)
	}
}

func diffEvents(got, want []keel.Event) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d events, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Seq != w.Seq || g.Type != w.Type || !g.Time.Equal(w.Time) || string(g.Data) != string(w.Data) || g.RunID != w.RunID {
			return fmt.Sprintf("event %d = %+v, want %+v", i, g, w)
		}
	}
	return ""
}

func testLifecycle(t *testing.T, s Store) {
	c := ctx(t)
	r := newRun("run_a", 0)
	if err := s.CreateRun(c, r); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendAll(c, r.ID, evs(0, keel.EventRunStarted), &keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		t.Fatal(err)
	}
	// running -> queued is not a transition of the lifecycle.
	if _, err := s.AppendAll(c, r.ID, evs(time.Second, keel.EventRunInterrupted), &keel.RunUpdate{Status: keel.RunQueued}); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("AppendAll running -> queued = %v, want keel.ErrConflict", err)
	}
	if _, err := s.AppendAll(c, r.ID, evs(2*time.Second, keel.EventRunFailed), &keel.RunUpdate{Status: keel.RunFailed, Error: "boom"}); err != nil {
		t.Fatal(err)
	}
	// Nothing follows a terminal status, not even an event without one.
	if _, err := s.AppendAll(c, r.ID, evs(3*time.Second, keel.EventHumanMessage), nil); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("AppendAll after run.failed = %v, want keel.ErrConflict", err)
	}
	all, err := s.Events(c, r.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 {
		t.Errorf("%d events after refused appends, want 2: %+v", len(all), all)
	}
	if got, _ := s.GetRun(c, r.ID); got.Status != keel.RunFailed || got.Error != "boom" {
		t.Errorf("GetRun = %s %q, want failed \"boom\"", got.Status, got.Error)
	}
}

func testCreateWith(t *testing.T, s Store) {
	c := ctx(t)
	r := newRun("run_a", 0)
	stored, err := s.CreateRunWith(c, r, evs(time.Second, keel.EventRunStarted, keel.EventPlanProposed), &keel.RunUpdate{Status: keel.RunRunning})
	if err != nil {
		t.Fatalf("CreateRunWith: %v", err)
	}
	if len(stored) != 2 || stored[0].Seq != 1 || stored[1].Seq != 2 {
		t.Fatalf("CreateRunWith = %+v, want seqs 1, 2", stored)
	}
	got, err := s.GetRun(c, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != keel.RunRunning || got.LastSeq != 2 || !got.UpdatedAt.Equal(stored[1].Time) {
		t.Errorf("GetRun = %s last_seq %d, want running 2", got.Status, got.LastSeq)
	}
	if _, err := s.CreateRunWith(c, r, evs(0, keel.EventRunStarted), nil); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("CreateRunWith of an existing ID = %v, want keel.ErrConflict", err)
	}
	if all, _ := s.Events(c, r.ID, 0); len(all) != 2 {
		t.Errorf("%d events after a refused CreateRunWith, want 2", len(all))
	}
}

func testRunsWithStatus(t *testing.T, s Store) {
	c := ctx(t)
	// Created out of order: listed oldest first.
	for i, id := range []string{"run_c", "run_a", "run_b", "run_d"} {
		r := newRun(id, time.Duration(3-i)*time.Second)
		if err := s.CreateRun(c, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.AppendAll(c, "run_b", evs(10*time.Second, keel.EventRunStarted), &keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendAll(c, "run_d", evs(10*time.Second, keel.EventRunCancelled), &keel.RunUpdate{Status: keel.RunCancelled}); err != nil {
		t.Fatal(err)
	}
	got, err := s.RunsWithStatus(c, keel.RunQueued, keel.RunRunning)
	if err != nil {
		t.Fatal(err)
	}
	var ids []keel.RunID
	for _, r := range got {
		ids = append(ids, r.ID)
	}
	if want := []keel.RunID{"run_b", "run_a", "run_c"}; !slices.Equal(ids, want) {
		t.Errorf("RunsWithStatus(queued, running) = %v, want %v", ids, want)
	}
	if got[0].Status != keel.RunRunning || got[0].LastSeq != 1 {
		t.Errorf("run_b listed as %s last_seq %d, want running 1", got[0].Status, got[0].LastSeq)
	}
	if got, _ := s.RunsWithStatus(c, keel.RunWaiting); len(got) != 0 {
		t.Errorf("RunsWithStatus(waiting) = %d runs, want none", len(got))
	}
}

func testIdempotencyKey(t *testing.T, s Store) {
	c := ctx(t)
	r := newRun("run_a", 0)
	r.IdempotencyKey = "client key/1 é"
	if err := s.CreateRun(c, r); err != nil {
		t.Fatal(err)
	}
	got, err := s.RunByIdempotencyKey(c, r.IdempotencyKey)
	if err != nil || got.ID != r.ID {
		t.Errorf("RunByIdempotencyKey = %s, %v; want %s", got.ID, err, r.ID)
	}
	other := newRun("run_b", time.Second)
	other.IdempotencyKey = r.IdempotencyKey
	if err := s.CreateRun(c, other); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("CreateRun with a used key = %v, want keel.ErrConflict", err)
	}
	if _, err := s.GetRun(c, other.ID); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("the run refused for its key: GetRun = %v, want keel.ErrNotFound", err)
	}
	if _, err := s.RunByIdempotencyKey(c, "client key/2"); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("RunByIdempotencyKey(other key) = %v, want keel.ErrNotFound", err)
	}
}

// testConcurrentAppends appends from several goroutines at once, as the
// engine does (the loop, a person's message, a decision): every event is
// stored once, numbered without gaps.
func testConcurrentAppends(t *testing.T, s Store) {
	c := ctx(t)
	r := newRun("run_a", 0)
	if _, err := s.CreateRunWith(c, r, evs(0, keel.EventRunStarted), &keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		t.Fatal(err)
	}
	const writers, each = 6, 5
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				ev := keel.Event{Type: keel.EventHumanMessage, Time: t0.Add(time.Second), Data: json.RawMessage(fmt.Sprintf(`{"w":%d,"i":%d}`, w, i))}
				if _, err := s.AppendAll(c, r.ID, []keel.Event{ev, ev}, nil); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("AppendAll: %v", err)
	}
	all, err := s.Events(c, r.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1+2*writers*each {
		t.Fatalf("%d events, want %d", len(all), 1+2*writers*each)
	}
	seen := map[string]int{}
	for i, ev := range all {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
		if i > 0 {
			seen[string(ev.Data)]++
			if i%2 == 0 && string(all[i-1].Data) != string(ev.Data) {
				t.Errorf("events %d and %d of one append are apart: %s, %s", i-1, i, all[i-1].Data, ev.Data)
			}
		}
	}
	for d, n := range seen {
		if n != 2 {
			t.Errorf("%s stored %d times, want 2", d, n)
		}
	}
}

func testSpans(t *testing.T, s Store) {
	c := ctx(t)
	r := newRun("run_a", 0)
	if err := s.CreateRun(c, r); err != nil {
		t.Fatal(err)
	}
	root := keel.Span{ID: "span_1", RunID: r.ID, Kind: keel.SpanRun, Name: "run", Start: t0.Add(time.Second), Status: keel.SpanRunning}
	step := keel.Span{ID: "span_2", RunID: r.ID, ParentID: "span_1", Kind: keel.SpanStep, Step: 1, Start: t0.Add(2 * time.Second), Status: keel.SpanRunning}
	call := keel.Span{ID: "span_3", RunID: r.ID, ParentID: "span_2", Kind: keel.SpanModelCall, Name: "m", Step: 1, Start: t0.Add(3 * time.Second), Status: keel.SpanRunning}
	for _, sp := range []keel.Span{call, root, step} {
		if err := s.StartSpan(c, sp); err != nil {
			t.Fatal(err)
		}
	}
	call.Status, call.Duration, call.PromptTokens, call.Provider, call.Attrs = keel.SpanOK, 250*time.Millisecond, 12, "p", json.RawMessage(`{"route":"x"}`)
	if err := s.FinishSpan(c, call); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(c); err != nil {
		t.Fatal(err)
	}
	open, err := s.RunsWithOpenSpans(c)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(open, []keel.RunID{r.ID}) {
		t.Errorf("RunsWithOpenSpans = %v, want [%s]", open, r.ID)
	}
	// A span started again (a resumed run's root) replaces the old one.
	root.Start = t0.Add(4 * time.Second)
	if err := s.StartSpan(c, root); err != nil {
		t.Fatal(err)
	}
	got, err := s.Spans(c, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sp := range got {
		ids = append(ids, sp.ID)
	}
	if want := []string{"span_2", "span_3", "span_1"}; !slices.Equal(ids, want) {
		t.Fatalf("Spans = %v, want %v (start order)", ids, want)
	}
	if g := got[1]; g.Status != keel.SpanOK || g.Duration != call.Duration || g.PromptTokens != 12 || g.Provider != "p" || string(g.Attrs) != `{"route":"x"}` || g.Name != "m" || g.ParentID != "span_2" {
		t.Errorf("finished span = %+v, want %+v", g, call)
	}
	for _, sp := range []keel.Span{root, step} {
		sp.Status = keel.SpanOK
		if err := s.FinishSpan(c, sp); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Sync(c); err != nil {
		t.Fatal(err)
	}
	if open, _ := s.RunsWithOpenSpans(c); len(open) != 0 {
		t.Errorf("RunsWithOpenSpans after every span finished = %v, want none", open)
	}
}
