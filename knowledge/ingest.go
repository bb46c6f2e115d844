package knowledge

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/keel-runtime/keel"
)

// AddOptions says where and by whom documents are added.
type AddOptions struct {
	// Scope receives the documents; required (ErrScope).
	Scope Scope
	// Labels are the scope's labels when the scope is new (ignored
	// otherwise: see SetScopeLabels).
	Labels []string
	// AddedBy is the provenance recorded with each document: "cli",
	// "client:NAME", "run:ID", "watch".
	AddedBy string
	// Progress, when set, is called at most every ~100 ms and once at the
	// end, from the calling goroutine.
	Progress func(Progress)
}

// Progress is how far an Add is.
type Progress struct {
	Files, FilesDone, Chunks, Embedded int
	Path                               string // the file last done
}

// AddReport says what an Add did.
type AddReport struct {
	Added, Updated, Unchanged int
	// Forgotten counts the documents under a directory added that are
	// no longer found in it (deleted or moved away since the last Add):
	// they are forgotten as Forget does.
	Forgotten int
	Chunks    int // chunks written
	Embedded  int // vectors written
	Skipped   []Skip
}

// Skip is a file Add left out, and why.
type Skip struct {
	Path   string
	Reason string // Err's text
	// Err wraps ErrBinary, ErrInvalidUTF8, ErrTooLarge, ErrSymlinkLoop,
	// ErrNotRegular, ErrAlreadyAdded, or the error reading the file.
	Err error
}

// batch limits: a write transaction commits after this many chunks or
// this long, so the store's journal commits never wait long behind it.
const (
	batchChunks = 512
	batchTime   = 100 * time.Millisecond
)

// fileJob is a file found by the walk.
type fileJob struct {
	path string
	info fs.FileInfo
}

// prepared is a file read, checked and chunked, ready to write.
type prepared struct {
	job    fileJob
	hash   string
	typ    string
	size   int64
	chunks []chunk
	skip   *Skip
	same   bool // content unchanged
}

