package knowledge

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" driver, FTS5 built in

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
)

// ErrScope is wrapped by the error of a malformed scope and of a query
// that names no scope.
var ErrScope = errors.New("knowledge: bad or missing scope")

// Skip reasons: each Skip's Err wraps one of these (or the error that made
// the file unreadable), so that callers branch with errors.Is.
var (
	ErrBinary       = errors.New("binary file")
	ErrInvalidUTF8  = errors.New("not valid UTF-8")
	ErrTooLarge     = errors.New("file too large")
	ErrSymlinkLoop  = errors.New("symlink loop")
	ErrNotRegular   = errors.New("not a regular file")
	ErrAlreadyAdded = errors.New("directory already walked through another link")
)

// DefaultMaxFileBytes is Options.MaxFileBytes's default.
const DefaultMaxFileBytes = 4 << 20

// Options configures an Index. The zero value is a BM25-only index.
type Options struct {
	// Embedder computes chunk and query vectors; nil: BM25 only (no
	// vectors are written, ModeHybrid falls back to BM25).
	Embedder models.Embedder
	// EmbedModel is the model the Embedder is asked for; recorded with
	// every vector. Required when Embedder is set.
	EmbedModel string
	// ModelDigest returns EmbedModel's digest (Ollama's), recorded with
	// every vector, so that a changed model is re-embedded: vectors of
	// another model or digest are not used and are replaced by the next
	// Add or Reembed. nil: the name alone identifies the model. It is
	// asked at Open and at every Add; an error counts as "" (unknown).
	ModelDigest func(ctx context.Context, model string) (string, error)
	// MaxFileBytes: larger files are skipped with ErrTooLarge. Default
	// DefaultMaxFileBytes (4 MiB).
	MaxFileBytes int64
	// EmbedBatch is how many chunks go in one embedding request.
	// Default 32.
	EmbedBatch int
	// EmbedMaxBytes: only a chunk's first EmbedMaxBytes bytes (its
	// heading first) are embedded, so that a chunk fits a small model's
	// context. Default 1024.
	EmbedMaxBytes int
	// Logger receives debug records; nil discards.
	Logger *slog.Logger
}

// Index is the knowledge store: documents, their chunks, an FTS5 index
// over the chunks and their vectors, in tables prefixed kn_ of a SQLite
// file (the daemon's, beside the store's tables). It is safe for
// concurrent use: writes go through one connection, one transaction at a
// time; searches read through a pool and see committed data only.
type Index struct {
	w, r *sql.DB
	o    Options
	log  *slog.Logger

	// digest is the embedding model's digest last seen.
	digestMu sync.Mutex
	digest   string

	vecs vectorCache

	// stmts are the searches' statements, prepared once per SQL text
	// (the filters' shape makes the text); at most maxStmts.
	stmtMu sync.Mutex
	stmts  map[string]*sql.Stmt

	afterCommit func() // tests: called after each ingest batch commits
}

// Open opens (creating if needed) the knowledge tables in the SQLite file
// at path, with its own connections (WAL, busy_timeout 10 s,
// synchronous=FULL, secure_delete). It leaves other tables of the file
// alone.
func Open(ctx context.Context, path string, o Options) (*Index, error) {
	if o.Embedder != nil && o.EmbedModel == "" {
		return nil, fmt.Errorf("knowledge: open %s: an Embedder needs an EmbedModel: %w", path, keel.ErrInvalid)
	}
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = DefaultMaxFileBytes
	}
	if o.EmbedBatch <= 0 {
		o.EmbedBatch = 32
	}
	if o.EmbedMaxBytes <= 0 {
		o.EmbedMaxBytes = 1024
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dsn := func(writer bool) string {
		q := url.Values{}
		for _, p := range []string{"busy_timeout(10000)", "journal_mode(WAL)", "synchronous(FULL)", "foreign_keys(1)", "secure_delete(1)"} {
			q.Add("_pragma", p)
		}
		if writer {
			q.Set("_txlock", "immediate")
		}
		return "file:" + path + "?" + q.Encode()
	}
	w, err := sql.Open("sqlite", dsn(true))
	if err != nil {
		return nil, fmt.Errorf("knowledge: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetConnMaxIdleTime(0)
	r, err := sql.Open("sqlite", dsn(false))
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("knowledge: open %s: %w", path, err)
	}
	r.SetMaxOpenConns(4)
	r.SetMaxIdleConns(4)
	ix := &Index{w: w, r: r, o: o, log: log}
	if err := ix.migrate(ctx); err != nil {
		w.Close()
		r.Close()
		return nil, fmt.Errorf("knowledge: open %s: %w", path, err)
	}
	ix.refreshDigest(ctx)
	return ix, nil
}

// Close closes the index's connections. Calls in flight fail.
func (ix *Index) Close() error {
	ix.stmtMu.Lock()
	for _, s := range ix.stmts {
		s.Close()
	}
	ix.stmts = nil
	ix.stmtMu.Unlock()
	return errors.Join(ix.w.Close(), ix.r.Close())
}

// maxStmts bounds Index.stmts.
const maxStmts = 64

// query runs a read through a statement prepared once for q (SQLite
// parses and plans a search's joins with the FTS5 table in some tenths
// of a millisecond, on every call otherwise).
func (ix *Index) query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	ix.stmtMu.Lock()
	st := ix.stmts[q]
	if st == nil && len(ix.stmts) < maxStmts {
		var err error
		if st, err = ix.r.PrepareContext(ctx, q); err != nil {
			ix.stmtMu.Unlock()
			return nil, err
		}
		if ix.stmts == nil {
			ix.stmts = map[string]*sql.Stmt{}
		}
		ix.stmts[q] = st
	}
	ix.stmtMu.Unlock()
	if st == nil {
		return ix.r.QueryContext(ctx, q, args...)
	}
	return st.QueryContext(ctx, args...)
}

