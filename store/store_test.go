package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/store"
)

func open(t *testing.T, path string) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatalf("Open(%s) = %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newRun(id string) keel.Run {
	now := time.Unix(1700000000, 0).UTC()
	return keel.Run{ID: keel.RunID(id), Goal: "g", Model: "m", Status: keel.RunQueued, MaxSteps: 3, CreatedAt: now, UpdatedAt: now}
}

func TestAppendSequencesAndStatus(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keel.db")
	s := open(t, path)
	if err := s.CreateRun(ctx, newRun("r1")); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateRun(ctx, newRun("r1")); !errors.Is(err, keel.ErrConflict) {
		t.Fatalf("CreateRun(duplicate) = %v, want ErrConflict", err)
	}
	at := time.Unix(1700000001, 0)
	for i, typ := range []keel.EventType{keel.EventRunStarted, keel.EventModelResult, keel.EventRunSucceeded} {
		var upd *keel.RunUpdate
		switch typ {
		case keel.EventRunStarted:
			upd = &keel.RunUpdate{Status: keel.RunRunning}
		case keel.EventRunSucceeded:
			upd = &keel.RunUpdate{Status: keel.RunSucceeded, Result: "42"}
		}
		ev, err := s.Append(ctx, "r1", typ, at, json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), upd)
		if err != nil {
			t.Fatalf("Append(%s) = %v", typ, err)
		}
		if ev.Seq != int64(i+1) {
			t.Errorf("Append(%s).Seq = %d, want %d", typ, ev.Seq, i+1)
		}
	}
	if _, err := s.Append(ctx, "nope", keel.EventRunStarted, at, nil, nil); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("Append(unknown run) = %v, want ErrNotFound", err)
	}
	s.Close()

	// Everything survives a reopen.
	s = open(t, path)
	r, err := s.GetRun(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != keel.RunSucceeded || r.Result != "42" || r.LastSeq != 3 {
		t.Errorf("GetRun = %+v, want succeeded/42/last_seq 3", r)
	}
	evs, err := s.Events(ctx, "r1", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Seq != 2 || evs[1].Type != keel.EventRunSucceeded || string(evs[1].Data) != `{"i":2}` {
		t.Errorf("Events(after 1) = %+v", evs)
	}
	if _, err := s.GetRun(ctx, "nope"); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("GetRun(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := s.Events(ctx, "nope", 0); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("Events(unknown) = %v, want ErrNotFound", err)
	}
}

// TestLifecycleEnforced: the store refuses a status change the lifecycle
// does not allow and any event after a terminal state, and keeps the
// journal unchanged when it does.
func TestLifecycleEnforced(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "keel.db"))
	if err := s.CreateRun(ctx, newRun("r")); err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1700000001, 0)
	step := func(typ keel.EventType, to keel.RunStatus) error {
		var upd *keel.RunUpdate
		if to != "" {
			upd = &keel.RunUpdate{Status: to}
		}
		_, err := s.Append(ctx, "r", typ, at, nil, upd)
		return err
	}
	if err := step(keel.EventRunSucceeded, keel.RunSucceeded); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("queued → succeeded = %v, want ErrConflict", err)
	}
	for _, tr := range []struct {
		typ keel.EventType
		to  keel.RunStatus
	}{{keel.EventRunStarted, keel.RunRunning}, {keel.EventRunWaiting, keel.RunWaiting}, {keel.EventRunInterrupted, keel.RunInterrupted},
		{keel.EventRunResumed, keel.RunRunning}, {keel.EventRunCancelled, keel.RunCancelled}} {
		if err := step(tr.typ, tr.to); err != nil {
			t.Fatalf("→ %s: %v", tr.to, err)
		}
	}
	if err := step(keel.EventRunResumed, keel.RunRunning); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("cancelled → running = %v, want ErrConflict", err)
	}
	if err := step(keel.EventModelResult, ""); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("an event after the end = %v, want ErrConflict", err)
	}
	if r, _ := s.GetRun(ctx, "r"); r.Status != keel.RunCancelled || r.LastSeq != 5 {
		t.Errorf("run = %s at seq %d, want cancelled at 5", r.Status, r.LastSeq)
	}
}

