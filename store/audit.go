package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/keel-runtime/keel"
)

// RecordToolCall appends one record to the tool audit trail and returns
// its ID once it is on disk.
func (s *Store) RecordToolCall(ctx context.Context, a keel.ToolAudit) (int64, error) {
	ins, err := auditInsert(a)
	if err != nil {
		return 0, err
	}
	var id int64
	err = s.wr.write(ctx, func(ctx context.Context, tx *wtx) error {
		res, err := ins(ctx, tx)
		if err != nil {
			return err
		}
		id, err = res.LastInsertId()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("record tool call %s: %w", a.Tool, mapErr(err))
	}
	return id, nil
}

// QueueToolCall appends one record to the tool audit trail with the next
// write of any kind (or within a short delay if none comes). The engine
// journals a run's tool result right after the call, so a run's call and
// its audit record reach the disk in the same transaction, without an
// fsync of their own. An error committing it goes to
// Options.OnLazyError.
func (s *Store) QueueToolCall(a keel.ToolAudit) error {
	ins, err := auditInsert(a)
	if err != nil {
		return err
	}
	s.wr.writeNext(func(ctx context.Context, tx *wtx) error {
		if _, err := ins(ctx, tx); err != nil {
			return fmt.Errorf("record tool call %s: %w", a.Tool, mapErr(err))
		}
		return nil
	})
	return nil
}

// auditInsert returns the statement that inserts a.
func auditInsert(a keel.ToolAudit) (func(context.Context, *wtx) (sql.Result, error), error) {
	grants, err := json.Marshal(a.Grants)
	if err != nil {
		return nil, err
	}
	if a.Grants == nil {
		grants = []byte("[]")
	}
	return func(ctx context.Context, tx *wtx) (sql.Result, error) {
		return tx.ExecContext(ctx, qInsertAudit,
			nanos(a.Time), a.Tool, a.Version, a.SHA256, string(a.RunID), a.Step, a.CallID, a.ArgsSHA256, string(grants), a.Outcome, a.Error, int64(a.Duration))
	}, nil
}

// ToolCalls returns up to limit audit records, newest first; tool, when
// not empty, keeps only that tool's calls.
func (s *Store) ToolCalls(ctx context.Context, tool string, limit int) ([]keel.ToolAudit, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id, time, tool, version, sha256, run_id, step, call_id, args_sha256, grants, outcome, error, duration
		FROM tool_audit WHERE (? = '' OR tool = ?) ORDER BY id DESC LIMIT ?`, tool, tool, limit)
	if err != nil {
		return nil, fmt.Errorf("tool audit: %w", mapErr(err))
	}
	defer rows.Close()
	var out []keel.ToolAudit
	for rows.Next() {
		var a keel.ToolAudit
		var at, dur int64
		var run, grants string
		if err := rows.Scan(&a.ID, &at, &a.Tool, &a.Version, &a.SHA256, &run, &a.Step, &a.CallID, &a.ArgsSHA256, &grants, &a.Outcome, &a.Error, &dur); err != nil {
			return nil, fmt.Errorf("tool audit: %w", mapErr(err))
		}
		a.Time, a.Duration, a.RunID = fromNanos(at), time.Duration(dur), keel.RunID(run)
		if err := json.Unmarshal([]byte(grants), &a.Grants); err != nil {
			return nil, fmt.Errorf("tool audit %d: grants: %w", a.ID, err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tool audit: %w", mapErr(err))
	}
	return out, nil
}
