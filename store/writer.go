package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-runtime/keel"
)

// Group commit.
//
// Writes are committed one transaction at a time on the writer
// connection: by the caller, when the writer is idle, else by the
// writer's goroutine, which takes whatever writes are queued when the
// commit before ends (see submit). Each write runs inside its own
// savepoint (or is atomic), so that one write failing (a conflict, say)
// undoes only itself. With synchronous=FULL a commit costs an fsync;
// concurrent runs then share one fsync per batch instead of paying one
// each, and a write still returns only once its transaction is on disk.
//
// Trace spans are written lazily (see queueLazy): they wait, lazyDelay
// at most, for a write that changes a run's status, and commit with it
// (a run starting to wait for a person: carryWith) or right after it
// (carryAfter), or with Sync, or on their own when the wait is over.
// (The audit records of runs' tool calls wait only for the next write of
// any kind: see writeNext.) So a run's spans reach the disk a few steps
// at a time, filling a page, instead of rewriting the run's last span
// page at every step; a crash can lose the spans of the last lazyDelay,
// never a journaled event. A span that starts and finishes while it
// waits is written once.

// The writer's transaction statements (see wtx), and those that switch
// its connection's synchronous setting between batches (see
// writer.synced).
const (
	qBegin      = "BEGIN IMMEDIATE"
	qCommit     = "COMMIT"
	qRollback   = "ROLLBACK"
	qSyncFull   = "PRAGMA synchronous = FULL"
	qSyncNormal = "PRAGMA synchronous = NORMAL"
)

// maxBatch bounds how many writes one transaction carries.
const maxBatch = 512

// lazyDelay bounds how long a lazy write waits for a write that carries
// it before it is committed on its own.
const lazyDelay = 100 * time.Millisecond

// lazyMax is how many lazy writes the next write carries in any case.
const lazyMax = 256

// writeFunc is one write, run inside the writer's transaction.
type writeFunc func(ctx context.Context, tx *wtx) error

// errAbort, wrapped in a write's error, says the write may have left
// part of its changes behind: the writer then rolls back the whole
// transaction and fails every write in it.
var errAbort = errors.New("the transaction was rolled back")

// op is one write as the writer queues it. An atomic write changes
// nothing when it fails (it is one statement, or fails before its first
// change), so it needs no savepoint of its own: SQLite undoes a failed
// statement by itself. Savepoints cost two statements per write.
type op struct {
	fn     writeFunc
	atomic bool
	// span is set for a lazy span insert (fn inserts it alone): the
	// writer inserts consecutive ones several rows to a statement.
	span *keel.Span
	// unsynced says the write's caller needs it committed, not synced
	// (see writer.synced): it is in the WAL when the write returns,
	// and reaches the disk with the next synced commit or checkpoint.
	unsynced bool
}

// wtx is the writer's transaction as writes see it. The writer holds its
// connection for good and runs BEGIN IMMEDIATE and COMMIT itself, as
// prepared statements like the hot ones: database/sql's transactions
// parse their BEGIN anew each time and wrap every statement, which was a
// large share of a commit's CPU.
type wtx struct {
	conn  *sql.Conn
	stmts map[string]*sql.Stmt // prepared on conn before the writer started; read-only
	heads map[keel.RunID]runHead
}

// runHead is what appending to a run needs to know of it: its last
// sequence number and its status. The writer keeps the heads of the runs
// it appended to (those still running) so that an append reads nothing;
// the map is only touched on the writer goroutine, and is dropped
// whenever a write fails or a transaction does not commit, since it may
// then be ahead of the database.
type runHead struct {
	num    int64 // the run's number, the first half of its events' keys
	last   int64
	status keel.RunStatus
}

// ExecContext runs query in the transaction, prepared when it is one of
// the writer's hot statements.
func (t *wtx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st, ok := t.stmts[query]; ok {
		return st.ExecContext(ctx, args...)
	}
	return t.conn.ExecContext(ctx, query, args...)
}

// QueryRowContext runs query in the transaction for one row.
func (t *wtx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st, ok := t.stmts[query]; ok {
		return st.QueryRowContext(ctx, args...)
	}
	return t.conn.QueryRowContext(ctx, query, args...)
}

