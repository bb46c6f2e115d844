package store

import (
	"context"
	"database/sql"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

//go:embed migrations/*.sql
var migrations embed.FS

// ErrDiskFull is returned when SQLite cannot write because the disk is
// full. Nothing of the failed write is stored; earlier data is intact.
var ErrDiskFull = errors.New("disk full")

// Store is the SQLite-backed repository of runs, events and spans.
type Store struct {
	w  *sql.DB // single writer connection, used by wr
	r  *sql.DB // reader pool
	wr *writer
}

// Options tune a Store. The zero value is what keel uses.
type Options struct {
	// Synchronous is SQLite's synchronous setting: "FULL" (the default:
	// a committed write survives a power cut) or "NORMAL" (in WAL mode, a
	// committed write survives a crash of the process but the last ones
	// may be lost in a power cut). Benchmarks compare both.
	Synchronous string
	// OnLazyError receives the errors of lazy writes (trace spans), which
	// have no caller waiting for them. Nil drops them.
	OnLazyError func(error)
}

// The writer's hot statements, prepared once (see newWriter).
const (
	// An event's key is (run number << 32) | seq (see migration 008).
	qRunHead = `SELECT status, num, coalesce((SELECT max(key) FROM events WHERE key BETWEEN runs.num << 32 AND (runs.num << 32) | 4294967295) & 4294967295, 0)
		FROM runs WHERE id = ?`
	qDeleteEvents = `DELETE FROM events WHERE key BETWEEN ? AND ?`
	qUpdateRun    = `UPDATE runs SET last_seq = ?, updated_at = ?, status = ?, result = ?, error = ? WHERE id = ?`
	// A span started again (a run's root or step span, reopened when
	// the run resumes) replaces the row it had.
	qInsertSpan = `INSERT OR REPLACE INTO spans (id, run_id, kind, name, step, start, duration, status, error, prompt_tokens, completion_tokens,
		provider, cost_usd, ttft, retries, finish_reason, attrs, parent_id, model_digest, template_hash, prompt_hash)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	qFinishSpan = `UPDATE spans SET duration = ?, status = ?, error = ?, prompt_tokens = ?, completion_tokens = ?,
		provider = ?, cost_usd = ?, ttft = ?, retries = ?, finish_reason = ?, attrs = ?, model_digest = ?, template_hash = ?, prompt_hash = ?
		WHERE run_id = ? AND id = ?`
	qInsertAudit = `INSERT INTO tool_audit (time, tool, version, sha256, run_id, step, call_id, args_sha256, grants, outcome, error, duration, policy, labels, hosts, refused, client)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
)

// insertEvents[n-1] inserts n events in one statement; an append inserts
// up to len(insertEvents) at a time (an agent step journals three).
var insertEvents = func() (qs [4]string) {
	for i := range qs {
		qs[i] = `INSERT INTO events (key, type, time, data) VALUES (?, ?, ?, ?)` + strings.Repeat(`, (?, ?, ?, ?)`, i)
	}
	return qs
}()

// insertSpans[n-1] inserts n spans in one statement; the writer inserts
// the spans that wait together (see writer.commit), up to
// len(insertSpans) at a time.
var insertSpans = func() (qs [8]string) {
	for i := range qs {
		qs[i] = qInsertSpan + strings.Repeat(`, (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, i)
	}
	return qs
}()

var hotStatements = slices.Concat([]string{qRunHead, qDeleteEvents, qUpdateRun, qFinishSpan, qInsertAudit}, insertEvents[:], insertSpans[:])

// Open opens or creates the database at path and applies pending
// migrations, with the default Options.
func Open(ctx context.Context, path string) (*Store, error) {
	return OpenWith(ctx, path, Options{})
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, path string, o Options) (*Store, error) {
	syncMode := "FULL"
	switch strings.ToUpper(o.Synchronous) {
	case "", "FULL":
	case "NORMAL":
		syncMode = "NORMAL"
	default:
		return nil, fmt.Errorf("open %s: synchronous %q: want FULL or NORMAL", path, o.Synchronous)
	}
	dsn := func(writer bool) string {
		q := url.Values{}
		for _, p := range []string{"busy_timeout(10000)", "journal_mode(WAL)", "synchronous(" + syncMode + ")", "foreign_keys(1)"} {
			q.Add("_pragma", p)
		}
		if writer {
			q.Set("_txlock", "immediate")
		}
		return "file:" + path + "?" + q.Encode()
	}
	w, err := sql.Open("sqlite", dsn(true))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetConnMaxIdleTime(0)
	r, err := sql.Open("sqlite", dsn(false))
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	r.SetMaxOpenConns(4)
	s := &Store{w: w, r: r}
	if err := s.migrate(ctx); err != nil {
		s.w.Close()
		s.r.Close()
		return nil, fmt.Errorf("migrate %s: %w", path, err)
	}
	if s.wr, err = newWriter(ctx, w, hotStatements, syncMode == "FULL", o.OnLazyError); err != nil {
		s.w.Close()
		s.r.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return s, nil
}

// Close commits the writes still queued and closes the database.
func (s *Store) Close() error {
	s.wr.close()
	return errors.Join(s.w.Close(), s.r.Close())
}

func (s *Store) migrate(ctx context.Context) error {
	var version int
	if err := s.w.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return mapErr(err)
	}
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		base := strings.TrimPrefix(name, "migrations/")
		n, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return fmt.Errorf("migration %s: bad name", base)
		}
		if n <= version {
			continue
		}
		body, err := migrations.ReadFile(name)
		if err != nil {
			return err
		}
		tx, err := s.w.BeginTx(ctx, nil)
		if err != nil {
			return mapErr(err)
		}
		if _, err := tx.ExecContext(ctx, string(body)); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %s: %w", base, mapErr(err))
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", n)); err != nil {
			tx.Rollback()
			return mapErr(err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migration %s: %w", base, mapErr(err))
		}
	}
	return nil
}

func mapErr(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return keel.ErrNotFound
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_FULL:
			return fmt.Errorf("%w: %v", ErrDiskFull, err)
		case sqlite3.SQLITE_CONSTRAINT:
			return fmt.Errorf("%w: %v", keel.ErrConflict, err)
		}
	}
	return err
}

func nanos(t time.Time) int64 { return t.UTC().UnixNano() }

// maxSeq is the largest sequence number an event key holds.
const maxSeq = 1<<32 - 1

// eventKey is the key of a run's event: its run's number, then its
// sequence number (see migration 008).
func eventKey(num, seq int64) int64 { return num<<32 | seq }

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// CreateRun stores a new run. It fails with keel.ErrConflict if the ID
// exists.
func (s *Store) CreateRun(ctx context.Context, r keel.Run) error {
	fn, err := createRunFunc(r)
	if err != nil {
		return err
	}
	if err := s.wr.write(ctx, fn); err != nil {
		return fmt.Errorf("create run %s: %w", r.ID, mapErr(err))
	}
	return nil
}

// CreateRunWith stores a new run and its first events (as AppendAll) in
// one transaction: after a crash the run is there with its events, or
// not at all.
func (s *Store) CreateRunWith(ctx context.Context, r keel.Run, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error) {
	create, err := createRunFunc(r)
	if err != nil {
		return nil, err
	}
	out, appendOp, err := appendOp(r.ID, evs, upd)
	if err != nil {
		return nil, err
	}
	err = s.wr.write(ctx, func(ctx context.Context, tx *wtx) error {
		if err := create(ctx, tx); err != nil {
			return err
		}
		return appendOp.fn(ctx, tx)
	})
	if err != nil {
		return nil, fmt.Errorf("create run %s: %w", r.ID, mapErr(err))
	}
	return out, nil
}

// createRunFunc is the write that inserts r.
func createRunFunc(r keel.Run) (writeFunc, error) {
	policy := ""
	if !r.Policy.IsZero() {
		b, err := json.Marshal(r.Policy)
		if err != nil {
			return nil, fmt.Errorf("create run %s: policy: %w", r.ID, err)
		}
		policy = string(b)
	}
	var key any
	if r.IdempotencyKey != "" {
		key = r.IdempotencyKey
	}
	return func(ctx context.Context, tx *wtx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO runs (id, goal, model, status, result, error, max_steps, created_at, updated_at, last_seq, policy, idempotency_key, kind, parent_id, parent_step, workspace, num)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?, (SELECT coalesce(max(num), 0) + 1 FROM runs))`,
			string(r.ID), r.Goal, r.Model, string(r.Status), r.Result, r.Error, r.MaxSteps, nanos(r.CreatedAt), nanos(r.UpdatedAt), policy, key,
			string(r.KindOrAgent()), string(r.ParentID), r.ParentStep, r.Workspace)
		return err
	}, nil
}

// Append adds an event to the run's journal with the next sequence number
// and, when upd is not nil, changes the run's status in the same
// transaction. It returns the stored event.
func (s *Store) Append(ctx context.Context, id keel.RunID, typ keel.EventType, at time.Time, data json.RawMessage, upd *keel.RunUpdate) (keel.Event, error) {
	evs, err := s.AppendAll(ctx, id, []keel.Event{{Type: typ, Time: at, Data: data}}, upd)
	if err != nil {
		return keel.Event{}, err
	}
	return evs[0], nil
}

// AppendAll adds events (their Type, Time and Data) to the run's journal
// in one transaction, with consecutive sequence numbers, and when upd is
// not nil changes the run's status with the last of them. Either all are
// stored or none is. It returns the stored events.
func (s *Store) AppendAll(ctx context.Context, id keel.RunID, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error) {
	out, o, err := appendOp(id, evs, upd)
	if err != nil {
		return nil, err
	}
	// A run that starts waiting for a person (or pauses) commits the
	// trace spans queued so far with that change: the wait's own span
	// must survive with the wait. Any other status change (a run ending,
	// above all) has them committed right after it, without waiting for
	// them: the run's end reaches its watchers sooner by the time its
	// trace takes to write (a millisecond or two for fifty steps), and
	// Spans waits for them, so whoever reads the trace then finds it
	// complete.
	c := carryNone
	switch {
	case upd == nil:
	case upd.Status == keel.RunWaiting || upd.Status == keel.RunPaused:
		c = carryWith
	default:
		c = carryAfter
	}
	if err := s.wr.writeOp(ctx, o, c); err != nil {
		return nil, fmt.Errorf("append %s to %s: %w", evs[0].Type, id, err)
	}
	return out, nil
}

// appendOp is the write of AppendAll, and the events it stores (filled
// in when it runs).
func appendOp(id keel.RunID, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, op, error) {
	if len(evs) == 0 {
		return nil, op{}, fmt.Errorf("append to %s: no events", id)
	}
	out := make([]keel.Event, len(evs))
	// Atomic without a savepoint: each statement either takes effect or
	// not, and a failure after the first insert undoes the inserts before
	// it (or, if even that fails, the whole transaction).
	o := op{atomic: true}
	o.fn = func(ctx context.Context, tx *wtx) error {
		head, cached := tx.heads[id]
		if !cached {
			var status string
			if err := tx.QueryRowContext(ctx, qRunHead, string(id)).Scan(&status, &head.num, &head.last); err != nil {
				return mapErr(err)
			}
			head.status = keel.RunStatus(status)
		}
		// The one place the lifecycle is enforced: every status change goes
		// through here, in the transaction that journals its event.
		if cur := head.status; cur.Terminal() || (upd != nil && !keel.CanTransition(cur, upd.Status)) {
			to := cur
			if upd != nil {
				to = upd.Status
			}
			return fmt.Errorf("run is %s, cannot become %s: %w", cur, to, keel.ErrConflict)
		}
		undo := func(err error, n int) error {
			err = mapErr(err)
			if n == 0 {
				return err
			}
			if _, uerr := tx.ExecContext(ctx, qDeleteEvents, eventKey(head.num, head.last+1), eventKey(head.num, head.last+int64(n))); uerr != nil {
				return fmt.Errorf("%w (and undoing it failed: %w)", err, errAbort)
			}
			return err
		}
		// Several at a time: one statement inserts a step's events.
		const per = len(insertEvents)
		for i := 0; i < len(evs); i += per {
			n := min(per, len(evs)-i)
			args := make([]any, 0, 4*n)
			for j := i; j < i+n; j++ {
				ev := evs[j]
				out[j] = keel.Event{RunID: id, Seq: head.last + 1 + int64(j), Type: ev.Type, Time: ev.Time.UTC(), Data: ev.Data}
				args = append(args, eventKey(head.num, out[j].Seq), string(ev.Type), nanos(ev.Time), []byte(ev.Data))
			}
			if _, err := tx.ExecContext(ctx, insertEvents[n-1], args...); err != nil {
				return undo(err, i)
			}
		}
		last := out[len(out)-1]
		if upd != nil {
			if _, err := tx.ExecContext(ctx, qUpdateRun,
				last.Seq, nanos(last.Time), string(upd.Status), upd.Result, upd.Error, string(id)); err != nil {
				return undo(err, len(evs))
			}
			head.status = upd.Status
		}
		head.last = last.Seq
		// Only running runs' heads are kept: they are the ones that
		// append again soon, and their number is bounded by the engine.
		if head.status == keel.RunRunning {
			tx.heads[id] = head
		} else {
			delete(tx.heads, id)
		}
		return nil
	}
	return out, o, nil
}

// runCols are a run's columns as scanRun reads them. A run's last_seq and
// updated_at come from its last event: runs is written only when the
// status changes (see migration 007).
const runCols = `id, goal, model, status, result, error, max_steps, created_at,
	coalesce((SELECT time FROM events WHERE key BETWEEN runs.num << 32 AND (runs.num << 32) | 4294967295 ORDER BY key DESC LIMIT 1), updated_at),
	coalesce((SELECT max(key) FROM events WHERE key BETWEEN runs.num << 32 AND (runs.num << 32) | 4294967295) & 4294967295, 0),
	policy, coalesce(idempotency_key, ''), kind, parent_id, parent_step, workspace`

func scanRun(sc interface{ Scan(...any) error }) (keel.Run, error) {
	var r keel.Run
	var id, status, policy, kind, parent string
	var created, updated int64
	if err := sc.Scan(&id, &r.Goal, &r.Model, &status, &r.Result, &r.Error, &r.MaxSteps, &created, &updated, &r.LastSeq, &policy, &r.IdempotencyKey,
		&kind, &parent, &r.ParentStep, &r.Workspace); err != nil {
		return keel.Run{}, err
	}
	r.Kind, r.ParentID = keel.RunKind(kind), keel.RunID(parent)
	if policy != "" {
		if err := json.Unmarshal([]byte(policy), &r.Policy); err != nil {
			return keel.Run{}, fmt.Errorf("run %s: policy: %w", id, err)
		}
	}
	r.ID, r.Status = keel.RunID(id), keel.RunStatus(status)
	r.CreatedAt, r.UpdatedAt = fromNanos(created), fromNanos(updated)
	return r, nil
}

// GetRun returns one run or keel.ErrNotFound.
func (s *Store) GetRun(ctx context.Context, id keel.RunID) (keel.Run, error) {
	r, err := scanRun(s.r.QueryRowContext(ctx, `SELECT `+runCols+` FROM runs WHERE id = ?`, string(id)))
	if err != nil {
		return keel.Run{}, fmt.Errorf("run %s: %w", id, mapErr(err))
	}
	return r, nil
}

// ListRuns returns up to limit runs, newest first.
func (s *Store) ListRuns(ctx context.Context, limit int) ([]keel.Run, error) {
	return s.queryRuns(ctx, `SELECT `+runCols+` FROM runs ORDER BY created_at DESC, id DESC LIMIT ?`, limit)
}

// ListQuery selects runs for ListRunsPage. The zero value lists the 50
// newest runs.
type ListQuery struct {
	// Limit is the most runs returned; 0 means 50.
	Limit int
	// Statuses, when not empty, keeps only runs in one of them.
	Statuses []keel.RunStatus
	// Cursor, when set, continues a listing after the last run of the
	// page that returned it (its next cursor).
	Cursor string
}

// ListRunsPage returns runs newest first (by creation time, then ID), as
// q selects, and the cursor of the next page: empty when there is none.
// A page is consistent with the ones before it although runs are
// created meanwhile (new runs come before the first page). A cursor
// that no page returned fails with keel.ErrInvalid.
func (s *Store) ListRunsPage(ctx context.Context, q ListQuery) ([]keel.Run, string, error) {
	if q.Limit <= 0 {
		q.Limit = 50
	}
	where, args := []string{}, []any{}
	if len(q.Statuses) > 0 {
		where = append(where, `status IN (?`+strings.Repeat(",?", len(q.Statuses)-1)+`)`)
		for _, st := range q.Statuses {
			args = append(args, string(st))
		}
	}
	if q.Cursor != "" {
		at, id, err := parseCursor(q.Cursor)
		if err != nil {
			return nil, "", err
		}
		where = append(where, `(created_at < ? OR (created_at = ? AND id < ?))`)
		args = append(args, at, at, id)
	}
	query := `SELECT ` + runCols + ` FROM runs`
	if len(where) > 0 {
		query += ` WHERE ` + strings.Join(where, ` AND `)
	}
	query += ` ORDER BY created_at DESC, id DESC LIMIT ?`
	args = append(args, q.Limit+1)
	runs, err := s.queryRuns(ctx, query, args...)
	if err != nil {
		return nil, "", err
	}
	if len(runs) <= q.Limit {
		return runs, "", nil
	}
	runs = runs[:q.Limit]
	last := runs[len(runs)-1]
	return runs, makeCursor(nanos(last.CreatedAt), string(last.ID)), nil
}

// makeCursor encodes the position after the run created at (nanoseconds)
// with id: opaque to clients.
func makeCursor(at int64, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at, 10) + ":" + id))
}