func TestConcurrentAppendsAreGapless(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "keel.db"))
	const runs, per = 4, 25
	for r := 0; r < runs; r++ {
		if err := s.CreateRun(ctx, newRun(fmt.Sprint("r", r))); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for r := 0; r < runs; r++ {
		for w := 0; w < 2; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < per; i++ {
					if _, err := s.Append(ctx, keel.RunID(fmt.Sprint("r", r)), keel.EventModelResult, time.Now(), nil, nil); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	for r := 0; r < runs; r++ {
		evs, err := s.Events(ctx, keel.RunID(fmt.Sprint("r", r)), 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 2*per {
			t.Fatalf("run %d has %d events, want %d", r, len(evs), 2*per)
		}
		for i, ev := range evs {
			if ev.Seq != int64(i+1) {
				t.Fatalf("run %d event %d has seq %d", r, i, ev.Seq)
			}
		}
	}
}

// openCollecting opens a store on a new file whose lazy-write errors are
// kept; lazyErrs syncs the store and returns (and forgets) those so far.
func openCollecting(t *testing.T) (s *store.Store, lazyErrs func() []error) {
	t.Helper()
	var mu sync.Mutex
	var errs []error
	s, err := store.OpenWith(context.Background(), filepath.Join(t.TempDir(), "keel.db"), store.Options{OnLazyError: func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, func() []error {
		t.Helper()
		if err := s.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		out := errs
		errs = nil
		return out
	}
}

func TestSpansAndStatusQueries(t *testing.T) {
	ctx := context.Background()
	s, lazyErrs := openCollecting(t)
	var pending []error
	lazyErr := func() error {
		t.Helper()
		pending = append(pending, lazyErrs()...)
		if len(pending) == 0 {
			return nil
		}
		err := pending[0]
		pending = pending[1:]
		return err
	}
	for _, id := range []string{"a", "b"} {
		if err := s.CreateRun(ctx, newRun(id)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Append(ctx, "a", keel.EventRunStarted, time.Now(), nil, &keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		t.Fatal(err)
	}
	got, err := s.RunsWithStatus(ctx, keel.RunRunning)
	if err != nil || len(got) != 1 || got[0].ID != "a" {
		t.Errorf("RunsWithStatus(running) = %v, %v; want [a]", got, err)
	}
	start := time.Unix(1700000000, 5).UTC()
	sp := keel.Span{ID: "s1", RunID: "a", Kind: keel.SpanModelCall, Name: "tiny", Step: 1, Start: start}
	if err := s.StartSpan(ctx, sp); err != nil {
		t.Fatal(err)
	}
	sp.Duration, sp.Status, sp.PromptTokens, sp.CompletionTokens = 1500*time.Millisecond, keel.SpanOK, 12, 34
	sp.Provider, sp.CostUSD, sp.TTFT, sp.Retries, sp.FinishReason = "ollama", 0.25, 80*time.Millisecond, 2, "stop"
	sp.Attrs = json.RawMessage(`{"route":"default"}`)
	if err := s.FinishSpan(ctx, sp); err != nil {
		t.Fatal(err)
	}
	// Span writes are lazy: not visible until a status change or Sync
	// carries them (or lazyDelay passes).
	if err := lazyErr(); err != nil {
		t.Fatalf("span writes failed: %v", err)
	}
	if err := s.FinishSpan(ctx, keel.Span{ID: "missing"}); err != nil {
		t.Fatal(err)
	}
	if err := lazyErr(); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("FinishSpan(missing) reported %v, want ErrNotFound", err)
	}
	spans, err := s.Spans(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	want := keel.Span{ID: "s1", RunID: "a", Kind: keel.SpanModelCall, Name: "tiny", Step: 1, Start: start,
		Duration: 1500 * time.Millisecond, Status: keel.SpanOK, PromptTokens: 12, CompletionTokens: 34,
		Provider: "ollama", CostUSD: 0.25, TTFT: 80 * time.Millisecond, Retries: 2, FinishReason: "stop", Attrs: json.RawMessage(`{"route":"default"}`)}
	if diff := cmp.Diff([]keel.Span{want}, spans); diff != "" {
		t.Errorf("Spans(a) mismatch (-want +got):\n%s", diff)
	}
	if err := s.StartSpan(ctx, keel.Span{ID: "s2", RunID: "nope", Kind: keel.SpanToolCall, Start: start}); err != nil {
		t.Fatal(err)
	}
	if err := lazyErr(); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("StartSpan(unknown run) reported %v, want ErrConflict (foreign key)", err)
	}
}

// openLazy opens a store on a new file whose lazy writes wait an hour
// unless something commits them, with run "a" created, and a second
// handle on the file, which sees only what is committed.
func openLazy(t *testing.T) (s, other *store.Store) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keel.db")
	s = open(t, path)
	s.SetLazyDelay(time.Hour)
	if err := s.CreateRun(context.Background(), newRun("a")); err != nil {
		t.Fatal(err)
	}
	return s, open(t, path)
}

// TestLazySpansCommitWithAStatusChange: a span waits (here for good: the
// lazy delay is an hour) through appends that change no status; a
// status change has it committed right after, with no further write;
// Spans on the writing handle sees what waits at once; with nothing after it
// a span commits when the delay is over; a span finished with
// FinishSpanWithNext commits with the next append of any kind.
func TestLazySpansCommitWithAStatusChange(t *testing.T) {
	ctx := context.Background()
	s, other := openLazy(t)
	visible := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			spans, err := other.Spans(ctx, "a")
			if err != nil {
				t.Fatal(err)
			}
			if len(spans) == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("another reader sees %d spans after 10 s, want %d", len(spans), n)
			}
		}
	}
	sp := keel.Span{ID: "s1", RunID: "a", Kind: keel.SpanModelCall, Start: time.Now()}
	if err := s.StartSpan(ctx, sp); err != nil {
		t.Fatal(err)
	}
	sp.Status = keel.SpanOK
	if err := s.FinishSpan(ctx, sp); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "a", keel.EventHumanMessage, time.Now(), nil, nil); err != nil {
		t.Fatal(err)
	}
	if spans, err := other.Spans(ctx, "a"); err != nil || len(spans) != 0 {
		t.Errorf("after an event that changes no status, another reader sees spans %+v, %v; want none yet", spans, err)
	}
	if _, err := s.Append(ctx, "a", keel.EventRunStarted, time.Now(), nil, &keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		t.Fatal(err)
	}
	visible(1)
	// The writing handle reads what still waits.
	if err := s.StartSpan(ctx, keel.Span{ID: "s1b", RunID: "a", Kind: keel.SpanToolCall, Start: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if spans, err := s.Spans(ctx, "a"); err != nil || len(spans) != 2 || spans[0].Status != keel.SpanOK {
		t.Fatalf("with a span waiting, the writing handle reads spans %+v, %v; want s1 finished and s1b", spans, err)
	}
	visible(2)

	s.SetLazyDelay(10 * time.Millisecond)
	if err := s.StartSpan(ctx, keel.Span{ID: "s2", RunID: "a", Kind: keel.SpanToolCall, Start: time.Now()}); err != nil {
		t.Fatal(err)
	}
	visible(3)

	// A span finished with FinishSpanWithNext commits with any next write.
	s.SetLazyDelay(time.Hour)
	s3 := keel.Span{ID: "s3", RunID: "a", Kind: keel.SpanModelCall, Start: time.Now()}
	if err := s.StartSpan(ctx, s3); err != nil {
		t.Fatal(err)
	}
	s3.Status, s3.Error, s3.PromptTokens = keel.SpanError, "overloaded", 7
	if err := s.FinishSpanWithNext(ctx, s3); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "a", keel.EventStepRetry, time.Now(), nil, nil); err != nil {
		t.Fatal(err)
	}
	if spans, err := other.Spans(ctx, "a"); err != nil || len(spans) != 4 || spans[3].PromptTokens != 7 {
		t.Fatalf("after the next event, another reader sees spans %+v, %v; want s3 with what it spent", spans, err)
	}
}

// TestGroupCommitIsolatesFailures: writes that share a transaction fail
// alone. Concurrent appends, some to a run that does not exist and some
// to an ended run, all run in batches; the good ones are kept and
// numbered gaplessly, the bad ones fail with their own error.
func TestGroupCommitIsolatesFailures(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "keel.db"))
	for _, id := range []string{"good", "ended"} {
		if err := s.CreateRun(ctx, newRun(id)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Append(ctx, "ended", keel.EventRunCancelled, time.Now(), nil, &keel.RunUpdate{Status: keel.RunCancelled}); err != nil {
		t.Fatal(err)
	}
	const n = 200
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := keel.RunID([]string{"good", "missing", "ended"}[i%3])
			_, errs[i] = s.Append(ctx, id, keel.EventHumanMessage, time.Now(), json.RawMessage(`{}`), nil)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		switch i % 3 {
		case 0:
			if err != nil {
				t.Errorf("append %d to good: %v", i, err)
			}
		case 1:
			if !errors.Is(err, keel.ErrNotFound) {
				t.Errorf("append %d to a missing run = %v, want ErrNotFound", i, err)
			}
		case 2:
			if !errors.Is(err, keel.ErrConflict) {
				t.Errorf("append %d to an ended run = %v, want ErrConflict", i, err)
			}
		}
	}
	evs, err := s.Events(ctx, "good", 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := (n + 2) / 3; len(evs) != want {
		t.Fatalf("good has %d events, want %d", len(evs), want)
	}
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d: not gapless", i, ev.Seq)
		}
	}
}