const schemaVersion = 1

var schema = []string{
	`CREATE TABLE IF NOT EXISTS kn_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)`,
	`CREATE TABLE IF NOT EXISTS kn_scopes(
		name TEXT PRIMARY KEY,
		labels TEXT NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL)`,
	`CREATE TABLE IF NOT EXISTS kn_docs(
		id INTEGER PRIMARY KEY,
		scope TEXT NOT NULL REFERENCES kn_scopes(name),
		source TEXT NOT NULL,
		type TEXT NOT NULL,
		hash TEXT NOT NULL,
		added_by TEXT NOT NULL,
		mtime INTEGER NOT NULL,
		added_at INTEGER NOT NULL,
		bytes INTEGER NOT NULL,
		chunks INTEGER NOT NULL,
		UNIQUE(scope, source))`,
	`CREATE INDEX IF NOT EXISTS kn_docs_source ON kn_docs(source)`,
	`CREATE TABLE IF NOT EXISTS kn_chunks(
		id INTEGER PRIMARY KEY,
		doc_id INTEGER NOT NULL REFERENCES kn_docs(id),
		ord INTEGER NOT NULL,
		heading TEXT NOT NULL,
		start_line INTEGER NOT NULL,
		end_line INTEGER NOT NULL,
		hash TEXT NOT NULL,
		text TEXT NOT NULL)`,
	`CREATE INDEX IF NOT EXISTS kn_chunks_doc ON kn_chunks(doc_id)`,
	// An external-content index over kn_chunks: the text is stored once,
	// in kn_chunks; the triggers keep the index in step in the same
	// transaction, so the two never disagree.
	`CREATE VIRTUAL TABLE IF NOT EXISTS kn_fts USING fts5(heading, text, content='kn_chunks', content_rowid='id', tokenize='porter unicode61')`,
	`CREATE TRIGGER IF NOT EXISTS kn_chunks_ai AFTER INSERT ON kn_chunks BEGIN
		INSERT INTO kn_fts(rowid, heading, text) VALUES (new.id, new.heading, new.text);
	END`,
	`CREATE TRIGGER IF NOT EXISTS kn_chunks_ad AFTER DELETE ON kn_chunks BEGIN
		INSERT INTO kn_fts(kn_fts, rowid, heading, text) VALUES ('delete', old.id, old.heading, old.text);
	END`,
	`CREATE TABLE IF NOT EXISTS kn_vectors(
		chunk_id INTEGER PRIMARY KEY REFERENCES kn_chunks(id),
		model TEXT NOT NULL,
		digest TEXT NOT NULL,
		vec BLOB NOT NULL)`,
}