func parseCursor(c string) (int64, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err == nil {
		if at, id, ok := strings.Cut(string(raw), ":"); ok && id != "" {
			if n, err := strconv.ParseInt(at, 10, 64); err == nil {
				return n, id, nil
			}
		}
	}
	return 0, "", fmt.Errorf("cursor %q is not one a listing returned: %w", c, keel.ErrInvalid)
}

// RunsWithStatus returns every run in one of the given states, oldest first.
func (s *Store) RunsWithStatus(ctx context.Context, states ...keel.RunStatus) ([]keel.Run, error) {
	if len(states) == 0 {
		return nil, nil
	}
	args := make([]any, len(states))
	for i, st := range states {
		args[i] = string(st)
	}
	q := `SELECT ` + runCols + ` FROM runs WHERE status IN (?` + strings.Repeat(",?", len(states)-1) + `) ORDER BY created_at, id`
	return s.queryRuns(ctx, q, args...)
}

func (s *Store) queryRuns(ctx context.Context, q string, args ...any) ([]keel.Run, error) {
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", mapErr(err))
	}
	defer rows.Close()
	var out []keel.Run
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("list runs: %w", mapErr(err))
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list runs: %w", mapErr(err))
	}
	return out, nil
}

// Events returns the run's events with Seq > afterSeq in order. It
// returns keel.ErrNotFound if the run does not exist.
func (s *Store) Events(ctx context.Context, id keel.RunID, afterSeq int64) ([]keel.Event, error) {
	var num int64
	if err := s.r.QueryRowContext(ctx, `SELECT num FROM runs WHERE id = ?`, string(id)).Scan(&num); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("run %s: %w", id, keel.ErrNotFound)
		}
		return nil, fmt.Errorf("events of %s: %w", id, mapErr(err))
	}
	rows, err := s.r.QueryContext(ctx, `SELECT key & 4294967295, type, time, data FROM events WHERE key > ? AND key <= ? ORDER BY key`,
		eventKey(num, max(afterSeq, 0)), eventKey(num, maxSeq))
	if err != nil {
		return nil, fmt.Errorf("events of %s: %w", id, mapErr(err))
	}
	defer rows.Close()
	var out []keel.Event
	for rows.Next() {
		ev := keel.Event{RunID: id}
		var typ string
		var at int64
		var data []byte
		if err := rows.Scan(&ev.Seq, &typ, &at, &data); err != nil {
			return nil, fmt.Errorf("events of %s: %w", id, mapErr(err))
		}
		ev.Type, ev.Time = keel.EventType(typ), fromNanos(at)
		if len(data) > 0 {
			ev.Data = json.RawMessage(data)
		}
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("events of %s: %w", id, mapErr(err))
	}
	return out, nil
}