func TestDaySpendingAccumulates(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keel.db")
	s := open(t, path)
	if tok, usd, err := s.DaySpent(ctx, "2026-11-29"); tok != 0 || usd != 0 || err != nil {
		t.Errorf("DaySpent(no record) = %d, %v, %v; want zero", tok, usd, err)
	}
	for range 3 {
		if err := s.AddDaySpent(ctx, "2026-11-29", 100, 0.5); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddDaySpent(ctx, "2026-11-30", 7, 0); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, path)
	if tok, usd, err := s.DaySpent(ctx, "2026-11-29"); tok != 300 || usd != 1.5 || err != nil {
		t.Errorf("DaySpent after reopen = %d, %v, %v; want 300, 1.5", tok, usd, err)
	}
}

// BenchmarkAppend measures one journaled event: a synchronous=FULL
// transaction (read last_seq, insert, update run) on a real file.
func BenchmarkAppend(b *testing.B) {
	ctx := context.Background()
	s, err := store.Open(ctx, filepath.Join(b.TempDir(), "keel.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.CreateRun(ctx, newRun("r")); err != nil {
		b.Fatal(err)
	}
	data := json.RawMessage(`{"step":1,"content":"hello"}`)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.Append(ctx, "r", keel.EventModelResult, time.Now(), data, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func TestToolAudit(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "keel.db"))
	at := time.Unix(1700000000, 0).UTC()
	recs := []keel.ToolAudit{
		{Time: at, Tool: "readfile", Version: "0.1.0", SHA256: "aa", RunID: "run_1", Step: 2, CallID: "c1", ArgsSHA256: "h1", Grants: []string{"fs:/workspace=ro"}, Outcome: "ok", Duration: time.Millisecond},
		{Time: at, Tool: "wordcount", ArgsSHA256: "h2", Outcome: string(keel.ToolInvalidInput), Error: "bad", Duration: 2 * time.Millisecond},
		{Time: at, Tool: "readfile", ArgsSHA256: "h3", Outcome: string(keel.ToolPermissionDenied)},
	}
	for _, r := range recs {
		if _, err := s.RecordToolCall(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	all, err := s.ToolCalls(ctx, "", 10)
	if err != nil || len(all) != 3 || all[0].ArgsSHA256 != "h3" {
		t.Fatalf("ToolCalls(all) = %+v, %v; want 3 newest first", all, err)
	}
	rf, err := s.ToolCalls(ctx, "readfile", 10)
	if err != nil || len(rf) != 2 {
		t.Fatalf("ToolCalls(readfile) = %d records, %v; want 2", len(rf), err)
	}
	got := rf[1]
	got.ID = 0
	if fmt.Sprint(got) != fmt.Sprint(recs[0]) {
		t.Errorf("round trip = %+v, want %+v", got, recs[0])
	}
	if one, _ := s.ToolCalls(ctx, "", 1); len(one) != 1 {
		t.Errorf("limit 1 returned %d", len(one))
	}

	// A queued record commits with the next write of any kind, not alone.
	if err := s.CreateRun(ctx, newRun("run_1")); err != nil {
		t.Fatal(err)
	}
	commits := s.Commits()
	if err := s.QueueToolCall(keel.ToolAudit{Time: at, Tool: "wordcount", RunID: "run_1", ArgsSHA256: "h4", Outcome: "ok"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "run_1", keel.EventToolResult, at, json.RawMessage(`{}`), nil); err != nil {
		t.Fatal(err)
	}
	if n := s.Commits() - commits; n != 1 {
		t.Errorf("a queued audit record and the append after it took %d commits, want 1", n)
	}
	if last, err := s.ToolCalls(ctx, "", 1); err != nil || len(last) != 1 || last[0].ArgsSHA256 != "h4" {
		t.Errorf("newest audit record = %+v, %v; want the queued one", last, err)
	}
}

func TestToolGrantsPersist(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keel.db")
	s := open(t, path)
	g := capabilities.Grants{FS: []capabilities.FSGrant{{HostPath: "/srv/notes", GuestPath: "/workspace", ReadOnly: true}}, Network: []string{"https://example.com:443"}}
	if err := s.SetToolGrants(ctx, "readfile", store.ToolGrant{SHA256: "aa", Grants: g}, time.Now()); err != nil {
		t.Fatal(err)
	}
	// A later grant rebinds the row to another module.
	if err := s.SetToolGrants(ctx, "readfile", store.ToolGrant{SHA256: "bb", Grants: g}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s.SetToolGrants(ctx, "fetch", store.ToolGrant{SHA256: "cc"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s.SetToolGrants(ctx, "gone", store.ToolGrant{SHA256: "dd", Grants: g}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteToolGrants(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, path)
	all, err := s.ToolGrants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || !reflect.DeepEqual(all["readfile"], store.ToolGrant{SHA256: "bb", Grants: g}) {
		t.Errorf("ToolGrants = %+v", all)
	}
	if f, ok := all["fetch"]; !ok || !f.Grants.Empty() || f.SHA256 != "cc" {
		t.Errorf("an empty grant must persist as a decision: %+v, %v", f, ok)
	}
}

func TestRunPolicyPersists(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "keel.db"))
	r := newRun("p")
	r.Policy = keel.RunPolicy{AllowCloud: true, Private: true, BudgetTokens: 5000, BudgetUSD: 0.25,
		Tools: []string{"readfile"}, Deadline: time.Unix(1800000000, 0).UTC(), StepTimeout: 3 * time.Second,
		ModelRetries: 1, ToolRetries: 2, RetryBackoff: time.Second}
	r.Kind, r.ParentID, r.ParentStep, r.Workspace = keel.KindAgent, "parent", "s1", "/home/ada/proj"
	if err := s.CreateRun(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateRun(ctx, newRun("q")); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetRun(ctx, "p")
	if err != nil || !reflect.DeepEqual(got.Policy, r.Policy) || got.ParentID != "parent" || got.ParentStep != "s1" || got.Kind != keel.KindAgent || got.Workspace != r.Workspace {
		t.Errorf("GetRun(p) = %+v, %v; want policy %+v, parent parent/s1, workspace %s", got, err, r.Policy, r.Workspace)
	}
	if kids, err := s.ChildRuns(ctx, "parent"); err != nil || len(kids) != 1 || kids[0].ID != "p" {
		t.Errorf("ChildRuns(parent) = %v, %v; want [p]", kids, err)
	}
	if q, _ := s.GetRun(ctx, "q"); q.KindOrAgent() != keel.KindAgent || q.ParentID != "" {
		t.Errorf("a run created without a kind reads as %q with parent %q", q.Kind, q.ParentID)
	}
	if got, err := s.GetRun(ctx, "q"); err != nil || !got.Policy.IsZero() {
		t.Errorf("GetRun(q).Policy = %+v, %v; want the default", got.Policy, err)
	}
}

// TestAppendAllIsOneWrite: AppendAll numbers its events consecutively,
// stores all or none, and a run's last_seq and updated_at follow its last
// event although runs is written only on a status change.
func TestAppendAllIsOneWrite(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keel.db")
	s := open(t, path)
	if err := s.CreateRun(ctx, newRun("r")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "r", keel.EventRunStarted, time.Now(), nil, &keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		t.Fatal(err)
	}
	last := time.Unix(1800000000, 7).UTC()
	evs, err := s.AppendAll(ctx, "r", []keel.Event{
		{Type: keel.EventModelResult, Time: last.Add(-2), Data: json.RawMessage(`{"step":1}`)},
		{Type: keel.EventToolCall, Time: last.Add(-1), Data: json.RawMessage(`{"step":1}`)},
		{Type: keel.EventToolResult, Time: last, Data: json.RawMessage(`{"step":1}`)},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range evs {
		if ev.Seq != int64(i+2) || ev.RunID != "r" {
			t.Errorf("AppendAll event %d = seq %d of %q, want seq %d of r", i, ev.Seq, ev.RunID, i+2)
		}
	}
	r, err := s.GetRun(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if r.LastSeq != 4 || !r.UpdatedAt.Equal(last) || r.Status != keel.RunRunning {
		t.Errorf("GetRun = last_seq %d, updated %v, %s; want 4, %v, running", r.LastSeq, r.UpdatedAt, r.Status, last)
	}
	// A refused transition stores none of the events that came with it.
	if _, err := s.AppendAll(ctx, "r", []keel.Event{
		{Type: keel.EventModelResult, Time: time.Now()},
		{Type: keel.EventRunStarted, Time: time.Now()},
	}, &keel.RunUpdate{Status: keel.RunQueued}); !errors.Is(err, keel.ErrConflict) {
		t.Fatalf("AppendAll(running → queued) = %v, want ErrConflict", err)
	}
	if got, err := s.Events(ctx, "r", 0); err != nil || len(got) != 4 {
		t.Fatalf("after a refused AppendAll: %d events, %v; want the 4 before it", len(got), err)
	}
	// The writer keeps the run's head in memory; a write it did not make
	// (another handle on the file, which keel never opens) makes its next
	// append fail, and the one after that sees the truth again.
	if _, err := s.Append(ctx, "r", keel.EventHumanMessage, time.Now(), nil, nil); err != nil {
		t.Fatal(err)
	}
	other := open(t, path)
	if _, err := other.Append(ctx, "r", keel.EventHumanMessage, time.Now(), nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "r", keel.EventHumanMessage, time.Now(), nil, nil); !errors.Is(err, keel.ErrConflict) {
		t.Fatalf("append on a stale head = %v, want ErrConflict", err)
	}
	ev, err := s.Append(ctx, "r", keel.EventHumanMessage, time.Now(), nil, nil)
	if err != nil || ev.Seq != 7 {
		t.Fatalf("append after the stale head was dropped = seq %d, %v; want 7", ev.Seq, err)
	}
}

// TestSpanFinishedEarlyOrLate: a span finished before its start was
// committed is written once, finished; one finished after is updated.
// Either way the stored span is the finished one.
func TestSpanFinishedEarlyOrLate(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "keel.db"))
	if err := s.CreateRun(ctx, newRun("a")); err != nil {
		t.Fatal(err)
	}
	start := time.Unix(1700000000, 0).UTC()
	finished := func(id string) keel.Span {
		return keel.Span{ID: id, RunID: "a", Kind: keel.SpanToolCall, Name: "echo", Step: 2, Start: start,
			Duration: 3 * time.Millisecond, Status: keel.SpanError, Error: "boom", Provider: "p", CostUSD: 0.5,
			TTFT: time.Millisecond, Retries: 1, FinishReason: "stop", PromptTokens: 4, CompletionTokens: 5, Attrs: json.RawMessage(`{"k":1}`)}
	}
	for _, id := range []string{"early", "late"} {
		sp := finished(id)
		// Whatever the caller put in the finish fields, a start is a start.
		if err := s.StartSpan(ctx, sp); err != nil {
			t.Fatal(err)
		}
		if id == "late" {
			if err := s.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			got, err := s.Spans(ctx, "a")
			if err != nil || len(got) != 2 || got[1].Status != keel.SpanRunning || got[1].Duration != 0 || got[1].Error != "" {
				t.Fatalf("a started span = %+v, %v; want it running, with no outcome", got, err)
			}
		}
		if err := s.FinishSpan(ctx, sp); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.Spans(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]keel.Span{finished("early"), finished("late")}, got); diff != "" {
		t.Errorf("spans (-want +got):\n%s", diff)
	}
}

// TestWALStaysBounded: under writes that never pause, committed pages
// still move from the WAL into the database file and the WAL is reused,
// so it does not grow with the data. (A checkpointer running beside the
// writer never finished a checkpoint while writes went on, and the WAL
// grew to hundreds of megabytes.)
func TestWALStaysBounded(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keel.db")
	s, err := store.OpenWith(ctx, path, store.Options{Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const runs, each = 20, 400
	data := json.RawMessage(`{"text":"` + strings.Repeat("x", 4000) + `"}`)
	var wg sync.WaitGroup
	errs := make([]error, runs)
	for i := range runs {
		id := keel.RunID(fmt.Sprintf("r%d", i))
		if err := s.CreateRun(ctx, newRun(string(id))); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if _, errs[i] = s.Append(ctx, id, keel.EventRunStarted, time.Now(), nil, &keel.RunUpdate{Status: keel.RunRunning}); errs[i] != nil {
				return
			}
			for range each {
				if _, errs[i] = s.Append(ctx, id, keel.EventHumanMessage, time.Now(), data, nil); errs[i] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	size := func(p string) int64 {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	written := int64(runs * each * len(data))
	if db, wal := size(path), size(path+"-wal"); db < written/2 || wal > written/3 {
		t.Errorf("after %d MB of events: database file %d MB, WAL %d MB; want most in the database and a WAL reused, not grown", written>>20, db>>20, wal>>20)
	}
}

// TestSpansWaitingTogetherFailAlone: spans that wait are inserted several
// to a statement; one that cannot be stored (its run does not exist)
// fails alone, its error goes to OnLazyError, and every other span, in
// the same statement or not, is stored with what it finished with.
func TestSpansWaitingTogetherFailAlone(t *testing.T) {
	ctx := context.Background()
	s, lazyErrs := openCollecting(t)
	if err := s.CreateRun(ctx, newRun("a")); err != nil {
		t.Fatal(err)
	}
	start := time.Unix(1700000000, 0).UTC()
	const n = 21 // more than one statement's worth
	for i := range n {
		sp := keel.Span{ID: fmt.Sprintf("s%02d", i), RunID: "a", Kind: keel.SpanToolCall, Name: "t", Step: i, Start: start.Add(time.Duration(i) * time.Second)}
		if i == 5 {
			sp.RunID = "nope"
		}
		if err := s.StartSpan(ctx, sp); err != nil {
			t.Fatal(err)
		}
		sp.Status, sp.Duration, sp.PromptTokens = keel.SpanOK, time.Millisecond, i
		if err := s.FinishSpan(ctx, sp); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	spans, err := s.Spans(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sp := range spans {
		if sp.Status != keel.SpanOK || sp.PromptTokens != sp.Step || sp.Duration != time.Millisecond {
			t.Errorf("span %s stored as %+v, want it finished", sp.ID, sp)
		}
		got = append(got, sp.ID)
	}
	var want []string
	for i := range n {
		if i != 5 {
			want = append(want, fmt.Sprintf("s%02d", i))
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("spans stored %v, want %v", got, want)
	}
	if errs := lazyErrs(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "s05") {
		t.Errorf("lazy errors %v, want one, for span s05", errs)
	}
}

// TestWaitCommitsItsSpans: a run that starts waiting for a person commits
// the spans queued so far (the wait's own among them) in the same
// transaction, so they are on disk when the append returns, where a run
// ending has them committed just after.
func TestWaitCommitsItsSpans(t *testing.T) {
	ctx := context.Background()
	s, other := openLazy(t)
	if _, err := s.Append(ctx, "a", keel.EventRunStarted, time.Now(), nil, &keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		t.Fatal(err)
	}
	wait := keel.Span{ID: "wait", RunID: "a", Kind: keel.SpanHuman, Start: time.Now()}
	if err := s.StartSpan(ctx, wait); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "a", keel.EventApprovalAsked, time.Now(), nil, &keel.RunUpdate{Status: keel.RunWaiting}); err != nil {
		t.Fatal(err)
	}
	if spans, err := other.Spans(ctx, "a"); err != nil || len(spans) != 1 || spans[0].ID != "wait" || spans[0].Status != keel.SpanRunning {
		t.Fatalf("when the wait is journaled, another reader sees spans %+v, %v; want the wait, running", spans, err)
	}
}

// TestFinishSpanKeepsWhatOnlyASpanRecords: FinishSpan decides when a span
// commits. A failed model call's span (the only record of what it spent)
// and a person's wait commit with the next write of any kind, as the
// journal's events do; other spans keep waiting (here for good: the lazy
// delay is an hour) for a status change.
func TestFinishSpanKeepsWhatOnlyASpanRecords(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		kind     keel.SpanKind
		status   keel.SpanStatus
		withNext bool
	}{
		{keel.SpanModelCall, keel.SpanError, true},
		{keel.SpanHuman, keel.SpanOK, true},
		{keel.SpanHuman, keel.SpanError, true},
		{keel.SpanModelCall, keel.SpanOK, false},
		{keel.SpanToolCall, keel.SpanError, false},
		{keel.SpanRetry, keel.SpanOK, false},
	} {
		t.Run(string(tt.kind)+"/"+string(tt.status), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, other := openLazy(t)
			sp := keel.Span{ID: "s1", RunID: "a", Kind: tt.kind, Start: time.Now()}
			if err := s.StartSpan(ctx, sp); err != nil {
				t.Fatal(err)
			}
			sp.Status, sp.PromptTokens = tt.status, 7
			if err := s.FinishSpan(ctx, sp); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Append(ctx, "a", keel.EventHumanMessage, time.Now(), nil, nil); err != nil {
				t.Fatal(err)
			}
			spans, err := other.Spans(ctx, "a")
			if err != nil {
				t.Fatal(err)
			}
			if got := len(spans) == 1; got != tt.withNext {
				t.Errorf("after the next append, another reader sees %d spans; committed with it = %v, want %v", len(spans), got, tt.withNext)
			}
		})
	}
}