func (ix *Index) migrate(ctx context.Context) error {
	tx, err := ix.begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, s := range schema {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("schema: %w", err)
		}
	}
	var v string
	err = tx.QueryRowContext(ctx, `SELECT value FROM kn_meta WHERE key = 'schema'`).Scan(&v)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// New: secure-delete removes a deleted chunk's tokens from the
		// index at once (no delete markers left for a later merge), and
		// headings weigh twice the text.
		for _, s := range []string{
			`INSERT INTO kn_fts(kn_fts, rank) VALUES ('secure-delete', 1)`,
			`INSERT INTO kn_fts(kn_fts, rank) VALUES ('rank', 'bm25(` + headingWeight + `, 1.0)')`,
			`INSERT INTO kn_meta(key, value) VALUES ('schema', '` + strconv.Itoa(schemaVersion) + `')`,
		} {
			if _, err := tx.ExecContext(ctx, s); err != nil {
				return fmt.Errorf("schema: %w", err)
			}
		}
	case err != nil:
		return err
	case v != strconv.Itoa(schemaVersion):
		return fmt.Errorf("knowledge schema version %s, this keel knows %d", v, schemaVersion)
	}
	return tx.Commit()
}

// refreshDigest asks Options.ModelDigest for the embedding model's digest.
func (ix *Index) refreshDigest(ctx context.Context) string {
	if ix.o.Embedder == nil || ix.o.ModelDigest == nil {
		return ix.currentDigest()
	}
	d, err := ix.o.ModelDigest(ctx, ix.o.EmbedModel)
	if err != nil {
		ix.log.Debug("knowledge: model digest", logkey.Model, ix.o.EmbedModel, logkey.Err, err)
		d = ""
	}
	ix.digestMu.Lock()
	ix.digest = d
	ix.digestMu.Unlock()
	return d
}

func (ix *Index) currentDigest() string {
	ix.digestMu.Lock()
	defer ix.digestMu.Unlock()
	return ix.digest
}

// A Scope names who may read what: "user", "workspace:NAME" (the
// workspace's absolute root path or a name) or "run:RUNID". Which runs
// and tools may read a scope is policy's decision, outside this package.
type Scope string

// Scope kinds.
const (
	ScopeUser Scope = "user"
)

// ParseScope checks s against the scope grammar; the error wraps ErrScope.
func ParseScope(s string) (Scope, error) {
	if s == "user" {
		return ScopeUser, nil
	}
	kind, name, ok := strings.Cut(s, ":")
	if ok && name != "" && strings.TrimSpace(name) == name && !strings.ContainsAny(name, "\x00\n\r\t") {
		switch kind {
		case "workspace":
			return Scope(s), nil
		case "run":
			if !strings.ContainsAny(name, " /") {
				return Scope(s), nil
			}
		}
	}
	return "", fmt.Errorf("%w: %q: want user, workspace:NAME or run:RUNID", ErrScope, s)
}

// ScopeInfo describes a scope in use.
type ScopeInfo struct {
	Name   Scope
	Labels []string
	Docs   int
	Chunks int
	Bytes  int64
}

// SetScopeLabels sets (replaces) the labels of scope s, creating it if
// new. Labels are checked with keel.CheckLabel.
func (ix *Index) SetScopeLabels(ctx context.Context, s Scope, labels []string) error {
	if _, err := ParseScope(string(s)); err != nil {
		return err
	}
	ls, err := keel.NormalizeLabels(labels)
	if err != nil {
		return fmt.Errorf("knowledge: scope %s: %w", s, err)
	}
	_, err = ix.w.ExecContext(ctx, `INSERT INTO kn_scopes(name, labels, created_at) VALUES (?, ?, ?)
		ON CONFLICT(name) DO UPDATE SET labels = excluded.labels`, string(s), strings.Join(ls, ","), time.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("knowledge: scope %s: %w", s, err)
	}
	return nil
}

// Scopes lists the scopes with their labels and sizes, by name.
func (ix *Index) Scopes(ctx context.Context) ([]ScopeInfo, error) {
	rows, err := ix.r.QueryContext(ctx, `SELECT s.name, s.labels,
			(SELECT count(*) FROM kn_docs d WHERE d.scope = s.name),
			(SELECT coalesce(sum(d.chunks), 0) FROM kn_docs d WHERE d.scope = s.name),
			(SELECT coalesce(sum(d.bytes), 0) FROM kn_docs d WHERE d.scope = s.name)
		FROM kn_scopes s ORDER BY s.name`)
	if err != nil {
		return nil, fmt.Errorf("knowledge: scopes: %w", err)
	}
	defer rows.Close()
	var out []ScopeInfo
	for rows.Next() {
		var si ScopeInfo
		var name, labels string
		if err := rows.Scan(&name, &labels, &si.Docs, &si.Chunks, &si.Bytes); err != nil {
			return nil, fmt.Errorf("knowledge: scopes: %w", err)
		}
		si.Name, si.Labels = Scope(name), splitLabels(labels)
		out = append(out, si)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("knowledge: scopes: %w", err)
	}
	return out, nil
}