// StartSpan records an open span (status running). Span writes are
// lazy: StartSpan returns at once and the span is committed with the
// next status change of a run or Sync, or within lazyDelay (see the
// writer); its errors go to
// Options.OnLazyError. FinishSpan closes it, also lazily; a span finished
// before its start was committed is written once, finished. Starting a
// span the run already has (same ID) replaces it: that is how a resumed
// run reopens its root span and the step it was in.
func (s *Store) StartSpan(ctx context.Context, sp keel.Span) error {
	// Only what is known at the start; FinishSpan adds the rest.
	sp = keel.Span{ID: sp.ID, RunID: sp.RunID, ParentID: sp.ParentID, Kind: sp.Kind, Name: sp.Name, Step: sp.Step, Start: sp.Start,
		Status: keel.SpanRunning, Attrs: sp.Attrs}
	s.wr.startSpan(sp)
	return nil
}

// insertSpanRows inserts spans, which must be at most len(insertSpans),
// in one statement: all of them or, if it fails, none.
func insertSpanRows(ctx context.Context, tx *wtx, spans []*keel.Span) error {
	args := make([]any, 0, 21*len(spans))
	for _, sp := range spans {
		args = append(args, sp.ID, string(sp.RunID), string(sp.Kind), sp.Name, sp.Step, nanos(sp.Start), int64(sp.Duration), string(sp.Status), sp.Error,
			sp.PromptTokens, sp.CompletionTokens, sp.Provider, sp.CostUSD, int64(sp.TTFT), sp.Retries, sp.FinishReason, string(sp.Attrs),
			sp.ParentID, sp.ModelDigest, sp.TemplateHash, sp.PromptHash)
	}
	if _, err := tx.ExecContext(ctx, insertSpans[len(spans)-1], args...); err != nil {
		if len(spans) == 1 {
			return fmt.Errorf("start span %s: %w", spans[0].ID, mapErr(err))
		}
		return fmt.Errorf("start spans %s to %s: %w", spans[0].ID, spans[len(spans)-1].ID, mapErr(err))
	}
	return nil
}

