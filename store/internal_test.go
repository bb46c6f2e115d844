package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
)

// migratedTo returns a new database file, and a handle on it, holding
// the schema of version n: migrations 1 to n applied as Open applies
// them, for a test to fill as an older keel would have before it opens
// the file with Open.
func migratedTo(t *testing.T, n int) (string, *sql.DB) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keel.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	names, err := migrations.ReadDir("migrations")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		for _, e := range names {
			if strings.HasPrefix(e.Name(), fmt.Sprintf("%03d_", i)) {
				body, _ := migrations.ReadFile("migrations/" + e.Name())
				if _, err := db.Exec(string(body)); err != nil {
					t.Fatalf("migration %s: %v", e.Name(), err)
				}
			}
		}
	}
	if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", n)); err != nil {
		t.Fatal(err)
	}
	return path, db
}

// TestMigrateEventsByNumber: a journal written before migration 008 (events
// keyed by run ID and sequence number) reads back the same after it, and
// old runs append where they left off.
func TestMigrateEventsByNumber(t *testing.T) {
	ctx := context.Background()
	path, db := migratedTo(t, 7)
	at := time.Unix(1700000000, 0).UTC()
	for _, id := range []string{"run_b", "run_a"} {
		if _, err := db.ExecContext(ctx, `INSERT INTO runs (id, goal, model, status, max_steps, created_at, updated_at) VALUES (?, 'g', 'm', 'running', 4, ?, ?)`, id, nanos(at), nanos(at)); err != nil {
			t.Fatal(err)
		}
		for seq := 1; seq <= 3; seq++ {
			if _, err := db.ExecContext(ctx, `INSERT INTO events (run_id, seq, type, time, data) VALUES (?, ?, 'human.message', ?, ?)`,
				id, seq, nanos(at.Add(time.Duration(seq)*time.Second)), fmt.Sprintf(`{"content":"%s %d"}`, id, seq)); err != nil {
				t.Fatal(err)
			}
		}
	}
	db.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, id := range []keel.RunID{"run_a", "run_b"} {
		evs, err := s.Events(ctx, id, 1)
		if err != nil || len(evs) != 2 {
			t.Fatalf("Events(%s, 1) = %d events, %v; want 2", id, len(evs), err)
		}
		for i, ev := range evs {
			want := fmt.Sprintf(`{"content":"%s %d"}`, id, i+2)
			if ev.Seq != int64(i+2) || ev.RunID != id || string(ev.Data) != want || !ev.Time.Equal(at.Add(time.Duration(i+2)*time.Second)) {
				t.Errorf("%s event %d = %+v, want seq %d %s", id, i, ev, i+2, want)
			}
		}
		r, err := s.GetRun(ctx, id)
		if err != nil || r.LastSeq != 3 || !r.UpdatedAt.Equal(at.Add(3*time.Second)) {
			t.Errorf("GetRun(%s) = last_seq %d, updated %v, %v; want 3 and its last event's time", id, r.LastSeq, r.UpdatedAt, err)
		}
		if ev, err := s.Append(ctx, id, keel.EventHumanMessage, at, json.RawMessage(`{}`), nil); err != nil || ev.Seq != 4 {
			t.Errorf("append to %s after the migration = seq %d, %v; want 4", id, ev.Seq, err)
		}
	}
	// A new run gets the next number: its events follow the old ones.
	if err := s.CreateRun(ctx, keel.Run{ID: "run_c", Goal: "g", Model: "m", Status: keel.RunQueued, MaxSteps: 4, CreatedAt: at, UpdatedAt: at}); err != nil {
		t.Fatal(err)
	}
	var nums []int64
	rows, err := s.r.QueryContext(ctx, `SELECT num FROM runs ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n int64
		rows.Scan(&n)
		nums = append(nums, n)
	}
	rows.Close()
	if fmt.Sprint(nums) != "[2 1 3]" {
		t.Errorf("run numbers of run_a, run_b, run_c = %v, want [2 1 3] (in order of creation)", nums)
	}
	if evs, err := s.Events(ctx, "run_c", 0); err != nil || len(evs) != 0 {
		t.Errorf("Events(run_c) = %v, %v; want none", evs, err)
	}
	if _, err := s.Events(ctx, "run_none", 0); err == nil {
		t.Error("Events of a run that does not exist succeeded")
	}
}

// TestMigrateGrantsCoverSidecar: migration 011 marks the grants bound to a
// .wasm file's digest alone "wasm:", for the daemon to bind to the grant
// digest, and leaves rows never bound (no digest) as they are.
func TestMigrateGrantsCoverSidecar(t *testing.T) {
	ctx := context.Background()
	path, db := migratedTo(t, 10)
	for tool, sum := range map[string]string{"bound": "ab12", "unbound": ""} {
		if _, err := db.ExecContext(ctx, `INSERT INTO tool_grants (tool, sha256, grants, updated_at) VALUES (?, ?, '{}', 1)`, tool, sum); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows, err := s.ToolGrants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := rows["bound"].SHA256; got != "wasm:ab12" {
		t.Errorf("row bound to ab12 = %q after migration 011, want wasm:ab12", got)
	}
	if got := rows["unbound"].SHA256; got != "" {
		t.Errorf("row never bound = %q after migration 011, want empty", got)
	}
}

// TestAppendAllUndoesItsInserts: an append whose later insert fails (here
// a key another handle took, which keel never does) removes the events
// its earlier inserts stored, so none of them is kept.
func TestAppendAllUndoesItsInserts(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keel.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := time.Unix(1700000000, 0).UTC()
	if err := s.CreateRun(ctx, keel.Run{ID: "r", Goal: "g", Model: "m", Status: keel.RunQueued, MaxSteps: 4, CreatedAt: at, UpdatedAt: at}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "r", keel.EventRunStarted, at, nil, &keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The append below stores seq 2 to 7; seq 6 is in its second insert.
	taken := eventKey(1, 6)
	if _, err := db.ExecContext(ctx, `INSERT INTO events (key, type, time, data) VALUES (?, 'human.message', 0, NULL)`, taken); err != nil {
		t.Fatal(err)
	}
	// A span that commits with the append: the transaction holds more
	// than the failing write, so it commits without the append's events.
	sp := keel.Span{ID: "s", RunID: "r", Kind: keel.SpanModelCall, Start: at, Status: keel.SpanError}
	if err := s.StartSpan(ctx, sp); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishSpanWithNext(ctx, sp); err != nil {
		t.Fatal(err)
	}
	evs := make([]keel.Event, 6)
	for i := range evs {
		evs[i] = keel.Event{Type: keel.EventHumanMessage, Time: at}
	}
	if _, err := s.AppendAll(ctx, "r", evs, nil); !errors.Is(err, keel.ErrConflict) {
		t.Fatalf("AppendAll over a taken key = %v, want ErrConflict", err)
	}
	if spans, err := s.Spans(ctx, "r"); err != nil || len(spans) != 1 {
		t.Fatalf("spans = %+v, %v; want the one committed with the failed append", spans, err)
	}
	var seqs []int64
	got, err := s.Events(ctx, "r", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range got {
		seqs = append(seqs, ev.Seq)
	}
	if fmt.Sprint(seqs) != "[1 6]" {
		t.Errorf("after the failed append, events %v are stored, want [1 6]: none of the append's", seqs)
	}
}

// goid is the calling goroutine's ID, from its stack's first line.
func goid() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := strings.Fields(string(buf))
	return f[1] // "goroutine N [running]:"
}

// TestWhoCommits: a write that finds the writer idle is committed on its
// caller's goroutine; writes queued during a commit wait for it to end
// and are then committed together, on another goroutine, in order; once
// they are done the writer is idle again; Close commits what is queued.
func TestWhoCommits(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	nop := func(context.Context, *wtx) error { return nil }

	var ran string
	if err := s.wr.write(ctx, func(context.Context, *wtx) error { ran = goid(); return nil }); err != nil {
		t.Fatal(err)
	}
	if me := goid(); ran != me {
		t.Errorf("a lone write ran on goroutine %s, want its caller's (%s)", ran, me)
	}

	// One write holds the writer; 20 more queue behind it.
	hold, held := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- s.wr.write(ctx, func(context.Context, *wtx) error { close(held); <-hold; return nil })
	}()
	<-held
	const n = 20
	var (
		mu      sync.Mutex
		order   []int
		callers = map[string]bool{}
		runners = map[string]bool{}
	)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			mu.Lock()
			callers[goid()] = true
			mu.Unlock()
			errs <- s.wr.write(ctx, func(context.Context, *wtx) error {
				mu.Lock()
				defer mu.Unlock()
				order = append(order, i)
				runners[goid()] = true
				return nil
			})
		}()
		// Queue them one at a time, so their order is known.
		for {
			s.wr.mu.Lock()
			queued := len(s.wr.pending)
			s.wr.mu.Unlock()
			if queued == i+1 {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	mu.Lock()
	if len(order) != 0 {
		t.Errorf("%d writes ran while another write's commit was under way", len(order))
	}
	mu.Unlock()
	before := s.Commits()
	close(hold)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Commits() - before; got != 2 {
		t.Errorf("the held write and the %d queued behind it took %d commits, want 2", n, got)
	}
	if fmt.Sprint(order) != fmt.Sprint([]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}) {
		t.Errorf("queued writes ran in order %v, want the order they were queued in", order)
	}
	for g := range runners {
		if callers[g] {
			t.Errorf("a queued write ran on a caller's goroutine (%s), want the writer's", g)
		}
	}

	if err := s.wr.write(ctx, func(context.Context, *wtx) error { ran = goid(); return nil }); err != nil {
		t.Fatal(err)
	}
	if me := goid(); ran != me {
		t.Errorf("after the queue drained, a lone write ran on goroutine %s, want its caller's (%s)", ran, me)
	}

	// Close while a commit is under way and a write is queued: both commit.
	hold, held = make(chan struct{}), make(chan struct{})
	go func() {
		first <- s.wr.write(ctx, func(context.Context, *wtx) error { close(held); <-hold; return nil })
	}()
	<-held
	go func() { errs <- s.wr.write(ctx, nop) }()
	for {
		s.wr.mu.Lock()
		queued := len(s.wr.pending)
		s.wr.mu.Unlock()
		if queued == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a commit was under way", err)
	default:
	}
	close(hold)
	if err := <-first; err != nil {
		t.Errorf("the write under way at Close: %v", err)
	}
	if err := <-errs; err != nil {
		t.Errorf("the write queued at Close: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if err := s.wr.write(ctx, nop); !errors.Is(err, errClosed) {
		t.Errorf("a write after Close = %v, want errClosed", err)
	}
}

// TestSpansSeeSpansBeingCommitted: Spans returns every span finished
// before it was called, also when the transaction that carries them is
// under way (here held inside by a write that waits). Spans used to read
// the database at once when nothing was left waiting, and so missed them:
// a failed model call's span, the only record of what it spent, was then
// missing from a run's budget (engine: what a sub-agent may spend).
func TestSpansSeeSpansBeingCommitted(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.SetLazyDelay(time.Hour)
	now := time.Now().UTC()
	if err := s.CreateRun(ctx, keel.Run{ID: "a", Goal: "g", Model: "m", Status: keel.RunQueued, MaxSteps: 1, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	sp := keel.Span{ID: "s1", RunID: "a", Kind: keel.SpanModelCall, Start: now}
	if err := s.StartSpan(ctx, sp); err != nil {
		t.Fatal(err)
	}
	sp.Status, sp.Error, sp.PromptTokens = keel.SpanError, "timeout", 40
	if err := s.FinishSpanWithNext(ctx, sp); err != nil {
		t.Fatal(err)
	}
	// The next write carries the span, and waits inside its transaction.
	inside, release := make(chan struct{}), make(chan struct{})
	wrote := make(chan error, 1)
	go func() {
		wrote <- s.wr.write(ctx, func(context.Context, *wtx) error { close(inside); <-release; return nil })
	}()
	<-inside
	got := make(chan []keel.Span, 1)
	go func() {
		spans, err := s.Spans(ctx, "a")
		if err != nil {
			t.Error(err)
		}
		got <- spans
	}()
	// Release the transaction once Spans waits for it (it queued a write
	// behind it), or check what Spans returned without waiting.
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	var spans []keel.Span
	released := false
wait:
	for {
		select {
		case spans = <-got:
			break wait
		case <-tick.C:
			s.wr.mu.Lock()
			queued := len(s.wr.pending) > 0
			s.wr.mu.Unlock()
			if queued && !released {
				close(release)
				released = true
			}
		}
	}
	if !released {
		close(release)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if len(spans) != 1 || spans[0].PromptTokens != 40 || spans[0].Status != keel.SpanError {
		t.Errorf("Spans during the commit that carries span s1 = %+v, want s1 failed with 40 prompt tokens", spans)
	}
}