// Add indexes files and directories into o.Scope. Directories are walked
// recursively; hidden files and directories (a leading "."), and
// node_modules, are left out; symlinks are followed once, and a link
// back into a directory being walked is skipped with ErrSymlinkLoop.
// Files larger than Options.MaxFileBytes, binary (a NUL byte) or not
// UTF-8 are skipped with a reason in the report; nothing else stops the
// Add. A file whose content hash is unchanged is not re-chunked. Files
// are written in short transactions: an Add cancelled (ctx) or killed
// part-way leaves every file either fully indexed or as it was; the
// error is then ctx's, with the report so far. A directory added is
// reconciled: the scope's documents under it that its walk no longer
// finds are forgotten (AddReport.Forgotten; the error wraps
// ErrCheckpointBusy when only the log's truncation failed). When an
// Embedder is set, the scope's chunks without a vector of the current
// model are embedded after the files are written (see Reembed).
func (ix *Index) Add(ctx context.Context, paths []string, o AddOptions) (AddReport, error) {
	var rep AddReport
	if _, err := ParseScope(string(o.Scope)); err != nil {
		return rep, err
	}
	labels, err := keel.NormalizeLabels(o.Labels)
	if err != nil {
		return rep, fmt.Errorf("knowledge: add: %w", err)
	}
	var jobs []fileJob
	var dirs []string
	for _, p := range paths {
		abs, err := filepath.Abs(p)
		if err != nil {
			rep.Skipped = append(rep.Skipped, skipOf(p, err))
			continue
		}
		if info, err := os.Stat(abs); err == nil && info.IsDir() {
			dirs = append(dirs, abs)
		}
		jobs = walk(abs, jobs, &rep.Skipped)
	}
	known, err := ix.knownHashes(ctx, o.Scope)
	if err != nil {
		return rep, err
	}
	prog := newProgress(o.Progress, len(jobs))

	// Read and chunk on every core, write on this goroutine.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in := make(chan fileJob)
	out := make(chan prepared, 16)
	var wg sync.WaitGroup
	for range max(1, runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for j := range in {
				p := ix.prepare(j, known)
				select {
				case out <- p:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	go func() {
		defer close(in)
		for _, j := range jobs {
			select {
			case in <- j:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() { wg.Wait(); close(out) }()

	w := &batchWriter{ix: ix, scope: o.Scope, labels: labels, addedBy: o.AddedBy}
	defer w.rollback()
	for p := range out {
		if err := ctx.Err(); err != nil {
			break
		}
		prog.p.FilesDone++
		prog.p.Path = p.job.path
		switch {
		case p.skip != nil:
			rep.Skipped = append(rep.Skipped, *p.skip)
		case p.same:
			rep.Unchanged++
		default:
			updated, err := w.write(ctx, p)
			if err != nil {
				cancel()
				for range out {
				}
				return rep, err
			}
			if updated {
				rep.Updated++
			} else {
				rep.Added++
			}
			rep.Chunks += len(p.chunks)
			prog.p.Chunks += len(p.chunks)
		}
		if w.full() {
			if err := w.commit(); err != nil {
				cancel()
				for range out {
				}
				return rep, err
			}
		}
		prog.tick(false)
	}
	if err := ctx.Err(); err != nil {
		for range out {
		}
		return rep, fmt.Errorf("knowledge: add: %w", err)
	}
	if err := w.commit(); err != nil {
		return rep, err
	}
	if err := ix.compactAfter(ctx, rep.Chunks); err != nil {
		return rep, err
	}
	if len(dirs) > 0 {
		found := make(map[string]bool, len(jobs)+len(rep.Skipped))
		for _, j := range jobs {
			found[j.path] = true
		}
		for _, sk := range rep.Skipped {
			found[sk.Path] = true
		}
		n, err := ix.reconcile(ctx, o.Scope, dirs, found)
		rep.Forgotten = n
		if err != nil {
			return rep, err
		}
	}
	if ix.o.Embedder != nil {
		n, err := ix.embedPending(ctx, o.Scope, func(done int) {
			prog.p.Embedded = done
			prog.tick(false)
		})
		rep.Embedded = n
		if err != nil {
			prog.tick(true)
			return rep, err
		}
	}
	prog.tick(true)
	return rep, nil
}

// compactAfter merges the full-text index into one segment, in steps,
// after an Add that wrote chunks at least an eighth of the index's: each
// commit of a batch left a segment, automerge keeps some tens of them on
// a large index, and a query seeks every term in every segment (27
// segments made BM25 queries over the standard library some 1.5x slower
// than the same index merged). Each step merges mergePages pages in its
// own transaction, so other writers to the file wait at most one step.
func (ix *Index) compactAfter(ctx context.Context, wrote int) error {
	if wrote == 0 {
		return nil
	}
	var total int
	if err := ix.r.QueryRowContext(ctx, `SELECT count(*) FROM kn_chunks`).Scan(&total); err != nil {
		return fmt.Errorf("knowledge: add: %w", err)
	}
	if wrote < total/8 || total < mergeMin {
		return nil
	}
	return ix.compact(ctx)
}

// compact merges the full-text index into one segment, in steps.
func (ix *Index) compact(ctx context.Context) error {
	for ctx.Err() == nil {
		done, err := ix.mergeStep(ctx)
		if err != nil {
			return fmt.Errorf("knowledge: add: merge the index: %w", err)
		}
		if done {
			break
		}
	}
	return nil
}

// Merging: pages per step (a few ms to some tens of ms each), and the
// index size (chunks) below which it is not worth it.
const (
	mergePages = 256
	mergeMin   = 4096
)

// mergeStep does one step of merging the index into one segment; done
// when there was nothing left to merge (FTS5 changes fewer than 2 rows).
func (ix *Index) mergeStep(ctx context.Context) (done bool, err error) {
	tx, err := ix.begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	var before, after int64
	if err := tx.QueryRowContext(ctx, `SELECT total_changes()`).Scan(&before); err != nil {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO kn_fts(kn_fts, rank) VALUES ('merge', ?)`, -mergePages); err != nil {
		return false, err
	}
	if err := tx.QueryRowContext(ctx, `SELECT total_changes()`).Scan(&after); err != nil {
		return false, err
	}
	return after-before < 2, tx.Commit()
}

// reconcile forgets the documents of scope under dirs whose source the
// walk did not find and that no longer exist, and returns how many.
func (ix *Index) reconcile(ctx context.Context, scope Scope, dirs []string, found map[string]bool) (int, error) {
	tx, err := ix.begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("knowledge: add: %w", err)
	}
	defer tx.Rollback()
	var gone []int64
	for _, d := range dirs {
		prefix := strings.TrimSuffix(d, "/") + "/"
		rows, err := tx.QueryContext(ctx, `SELECT id, source FROM kn_docs WHERE scope = ? AND substr(source, 1, ?) = ?`,
			string(scope), len([]rune(prefix)), prefix)
		if err != nil {
			return 0, fmt.Errorf("knowledge: add: %w", err)
		}
		for rows.Next() {
			var id int64
			var src string
			if err := rows.Scan(&id, &src); err != nil {
				rows.Close()
				return 0, fmt.Errorf("knowledge: add: %w", err)
			}
			if found[src] {
				continue
			}
			if _, err := os.Lstat(src); errors.Is(err, fs.ErrNotExist) {
				gone = append(gone, id) // not left out by the walk (hidden, say) but gone
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, fmt.Errorf("knowledge: add: %w", err)
		}
	}
	if len(gone) == 0 {
		return 0, nil
	}
	slices.Sort(gone)
	gone = slices.Compact(gone) // dirs may nest
	stmt := txStmt(tx)
	for _, id := range gone {
		if err := deleteDoc(ctx, stmt, id); err != nil {
			return 0, fmt.Errorf("knowledge: add: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("knowledge: add: %w", err)
	}
	ix.vecs.invalidate(scope)
	return len(gone), ix.truncateWAL(ctx)
}

// progress rate-limits Progress calls.
type progress struct {
	f    func(Progress)
	p    Progress
	last time.Time
}

func newProgress(f func(Progress), files int) *progress {
	return &progress{f: f, p: Progress{Files: files}, last: time.Now()}
}

func (pr *progress) tick(final bool) {
	if pr.f == nil {
		return
	}
	if now := time.Now(); final || now.Sub(pr.last) >= 100*time.Millisecond {
		pr.last = now
		pr.f(pr.p)
	}
}

func skipOf(path string, err error) Skip { return Skip{Path: path, Reason: err.Error(), Err: err} }

// walk appends the regular files under path (a file or a directory) to
// jobs, and the paths it leaves out to skipped.
func walk(path string, jobs []fileJob, skipped *[]Skip) []fileJob {
	info, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			err = fmt.Errorf("%w: %v", ErrSymlinkLoop, err)
		}
		*skipped = append(*skipped, skipOf(path, err))
		return jobs
	}
	if !info.IsDir() {
		if !info.Mode().IsRegular() {
			*skipped = append(*skipped, skipOf(path, ErrNotRegular))
			return jobs
		}
		return append(jobs, fileJob{path: path, info: info})
	}
	w := walker{jobs: jobs, skipped: skipped, seen: map[string]bool{}}
	w.dir(path, nil)
	return w.jobs
}

type walker struct {
	jobs    []fileJob
	skipped *[]Skip
	seen    map[string]bool // real paths of directories walked
}

// dir walks directory path; ancestors are the real paths of the
// directories above it on this walk.
func (w *walker) dir(path string, ancestors []string) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			err = fmt.Errorf("%w: %v", ErrSymlinkLoop, err)
		}
		*w.skipped = append(*w.skipped, skipOf(path, err))
		return
	}
	for _, a := range ancestors {
		if a == real {
			*w.skipped = append(*w.skipped, skipOf(path, fmt.Errorf("%w: links back to %s", ErrSymlinkLoop, real)))
			return
		}
	}
	if w.seen[real] {
		*w.skipped = append(*w.skipped, skipOf(path, fmt.Errorf("%w: %s", ErrAlreadyAdded, real)))
		return
	}
	w.seen[real] = true
	ents, err := os.ReadDir(path)
	if err != nil {
		*w.skipped = append(*w.skipped, skipOf(path, err))
		return
	}
	ancestors = append(ancestors, real)
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") || name == "node_modules" {
			continue
		}
		p := filepath.Join(path, name)
		t := e.Type()
		var info fs.FileInfo
		if t&fs.ModeSymlink != 0 {
			info, err = os.Stat(p)
			if err != nil {
				if errors.Is(err, syscall.ELOOP) {
					err = fmt.Errorf("%w: %v", ErrSymlinkLoop, err)
				}
				*w.skipped = append(*w.skipped, skipOf(p, err))
				continue
			}
			t = info.Mode().Type()
		}
		switch {
		case t.IsDir():
			w.dir(p, ancestors)
		case t.IsRegular():
			if info == nil {
				if info, err = e.Info(); err != nil {
					*w.skipped = append(*w.skipped, skipOf(p, err))
					continue
				}
			}
			w.jobs = append(w.jobs, fileJob{path: p, info: info})
		default:
			*w.skipped = append(*w.skipped, skipOf(p, ErrNotRegular))
		}
	}
}

// knownHashes maps the sources of scope to their content hashes.
func (ix *Index) knownHashes(ctx context.Context, scope Scope) (map[string]string, error) {
	rows, err := ix.r.QueryContext(ctx, `SELECT source, hash FROM kn_docs WHERE scope = ?`, string(scope))
	if err != nil {
		return nil, fmt.Errorf("knowledge: add: %w", err)
	}
	defer rows.Close()
	m := map[string]string{}
	for rows.Next() {
		var s, h string
		if err := rows.Scan(&s, &h); err != nil {
			return nil, fmt.Errorf("knowledge: add: %w", err)
		}
		m[s] = h
	}
	return m, rows.Err()
}

// prepare reads, checks and chunks one file. known is read only.
func (ix *Index) prepare(j fileJob, known map[string]string) prepared {
	p := prepared{job: j, size: j.info.Size(), typ: TypeOf(j.path)}
	skip := func(err error) prepared {
		s := skipOf(j.path, err)
		p.skip = &s
		return p
	}
	if p.size > ix.o.MaxFileBytes {
		return skip(fmt.Errorf("%w: %d bytes, more than %d", ErrTooLarge, p.size, ix.o.MaxFileBytes))
	}
	f, err := os.Open(j.path)
	if err != nil {
		return skip(err)
	}
	defer f.Close()
	// Read at most one byte past the limit: the file may have grown.
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(f, ix.o.MaxFileBytes+1))
	if err != nil {
		return skip(err)
	}
	if n > ix.o.MaxFileBytes {
		return skip(fmt.Errorf("%w: more than %d bytes", ErrTooLarge, ix.o.MaxFileBytes))
	}
	data := buf.Bytes()
	p.size = int64(len(data))
	sum := sha256.Sum256(data)
	p.hash = hex.EncodeToString(sum[:])
	if known[j.path] == p.hash {
		p.same = true
		return p
	}
	if err := checkText(data); err != nil {
		return skip(err)
	}
	p.chunks = chunkDoc(p.typ, data)
	return p
}

// checkText refuses binary data (a NUL byte in the first 8 KiB) and
// invalid UTF-8.
func checkText(data []byte) error {
	if bytes.IndexByte(data[:min(len(data), 8192)], 0) >= 0 {
		return ErrBinary
	}
	if !utf8.Valid(data) {
		return ErrInvalidUTF8
	}
	return nil
}

// batchWriter writes prepared files in transactions of a few hundred
// chunks.
type batchWriter struct {
	ix      *Index
	scope   Scope
	labels  []string
	addedBy string

	tx      *sql.Tx
	stmts   map[string]*sql.Stmt
	chunks  int
	started time.Time
	gone    []int64 // chunks with a vector deleted in this transaction
}

func (w *batchWriter) full() bool {
	return w.tx != nil && (w.chunks >= batchChunks || time.Since(w.started) >= batchTime)
}

func (w *batchWriter) begin(ctx context.Context) error {
	tx, err := w.ix.begin(ctx)
	if err != nil {
		return fmt.Errorf("knowledge: add: %w", err)
	}
	if err := ensureScope(ctx, tx, w.scope, w.labels); err != nil {
		tx.Rollback()
		return fmt.Errorf("knowledge: add: %w", err)
	}
	w.tx, w.chunks, w.started = tx, 0, time.Now()
	w.stmts = map[string]*sql.Stmt{}
	return nil
}

func (w *batchWriter) stmt(ctx context.Context, q string) (*sql.Stmt, error) {
	if s, ok := w.stmts[q]; ok {
		return s, nil
	}
	s, err := w.tx.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	w.stmts[q] = s
	return s, nil
}

func (w *batchWriter) commit() error {
	if w.tx == nil {
		return nil
	}
	err := w.tx.Commit()
	w.tx = nil
	if err != nil {
		return fmt.Errorf("knowledge: add: %w", err)
	}
	if len(w.gone) > 0 {
		w.ix.vecs.update(w.scope, w.ix.o.EmbedModel, w.ix.currentDigest(), w.gone, nil, nil)
		w.gone = w.gone[:0]
	}
	if w.ix.afterCommit != nil {
		w.ix.afterCommit()
	}
	return nil
}

func (w *batchWriter) rollback() {
	if w.tx != nil {
		w.tx.Rollback()
		w.tx = nil
	}
	w.gone = w.gone[:0]
}

// write replaces the document of p.job.path (if any) with p's chunks;
// updated says a document was there.
func (w *batchWriter) write(ctx context.Context, p prepared) (updated bool, err error) {
	if w.tx == nil {
		if err := w.begin(ctx); err != nil {
			return false, err
		}
	}
	_, updated, err = writeDoc(ctx, w.stmt, w.scope, p.job.path, p.typ, p.hash, w.addedBy, p.job.info.ModTime(), p.size, p.chunks, &w.gone)
	if err != nil {
		return false, fmt.Errorf("knowledge: add %s: %w", p.job.path, err)
	}
	w.chunks += len(p.chunks)
	return updated, nil
}

type stmtFunc func(ctx context.Context, q string) (*sql.Stmt, error)

// writeDoc upserts a document and replaces its chunks, inside the
// caller's transaction; the ids of the chunks replaced that had a vector
// are appended to gone.
func writeDoc(ctx context.Context, stmt stmtFunc, scope Scope, source, typ, hash, addedBy string, mtime time.Time, size int64, chunks []chunk, gone *[]int64) (id int64, updated bool, err error) {
	find, err := stmt(ctx, `SELECT id FROM kn_docs WHERE scope = ? AND source = ?`)
	if err != nil {
		return 0, false, err
	}
	switch err := find.QueryRowContext(ctx, string(scope), source).Scan(&id); {
	case err == nil:
		updated = true
		if err := deleteChunks(ctx, stmt, id, gone); err != nil {
			return 0, false, err
		}
		up, err := stmt(ctx, `UPDATE kn_docs SET type = ?, hash = ?, added_by = ?, mtime = ?, added_at = ?, bytes = ?, chunks = ? WHERE id = ?`)
		if err != nil {
			return 0, false, err
		}
		if _, err := up.ExecContext(ctx, typ, hash, addedBy, mtime.UnixNano(), time.Now().UnixNano(), size, len(chunks), id); err != nil {
			return 0, false, err
		}
	case errors.Is(err, sql.ErrNoRows):
		ins, err := stmt(ctx, `INSERT INTO kn_docs(scope, source, type, hash, added_by, mtime, added_at, bytes, chunks) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`)
		if err != nil {
			return 0, false, err
		}
		if err := ins.QueryRowContext(ctx, string(scope), source, typ, hash, addedBy, mtime.UnixNano(), time.Now().UnixNano(), size, len(chunks)).Scan(&id); err != nil {
			return 0, false, err
		}
	default:
		return 0, false, err
	}
	ins, err := stmt(ctx, `INSERT INTO kn_chunks(doc_id, ord, heading, start_line, end_line, hash, text) VALUES (?, ?, ?, ?, ?, ?, ?)`)
	if err != nil {
		return 0, false, err
	}
	for i, c := range chunks {
		sum := sha256.Sum256([]byte(c.Text))
		if _, err := ins.ExecContext(ctx, id, i, c.Heading, c.Start, c.End, hex.EncodeToString(sum[:16]), c.Text); err != nil {
			return 0, false, err
		}
	}
	return id, updated, nil
}

// deleteChunks deletes a document's chunks, their vectors and (through
// the trigger) their FTS entries; the ids of the chunks that had a
// vector are appended to gone (if not nil).
func deleteChunks(ctx context.Context, stmt stmtFunc, docID int64, gone *[]int64) error {
	s, err := stmt(ctx, `DELETE FROM kn_vectors WHERE chunk_id IN (SELECT id FROM kn_chunks WHERE doc_id = ?) RETURNING chunk_id`)
	if err != nil {
		return err
	}
	rows, err := s.QueryContext(ctx, docID)
	if err != nil {
		return err
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		if gone != nil {
			*gone = append(*gone, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if s, err = stmt(ctx, `DELETE FROM kn_chunks WHERE doc_id = ?`); err != nil {
		return err
	}
	_, err = s.ExecContext(ctx, docID)
	return err
}

// txStmt prepares statements of tx on demand.
func txStmt(tx *sql.Tx) stmtFunc {
	m := map[string]*sql.Stmt{}
	return func(ctx context.Context, q string) (*sql.Stmt, error) {
		if s, ok := m[q]; ok {
			return s, nil
		}
		s, err := tx.PrepareContext(ctx, q)
		if err != nil {
			return nil, err
		}
		m[q] = s
		return s, nil
	}
}

// AddText indexes text that is not a file (a run's outcome for `keel run
// --remember`, an editor's buffer) into o.Scope: source is its
// provenance (a URL, "keel:run/ID"); the same source in the same scope
// again replaces it (unchanged text is left as it is). typ is a type
// such as "markdown" or "text" ("" is "text"). The text must be valid
// UTF-8 without NUL bytes and at most Options.MaxFileBytes.
func (ix *Index) AddText(ctx context.Context, source, typ, text string, o AddOptions) (Doc, error) {
	if _, err := ParseScope(string(o.Scope)); err != nil {
		return Doc{}, err
	}
	if source == "" {
		return Doc{}, fmt.Errorf("knowledge: add text: no source: %w", keel.ErrInvalid)
	}
	if typ == "" {
		typ = "text"
	}
	labels, err := keel.NormalizeLabels(o.Labels)
	if err != nil {
		return Doc{}, fmt.Errorf("knowledge: add text: %w", err)
	}
	if int64(len(text)) > ix.o.MaxFileBytes {
		return Doc{}, fmt.Errorf("knowledge: add text %s: %w: %d bytes: %w", source, ErrTooLarge, len(text), keel.ErrInvalid)
	}
	if err := checkText([]byte(text)); err != nil {
		return Doc{}, fmt.Errorf("knowledge: add text %s: %w: %w", source, err, keel.ErrInvalid)
	}
	sum := sha256.Sum256([]byte(text))
	hash := hex.EncodeToString(sum[:])
	chunks := chunkDoc(typ, []byte(text))
	tx, err := ix.begin(ctx)
	if err != nil {
		return Doc{}, fmt.Errorf("knowledge: add text: %w", err)
	}
	defer tx.Rollback()
	if err := ensureScope(ctx, tx, o.Scope, labels); err != nil {
		return Doc{}, fmt.Errorf("knowledge: add text: %w", err)
	}
	var id int64
	var old string
	var gone []int64
	err = tx.QueryRowContext(ctx, `SELECT id, hash FROM kn_docs WHERE scope = ? AND source = ?`, string(o.Scope), source).Scan(&id, &old)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Doc{}, fmt.Errorf("knowledge: add text: %w", err)
	}
	if old != hash {
		if id, _, err = writeDoc(ctx, txStmt(tx), o.Scope, source, typ, hash, o.AddedBy, time.Now(), int64(len(text)), chunks, &gone); err != nil {
			return Doc{}, fmt.Errorf("knowledge: add text %s: %w", source, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return Doc{}, fmt.Errorf("knowledge: add text: %w", err)
	}
	if len(gone) > 0 {
		ix.vecs.update(o.Scope, ix.o.EmbedModel, ix.currentDigest(), gone, nil, nil)
	}
	if ix.o.Embedder != nil {
		if _, err := ix.embedPending(ctx, o.Scope, nil); err != nil {
			return Doc{}, err
		}
	}
	return ix.doc(ctx, id)
}

func (ix *Index) doc(ctx context.Context, id int64) (Doc, error) {
	var d Doc
	var mt, at int64
	var scope, labels string
	err := ix.r.QueryRowContext(ctx, `SELECT d.source, d.type, d.hash, d.added_by, d.scope, s.labels, d.mtime, d.added_at, d.chunks, d.bytes
		FROM kn_docs d JOIN kn_scopes s ON s.name = d.scope WHERE d.id = ?`, id).
		Scan(&d.Source, &d.Type, &d.Hash, &d.AddedBy, &scope, &labels, &mt, &at, &d.Chunks, &d.Bytes)
	if errors.Is(err, sql.ErrNoRows) {
		return Doc{}, fmt.Errorf("knowledge: document %s: %w", docID(id), keel.ErrNotFound)
	}
	if err != nil {
		return Doc{}, fmt.Errorf("knowledge: document %s: %w", docID(id), err)
	}
	d.ID, d.Scope, d.Labels = docID(id), Scope(scope), splitLabels(labels)
	d.ModTime, d.AddedAt = time.Unix(0, mt), time.Unix(0, at)
	return d, nil
}

// Rename moves the documents whose source is from, or under from as a
// directory, to the same place under to, in every scope (watch's
// rename). A document already at the new source is replaced. The error
// wraps keel.ErrNotFound when nothing is at from.
func (ix *Index) Rename(ctx context.Context, from, to string) error {
	from, to = trimSlash(from), trimSlash(to)
	if from == "" || to == "" {
		return fmt.Errorf("knowledge: rename: empty path: %w", keel.ErrInvalid)
	}
	tx, err := ix.begin(ctx)
	if err != nil {
		return fmt.Errorf("knowledge: rename: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT id, scope, source FROM kn_docs WHERE source = ? OR substr(source, 1, ?) = ?`,
		from, len([]rune(from))+1, from+"/")
	if err != nil {
		return fmt.Errorf("knowledge: rename: %w", err)
	}
	type mv struct {
		id    int64
		scope string
		to    string
	}
	var mvs []mv
	for rows.Next() {
		var m mv
		var src string
		if err := rows.Scan(&m.id, &m.scope, &src); err != nil {
			rows.Close()
			return fmt.Errorf("knowledge: rename: %w", err)
		}
		m.to = to + strings.TrimPrefix(src, from)
		mvs = append(mvs, m)
	}
	rows.Close()
	if len(mvs) == 0 {
		return fmt.Errorf("knowledge: rename %s: %w", from, keel.ErrNotFound)
	}
	stmt := txStmt(tx)
	scopes := map[Scope]bool{}
	for _, m := range mvs {
		var old int64
		err := tx.QueryRowContext(ctx, `SELECT id FROM kn_docs WHERE scope = ? AND source = ?`, m.scope, m.to).Scan(&old)
		if err == nil {
			if err := deleteDoc(ctx, stmt, old); err != nil {
				return fmt.Errorf("knowledge: rename: %w", err)
			}
		} else if !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("knowledge: rename: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE kn_docs SET source = ? WHERE id = ?`, m.to, m.id); err != nil {
			return fmt.Errorf("knowledge: rename: %w", err)
		}
		scopes[Scope(m.scope)] = true
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("knowledge: rename: %w", err)
	}
	for s := range scopes {
		ix.vecs.invalidate(s)
	}
	return nil
}

// Remove forgets the documents at path (or under it, as a directory) in
// every scope, as Forget does (watch's delete). The error wraps
// keel.ErrNotFound when nothing is there.
func (ix *Index) Remove(ctx context.Context, path string) error {
	_, err := ix.Forget(ctx, ForgetSelector{Path: path})
	return err
}
