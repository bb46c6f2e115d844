package knowledge

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
)

// ForgetSelector names what Forget deletes; exactly one field is set.
type ForgetSelector struct {
	Path  string // a source, or every source under it as a directory, in every scope
	ID    string // a document ID (Doc.ID)
	Scope Scope  // a whole scope, and the scope itself (its labels)
}

// ErrCheckpointBusy is wrapped by Forget's error when the documents are
// deleted but the write-ahead log could not be truncated (readers kept
// it busy for CheckpointWait): the deleted text stays in the log file
// until the next checkpoint.
var ErrCheckpointBusy = errors.New("knowledge: deleted, but the write-ahead log is still in use")

// CheckpointWait is how long Forget retries truncating the write-ahead log.
const CheckpointWait = 5 * time.Second

// Forget deletes documents, their chunks, FTS entries and vectors, and
// makes them unrecoverable from the database files: deleted rows are
// overwritten (secure_delete), the FTS index drops the chunks' tokens at
// once (its secure-delete option: no delete markers left behind), and the
// write-ahead log is checkpointed and truncated. It returns how many
// documents went. The error wraps keel.ErrNotFound when the selector
// names nothing, keel.ErrInvalid when it sets not exactly one field,
// ErrScope for a malformed scope, and ErrCheckpointBusy (with the count)
// when only the last step failed.
func (ix *Index) Forget(ctx context.Context, sel ForgetSelector) (int, error) {
	set := 0
	for _, s := range []string{sel.Path, sel.ID, string(sel.Scope)} {
		if s != "" {
			set++
		}
	}
	if set != 1 {
		return 0, fmt.Errorf("knowledge: forget: set exactly one of path, id or scope: %w", keel.ErrInvalid)
	}
	sel.Path = trimSlash(sel.Path)
	var q string
	var args []any
	switch {
	case sel.Path != "":
		q, args = `SELECT id, scope FROM kn_docs WHERE source = ? OR substr(source, 1, ?) = ?`, []any{sel.Path, len([]rune(sel.Path)) + 1, sel.Path + "/"}
	case sel.ID != "":
		id, ok := parseDocID(sel.ID)
		if !ok {
			return 0, fmt.Errorf("knowledge: forget: %q is not a document id: %w", sel.ID, keel.ErrNotFound)
		}
		q, args = `SELECT id, scope FROM kn_docs WHERE id = ?`, []any{id}
	default:
		if _, err := ParseScope(string(sel.Scope)); err != nil {
			return 0, err
		}
		q, args = `SELECT id, scope FROM kn_docs WHERE scope = ?`, []any{string(sel.Scope)}
	}
	tx, err := ix.begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("knowledge: forget: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("knowledge: forget: %w", err)
	}
	var ids []int64
	scopes := map[Scope]bool{}
	for rows.Next() {
		var id int64
		var s string
		if err := rows.Scan(&id, &s); err != nil {
			rows.Close()
			return 0, fmt.Errorf("knowledge: forget: %w", err)
		}
		ids = append(ids, id)
		scopes[Scope(s)] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("knowledge: forget: %w", err)
	}
	stmt := txStmt(tx)
	for _, id := range ids {
		if err := deleteDoc(ctx, stmt, id); err != nil {
			return 0, fmt.Errorf("knowledge: forget: %w", err)
		}
	}
	scopeGone := false
	if sel.Scope != "" {
		res, err := tx.ExecContext(ctx, `DELETE FROM kn_scopes WHERE name = ?`, string(sel.Scope))
		if err != nil {
			return 0, fmt.Errorf("knowledge: forget: %w", err)
		}
		n, _ := res.RowsAffected()
		scopeGone = n > 0
		scopes[sel.Scope] = true
	}
	if len(ids) == 0 && !scopeGone {
		return 0, fmt.Errorf("knowledge: forget: nothing at %s%s%s: %w", sel.Path, sel.ID, sel.Scope, keel.ErrNotFound)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("knowledge: forget: %w", err)
	}
	for s := range scopes {
		ix.vecs.invalidate(s)
	}
	if err := ix.truncateWAL(ctx); err != nil {
		return len(ids), err
	}
	return len(ids), nil
}

// trimSlash drops a directory path's trailing slashes ("/a/b/" is "/a/b"),
// so that it names the documents under it.
func trimSlash(p string) string {
	for len(p) > 1 && strings.HasSuffix(p, "/") {
		p = p[:len(p)-1]
	}
	return p
}

// deleteDoc deletes a document with its chunks, vectors and FTS entries.
func deleteDoc(ctx context.Context, stmt stmtFunc, id int64) error {
	if err := deleteChunks(ctx, stmt, id, nil); err != nil {
		return err
	}
	s, err := stmt(ctx, `DELETE FROM kn_docs WHERE id = ?`)
	if err != nil {
		return err
	}
	_, err = s.ExecContext(ctx, id)
	return err
}

// truncateWAL checkpoints the write-ahead log into the database and
// truncates it to zero bytes, retrying while readers hold it.
func (ix *Index) truncateWAL(ctx context.Context) error {
	deadline := time.Now().Add(CheckpointWait)
	for {
		var busy, logFrames, done int
		err := ix.w.QueryRowContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, &logFrames, &done)
		if err != nil {
			return fmt.Errorf("knowledge: forget: checkpoint: %w", err)
		}
		if busy == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return ErrCheckpointBusy
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("knowledge: forget: checkpoint: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