// FinishSpan records a span's outcome: duration, status, error, tokens,
// the model's accounting, digest and prompt hashes, and attributes. It
// is lazy, like StartSpan, except for a span that is the only record of
// something (see recordsAlone), which commits with the next write of any
// kind, as FinishSpanWithNext.
func (s *Store) FinishSpan(ctx context.Context, sp keel.Span) error {
	return s.finishSpan(sp, recordsAlone(sp))
}

// FinishSpanWithNext is FinishSpan for a span that is the only record of
// something: it commits with the next write of any kind, as the
// journal's events do, instead of waiting for a status change. A crash
// loses it only with the events after it.
func (s *Store) FinishSpanWithNext(ctx context.Context, sp keel.Span) error {
	return s.finishSpan(sp, true)
}

// recordsAlone reports whether a finished span is the only record of
// something the journal does not hold, so that it must not be lost
// while a later event is kept: what a failed model call spent (a
// successful call's usage is in its model.result), or a person's answer
// ending a wait (it commits with the decision journaled after it).
func recordsAlone(sp keel.Span) bool {
	return sp.Kind == keel.SpanHuman || (sp.Kind == keel.SpanModelCall && sp.Status == keel.SpanError)
}

func (s *Store) finishSpan(sp keel.Span, withNext bool) error {
	s.wr.finishSpan(sp, withNext, func(open *keel.Span) {
		open.Duration, open.Status, open.Error, open.PromptTokens, open.CompletionTokens = sp.Duration, sp.Status, sp.Error, sp.PromptTokens, sp.CompletionTokens
		open.Provider, open.CostUSD, open.TTFT, open.Retries, open.FinishReason = sp.Provider, sp.CostUSD, sp.TTFT, sp.Retries, sp.FinishReason
		open.Attrs, open.ModelDigest, open.TemplateHash, open.PromptHash = sp.Attrs, sp.ModelDigest, sp.TemplateHash, sp.PromptHash
	}, func(ctx context.Context, tx *wtx) error {
		res, err := tx.ExecContext(ctx, qFinishSpan,
			int64(sp.Duration), string(sp.Status), sp.Error, sp.PromptTokens, sp.CompletionTokens,
			sp.Provider, sp.CostUSD, int64(sp.TTFT), sp.Retries, sp.FinishReason, string(sp.Attrs), sp.ModelDigest, sp.TemplateHash, sp.PromptHash,
			string(sp.RunID), sp.ID)
		if err != nil {
			return fmt.Errorf("finish span %s: %w", sp.ID, mapErr(err))
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("finish span %s: %w", sp.ID, keel.ErrNotFound)
		}
		return nil
	})
	return nil
}