// writeReq is a batch of writes from one caller: lazy writes queued
// before it, then the caller's own write. done receives the outcome of
// the caller's write once the transaction is committed. For a flush of
// lazy writes (flush), every error goes to Options.OnLazyError and done
// receives nil.
type writeReq struct {
	ctx   context.Context
	fns   []op
	done  chan error
	flush bool
	// carried is set when fns holds lazy or next writes (see waiting):
	// the request is counted in writer.carrying until it is committed.
	carried bool
	// unsynced is the caller's write's op.unsynced.
	unsynced bool
}

// writer is the state of group commit.
type writer struct {
	conn  *sql.Conn // the writer connection, held for good; used by the leader only
	onErr func(error)

	stmts map[string]*sql.Stmt // the hot statements, prepared once, by query
	heads map[keel.RunID]runHead

	commits atomic.Int64 // transactions committed
	// unsynced counts the transactions committed without a sync (see
	// synced).
	unsynced atomic.Int64

	// full says the store's synchronous setting is FULL: a batch whose
	// writes all asked for no sync (op.unsynced) is then committed with
	// synchronous=NORMAL, and the setting put back for the next batch
	// that needs it. relaxed is the writer connection's current
	// setting: NORMAL while set. Both are the leader's only.
	full, relaxed bool

	mu sync.Mutex
	// pending holds the writes queued for the next commit, in the order
	// their callers made them. leading is set while a commit is under way
	// (by a caller or by drain) or drain has been kicked to make the next.
	pending []writeReq
	leading bool
	idle    *sync.Cond    // signalled when leading ends
	kick    chan struct{} // wakes drain, which then leads
	lazy    []op
	// open holds the spans started by a lazy write that has not left
	// for the writer yet, so that finishing one amends that write
	// instead of adding another; it is emptied whenever lazy is.
	open map[spanKey]*keel.Span
	// carryNext makes the next write carry the lazy writes (see
	// FinishSpanWithNext).
	carryNext bool
	// next holds writes that commit with the next write of any kind, or
	// within lazyDelay (see AuditTrail); unlike carryNext, they do
	// not bring the lazy writes along.
	next []op
	// carrying counts the requests that took lazy or next writes out of
	// lazy and next and are not yet committed: while one is, a span the
	// engine finished is neither waiting nor readable (see settled).
	carrying int
	delay    time.Duration // lazyDelay, but for tests
	timer    *time.Timer
	closed   bool
}

// newWriter sets up group commit on db (one connection, idle), preparing
// the hot statements first: while a transaction holds the connection
// nothing else can prepare on it.
func newWriter(ctx context.Context, db *sql.DB, hot []string, full bool, onErr func(error)) (*writer, error) {
	if onErr == nil {
		onErr = func(error) {}
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("writer connection: %w", mapErr(err))
	}
	w := &writer{conn: conn, full: full, onErr: onErr, delay: lazyDelay, stmts: map[string]*sql.Stmt{}, heads: map[keel.RunID]runHead{}, open: map[spanKey]*keel.Span{}}
	w.idle = sync.NewCond(&w.mu)
	w.kick = make(chan struct{}, 1)
	for _, q := range append(hot, "SAVEPOINT w", "RELEASE w", "ROLLBACK TO w", qBegin, qCommit, qRollback, qSyncFull, qSyncNormal) {
		st, err := conn.PrepareContext(ctx, q)
		if err != nil {
			for _, st := range w.stmts {
				st.Close()
			}
			conn.Close()
			return nil, fmt.Errorf("prepare %q: %w", q, mapErr(err))
		}
		w.stmts[q] = st
	}
	go w.drain()
	return w, nil
}

var errClosed = errors.New("store is closed")

// write runs fn in the next transaction and returns fn's outcome once
// the transaction is committed.
func (w *writer) write(ctx context.Context, fn writeFunc) error {
	return w.writeOp(ctx, op{fn: fn}, carryNone)
}

// carry says what a write does with the lazy writes waiting (see
// writeOp).
type carry int