// Occupied returns the scopes that hold at least one document, by name.
// It reads only the scope table and the (scope, source) index, never the
// documents' rows, so it costs the same however much a scope holds: the
// question a run's start asks (may it be offered knowledge_search?),
// where Scopes would sum every document's chunks and bytes.
func (ix *Index) Occupied(ctx context.Context) ([]Scope, error) {
	rows, err := ix.r.QueryContext(ctx, `SELECT s.name FROM kn_scopes s
		WHERE EXISTS (SELECT 1 FROM kn_docs d WHERE d.scope = s.name) ORDER BY s.name`)
	if err != nil {
		return nil, fmt.Errorf("knowledge: scopes: %w", err)
	}
	defer rows.Close()
	var out []Scope
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, fmt.Errorf("knowledge: scopes: %w", err)
		}
		out = append(out, Scope(name))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("knowledge: scopes: %w", err)
	}
	return out, nil
}

func splitLabels(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// ensureScope creates scope s with labels when it is new.
func ensureScope(ctx context.Context, tx *sql.Tx, s Scope, labels []string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO kn_scopes(name, labels, created_at) VALUES (?, ?, ?) ON CONFLICT(name) DO NOTHING`,
		string(s), strings.Join(labels, ","), time.Now().UnixNano())
	return err
}

// Doc is an indexed document and its provenance.
type Doc struct {
	ID      string // "d" and a number
	Source  string // absolute path, URL or "keel:run/ID"
	Type    string // "markdown", "go", "text", a language name (see TypeOf)
	Hash    string // hex SHA-256 of the content
	AddedBy string // "cli", "client:NAME", "run:ID", "watch", ...
	Scope   Scope
	Labels  []string // the scope's labels
	ModTime time.Time
	AddedAt time.Time
	Chunks  int
	Bytes   int64
}

func docID(id int64) string { return "d" + strconv.FormatInt(id, 10) }

func parseDocID(s string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimPrefix(s, "d"), 10, 64)
	return n, err == nil && strings.HasPrefix(s, "d") && n > 0
}

func chunkID(id int64) string { return "c" + strconv.FormatInt(id, 10) }

// List returns the documents of scope ("" = every scope), by scope and
// source.
func (ix *Index) List(ctx context.Context, scope Scope) ([]Doc, error) {
	q := `SELECT d.id, d.source, d.type, d.hash, d.added_by, d.scope, s.labels, d.mtime, d.added_at, d.chunks, d.bytes
		FROM kn_docs d JOIN kn_scopes s ON s.name = d.scope`
	var args []any
	if scope != "" {
		if _, err := ParseScope(string(scope)); err != nil {
			return nil, err
		}
		q += ` WHERE d.scope = ?`
		args = append(args, string(scope))
	}
	rows, err := ix.r.QueryContext(ctx, q+` ORDER BY d.scope, d.source`, args...)
	if err != nil {
		return nil, fmt.Errorf("knowledge: list: %w", err)
	}
	defer rows.Close()
	var out []Doc
	for rows.Next() {
		var d Doc
		var id, mt, at int64
		var scope, labels string
		if err := rows.Scan(&id, &d.Source, &d.Type, &d.Hash, &d.AddedBy, &scope, &labels, &mt, &at, &d.Chunks, &d.Bytes); err != nil {
			return nil, fmt.Errorf("knowledge: list: %w", err)
		}
		d.ID, d.Scope, d.Labels = docID(id), Scope(scope), splitLabels(labels)
		d.ModTime, d.AddedAt = time.Unix(0, mt), time.Unix(0, at)
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("knowledge: list: %w", err)
	}
	return out, nil
}

// begin starts a write transaction. Its statements run under ctx, but the
// transaction is not bound to it: database/sql rolls a transaction whose
// context ends back on a goroutine of its own, after the call has
// returned, so a cancelled call would return with the write lock still
// held; the caller's deferred Rollback ends it before it returns instead.
func (ix *Index) begin(ctx context.Context) (*sql.Tx, error) {
	return ix.w.BeginTx(context.WithoutCancel(ctx), nil)
}