// Commits returns how many write transactions the store has committed
// since it was opened (each costs an fsync at synchronous=FULL, but
// those UnsyncedCommits counts).
func (s *Store) Commits() int64 { return s.wr.commits.Load() }

// UnsyncedCommits returns how many of Commits were committed without an
// fsync of their own at synchronous=FULL: transactions that held only
// the audit records of direct calls of read-only tools (see AuditTrail)
// and what rode with them.
func (s *Store) UnsyncedCommits() int64 { return s.wr.unsynced.Load() }

// Sync commits every lazy write queued so far and returns once they are
// on disk.
func (s *Store) Sync(ctx context.Context) error {
	return s.wr.writeOp(ctx, op{fn: func(context.Context, *wtx) error { return nil }, atomic: true}, carryWith)
}

// RunsWithOpenSpans returns the runs that have a span still running, in
// ID order: after a crash, the spans the daemon was in (and those of a
// run's last moments, which commit right after its end) and, while the
// daemon runs, the calls in flight. It reads the whole spans table (no
// index serves it, so that writing a span stays one page): Recover calls
// it once at start.
func (s *Store) RunsWithOpenSpans(ctx context.Context) ([]keel.RunID, error) {
	if !s.wr.settled() {
		if err := s.Sync(ctx); err != nil {
			return nil, fmt.Errorf("runs with open spans: %w", err)
		}
	}
	rows, err := s.r.QueryContext(ctx, `SELECT DISTINCT run_id FROM spans WHERE status = ? ORDER BY run_id`, string(keel.SpanRunning))
	if err != nil {
		return nil, fmt.Errorf("runs with open spans: %w", mapErr(err))
	}
	defer rows.Close()
	var out []keel.RunID
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("runs with open spans: %w", mapErr(err))
		}
		out = append(out, keel.RunID(id))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("runs with open spans: %w", mapErr(err))
	}
	return out, nil
}