const (
	// carryNone leaves them waiting, unless lazyMax of them are.
	carryNone carry = iota
	// carryWith commits them in the write's own transaction, before it.
	carryWith
	// carryAfter commits them right after the write, in the next
	// transaction, which its caller does not wait for.
	carryAfter
)

// writeOp is write for an op, which may be atomic. The next writes
// queued before it commit with it; the lazy ones as c says, and with it
// when a FinishSpanWithNext asked for that or lazyMax of them wait.
func (w *writer) writeOp(ctx context.Context, o op, c carry) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return errClosed
	}
	var fns []op
	var after *writeReq
	switch {
	case c == carryWith || w.carryNext || len(w.lazy) >= lazyMax:
		fns = w.waiting()
	case c == carryAfter && len(w.lazy) > 0:
		fns, w.next = w.next, nil
		after = &writeReq{ctx: context.Background(), fns: w.waiting(), flush: true}
	default:
		fns, w.next = w.next, nil
	}
	req := writeReq{ctx: context.WithoutCancel(ctx), fns: append(fns, o), unsynced: o.unsynced}
	w.carry(&req, len(fns))
	return w.submit(req, after)
}

// carry marks req as carrying n lazy or next writes, if n > 0. w.mu must
// be held.
func (w *writer) carry(req *writeReq, n int) {
	if n > 0 {
		req.carried = true
		w.carrying++
	}
}

// submit queues req and waits until it is committed, committing it
// itself when the writer is idle: a lone write then costs its caller no
// switch to another goroutine and back (about 25 µs around an fsync
// here). Writes that arrive while a commit is under way wait for the
// next one, which the writer's own goroutine (drain) makes, taking every
// write queued by then: concurrent writes share one commit, and no
// caller is kept committing for others. after, if not nil, is queued
// behind req, to commit in the next transaction (or in req's, when req
// had to queue), without its caller waiting for it. w.mu must be held;
// submit releases it.
func (w *writer) submit(req writeReq, after *writeReq) error {
	req.done = make(chan error, 1)
	w.pending = append(w.pending, req)
	w.queueAfter(after)
	if w.leading {
		w.mu.Unlock()
		return <-req.done
	}
	w.leading = true
	batch := w.take(req.done)
	w.mu.Unlock()
	w.commit(batch)
	w.mu.Lock()
	if len(w.pending) > 0 {
		w.kick <- struct{}{} // drain goes on leading
	} else {
		w.leading = false
		w.idle.Broadcast()
	}
	w.mu.Unlock()
	return <-req.done
}

// queueAfter queues a flush that no caller waits for. w.mu must be held.
func (w *writer) queueAfter(req *writeReq) {
	if req == nil {
		return
	}
	req.done = make(chan error, 1)
	w.carry(req, len(req.fns))
	w.pending = append(w.pending, *req)
}

// take removes the next batch from pending: the writes queued first, up
// to maxBatch of them (at least one), ending with the one whose done is
// last, if not nil. w.mu must be held.
func (w *writer) take(last chan error) []writeReq {
	n, k := 0, 0
	for k < len(w.pending) && (k == 0 || n+len(w.pending[k].fns) <= maxBatch) && (k == 0 || w.pending[k-1].done != last) {
		n += len(w.pending[k].fns)
		k++
	}
	batch := slices.Clone(w.pending[:k])
	w.pending = slices.Delete(w.pending, 0, k)
	return batch
}

// drain is the writer's goroutine. Kicked by a caller that committed
// while more writes were queued, it commits batches until none is left,
// then stops leading. It ends when kick is closed.
func (w *writer) drain() {
	for range w.kick {
		for {
			w.mu.Lock()
			if len(w.pending) == 0 {
				w.leading = false
				w.idle.Broadcast()
				w.mu.Unlock()
				break
			}
			batch := w.take(nil)
			w.mu.Unlock()
			w.commit(batch)
		}
	}
}

// spanKey names a span.
type spanKey struct {
	run keel.RunID
	id  string
}