// Spans returns the run's spans in start order: every span started or
// finished before the call, also those still waiting to be written or
// in a transaction under way, which it waits for.
func (s *Store) Spans(ctx context.Context, id keel.RunID) ([]keel.Span, error) {
	// Spans still waiting to be written, or being written, are read too.
	if !s.wr.settled() {
		if err := s.Sync(ctx); err != nil {
			return nil, fmt.Errorf("spans of %s: %w", id, err)
		}
	}
	rows, err := s.r.QueryContext(ctx, `SELECT id, kind, name, step, start, duration, status, error, prompt_tokens, completion_tokens,
		provider, cost_usd, ttft, retries, finish_reason, attrs, parent_id, model_digest, template_hash, prompt_hash
		FROM spans WHERE run_id = ? ORDER BY start, id`, string(id))
	if err != nil {
		return nil, fmt.Errorf("spans of %s: %w", id, mapErr(err))
	}
	defer rows.Close()
	var out []keel.Span
	for rows.Next() {
		sp := keel.Span{RunID: id}
		var kind, status string
		var start, dur, ttft int64
		var attrs string
		if err := rows.Scan(&sp.ID, &kind, &sp.Name, &sp.Step, &start, &dur, &status, &sp.Error, &sp.PromptTokens, &sp.CompletionTokens,
			&sp.Provider, &sp.CostUSD, &ttft, &sp.Retries, &sp.FinishReason, &attrs, &sp.ParentID, &sp.ModelDigest, &sp.TemplateHash, &sp.PromptHash); err != nil {
			return nil, fmt.Errorf("spans of %s: %w", id, mapErr(err))
		}
		sp.Kind, sp.Status = keel.SpanKind(kind), keel.SpanStatus(status)
		sp.Start, sp.Duration, sp.TTFT = fromNanos(start), time.Duration(dur), time.Duration(ttft)
		if attrs != "" {
			sp.Attrs = json.RawMessage(attrs)
		}
		out = append(out, sp)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("spans of %s: %w", id, mapErr(err))
	}
	return out, nil
}

// DaySpent returns what model calls spent on day (YYYY-MM-DD, UTC).
func (s *Store) DaySpent(ctx context.Context, day string) (tokens int64, usd float64, err error) {
	err = s.r.QueryRowContext(ctx, `SELECT tokens, usd FROM model_spend WHERE day = ?`, day).Scan(&tokens, &usd)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("spending of %s: %w", day, mapErr(err))
	}
	return tokens, usd, nil
}

// AddDaySpent adds to what model calls spent on day.
func (s *Store) AddDaySpent(ctx context.Context, day string, tokens int64, usd float64) error {
	err := s.wr.write(ctx, func(ctx context.Context, tx *wtx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO model_spend (day, tokens, usd) VALUES (?, ?, ?)
		ON CONFLICT (day) DO UPDATE SET tokens = tokens + excluded.tokens, usd = usd + excluded.usd`, day, tokens, usd)
		return err
	})
	if err != nil {
		return fmt.Errorf("record spending of %s: %w", day, mapErr(err))
	}
	return nil
}

// ChildRuns returns the sub-agent runs of parent, oldest first.
func (s *Store) ChildRuns(ctx context.Context, parent keel.RunID) ([]keel.Run, error) {
	return s.queryRuns(ctx, `SELECT `+runCols+` FROM runs WHERE parent_id = ? ORDER BY created_at, id`, string(parent))
}

// RunByIdempotencyKey returns the run created with key, or keel.ErrNotFound.
func (s *Store) RunByIdempotencyKey(ctx context.Context, key string) (keel.Run, error) {
	r, err := scanRun(s.r.QueryRowContext(ctx, `SELECT `+runCols+` FROM runs WHERE idempotency_key = ?`, key))
	if err != nil {
		return keel.Run{}, fmt.Errorf("run with idempotency key: %w", mapErr(err))
	}
	return r, nil
}