// startSpan queues the insert of sp as a lazy write.
func (w *writer) startSpan(sp keel.Span) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := &sp
	insert := func(ctx context.Context, tx *wtx) error { return insertSpanRows(ctx, tx, []*keel.Span{p}) }
	if w.queueLazy(op{fn: insert, atomic: true, span: p}) {
		w.open[spanKey{sp.RunID, sp.ID}] = p
	}
}

// finishSpan records sp's outcome: in its insert, if that has not left
// for the writer yet (the usual case: a step's span starts and finishes
// between two journal writes), else by queuing update as a lazy write.
func (w *writer) finishSpan(sp keel.Span, withNext bool, finish func(open *keel.Span), update writeFunc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.carryNext = w.carryNext || withNext
	k := spanKey{sp.RunID, sp.ID}
	if p, ok := w.open[k]; ok {
		finish(p)
		delete(w.open, k)
		return
	}
	w.queueLazy(op{fn: update, atomic: true})
}

// queueLazy queues o, which must be atomic, to be committed with a
// write that carries it, or within lazyDelay; its error, if any, goes to
// the writer's onErr. It reports whether o was queued. w.mu must be
// held.
func (w *writer) queueLazy(o op) bool {
	if w.closed {
		w.onErr(errClosed)
		return false
	}
	w.lazy = append(w.lazy, o)
	w.arm()
	return true
}

// arm starts the timer that commits what waits (lazy and next writes)
// within lazyDelay, when the first of them is queued. w.mu must be held.
func (w *writer) arm() {
	if w.timer == nil {
		w.timer = time.AfterFunc(w.delay, w.flushLazy)
	} else if len(w.lazy)+len(w.next) == 1 {
		w.timer.Reset(w.delay)
	}
}

// writeNext queues fn, which must be atomic, to commit with the next
// write of any kind, or within lazyDelay; its error goes to onErr.
func (w *writer) writeNext(fn writeFunc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		w.onErr(errClosed)
		return
	}
	w.next = append(w.next, op{fn: fn, atomic: true})
	w.arm()
}

// waiting takes the writes waiting for a write to carry them. w.mu
// must be held.
func (w *writer) waiting() []op {
	fns := append(w.next, w.lazy...)
	w.next, w.lazy = nil, nil
	clear(w.open)
	w.carryNext = false
	return fns
}

// settled reports whether every lazy write queued so far is committed:
// none waits, and no transaction that carries some is under way.
func (w *writer) settled() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.lazy)+len(w.next) == 0 && w.carrying == 0
}

// flushLazy commits the lazy and next writes that no write carried.
func (w *writer) flushLazy() {
	w.mu.Lock()
	if len(w.lazy)+len(w.next) == 0 || w.closed {
		w.mu.Unlock()
		return
	}
	w.flushWaiting()
}

// flushWaiting commits the lazy and next writes in a transaction of
// their own. w.mu must be held; flushWaiting releases it.
func (w *writer) flushWaiting() {
	req := writeReq{ctx: context.Background(), fns: w.waiting(), flush: true}
	w.carry(&req, len(req.fns))
	_ = w.submit(req, nil)
}

// close commits what is queued and waits for the last commit to end;
// later writes fail with errClosed.
func (w *writer) close() {
	w.mu.Lock()
	if w.closed {
		for w.leading {
			w.idle.Wait()
		}
		w.mu.Unlock()
		return
	}
	w.closed = true
	if w.timer != nil {
		w.timer.Stop()
	}
	if len(w.lazy)+len(w.next) > 0 {
		w.flushWaiting()
		w.mu.Lock()
	}
	for w.leading {
		w.idle.Wait()
	}
	w.mu.Unlock()
	close(w.kick)
	for _, st := range w.stmts {
		_ = st.Close()
	}
	_ = w.conn.Close()
}

// commit runs one batch in one transaction and answers its callers.
func (w *writer) commit(batch []writeReq) {
	errs := make([][]error, len(batch))
	for i, req := range batch {
		errs[i] = make([]error, len(req.fns))
	}
	ctx := context.Background()
	err := func() error {
		tx := &wtx{conn: w.conn, stmts: w.stmts, heads: w.heads}
		if err := w.synced(ctx, tx, batch); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, qBegin); err != nil {
			return err
		}
		committed := false
		defer func() {
			if !committed {
				_, _ = tx.ExecContext(ctx, qRollback)
			}
		}()
		single := len(batch) == 1 && len(batch[0].fns) == 1
		failed := false
		for i, req := range batch {
			for j := 0; j < len(req.fns); j++ {
				if k := spanRun(req.fns[j:]); k > 1 {
					if spanRows(req.ctx, tx, req.fns[j:j+k]) == nil {
						j += k - 1
						continue
					}
					// Insert them one by one, so that only the failing ones fail.
				}
				o := req.fns[j]
				if single || o.atomic {
					errs[i][j] = o.fn(req.ctx, tx)
				} else {
					errs[i][j] = savepoint(req.ctx, tx, o.fn)
				}
				if errors.Is(errs[i][j], errAbort) {
					return errs[i][j]
				}
				if errs[i][j] != nil {
					failed = true
					if single {
						clear(w.heads)
						return nil // nothing else to keep
					}
				}
			}
		}
		if failed {
			clear(w.heads)
		}
		if _, err := tx.ExecContext(ctx, qCommit); err != nil {
			return err
		}
		committed = true
		w.commits.Add(1)
		if w.relaxed {
			w.unsynced.Add(1)
		}
		return nil
	}()
	if err != nil {
		clear(w.heads)
	}
	for i, req := range batch {
		for j, ferr := range errs[i] {
			if ferr == nil && err != nil {
				ferr = fmt.Errorf("commit: %w", mapErr(err))
			}
			switch {
			case j == len(req.fns)-1 && !req.flush:
				req.done <- ferr
			case ferr != nil:
				w.onErr(ferr)
			}
		}
		if req.flush {
			req.done <- nil
		}
	}
	carried := 0
	for _, req := range batch {
		if req.carried {
			carried++
		}
	}
	if carried > 0 {
		w.mu.Lock()
		w.carrying -= carried
		w.mu.Unlock()
	}
}

// synced sets the writer connection's synchronous setting for batch,
// before its transaction begins: NORMAL when the store's is FULL and
// every request in batch asked for no sync (writeReq.unsynced), else the
// store's own. Under NORMAL, in WAL mode, a commit writes its frames to
// the WAL (the operating system has them: a crash of keel loses
// nothing) without waiting for the disk; the next synced commit's fsync
// of the WAL, or a checkpoint, takes them to the disk along with its
// own, as the WAL is written in order. Only a crash of the machine
// before then can lose them. Switching costs one statement each way,
// and only when the setting changes.
func (w *writer) synced(ctx context.Context, tx *wtx, batch []writeReq) error {
	relax := w.full
	for _, req := range batch {
		relax = relax && req.unsynced
	}
	if relax == w.relaxed {
		return nil
	}
	q := qSyncFull
	if relax {
		q = qSyncNormal
	}
	if _, err := tx.ExecContext(ctx, q); err != nil {
		return err
	}
	w.relaxed = relax
	return nil
}

// spanRun is how many span inserts fns starts with, up to
// len(insertSpans).
func spanRun(fns []op) int {
	k := 0
	for k < len(fns) && k < len(insertSpans) && fns[k].span != nil {
		k++
	}
	return k
}

// spanRows inserts the spans of fns, span inserts all, in one statement.
func spanRows(ctx context.Context, tx *wtx, fns []op) error {
	spans := make([]*keel.Span, len(fns))
	for i, o := range fns {
		spans[i] = o.span
	}
	return insertSpanRows(ctx, tx, spans)
}

// savepoint runs fn inside a savepoint of tx, undone if fn fails.
func savepoint(ctx context.Context, tx *wtx, fn writeFunc) error {
	if _, err := tx.ExecContext(ctx, "SAVEPOINT w"); err != nil {
		return mapErr(err)
	}
	if err := fn(ctx, tx); err != nil {
		if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO w"); rerr != nil {
			return errors.Join(err, mapErr(rerr))
		}
		_, _ = tx.ExecContext(ctx, "RELEASE w")
		return err
	}
	if _, err := tx.ExecContext(ctx, "RELEASE w"); err != nil {
		return mapErr(err)
	}
	return nil
}
