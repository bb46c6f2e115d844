package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/keel-runtime/keel/capabilities"
)

// ToolGrants returns the stored grants of every tool that has a row.
func (s *Store) ToolGrants(ctx context.Context) (map[string]capabilities.Grants, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT tool, grants FROM tool_grants`)
	if err != nil {
		return nil, fmt.Errorf("tool grants: %w", mapErr(err))
	}
	defer rows.Close()
	out := map[string]capabilities.Grants{}
	for rows.Next() {
		var tool, raw string
		if err := rows.Scan(&tool, &raw); err != nil {
			return nil, fmt.Errorf("tool grants: %w", mapErr(err))
		}
		var g capabilities.Grants
		if err := json.Unmarshal([]byte(raw), &g); err != nil {
			return nil, fmt.Errorf("tool grants of %s: %w", tool, err)
		}
		out[tool] = g
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tool grants: %w", mapErr(err))
	}
	return out, nil
}

// SetToolGrants replaces what tool is granted (empty grants record that
// the user granted nothing).
func (s *Store) SetToolGrants(ctx context.Context, tool string, g capabilities.Grants, at time.Time) error {
	raw, err := json.Marshal(g)
	if err != nil {
		return err
	}
	err = s.wr.write(ctx, func(ctx context.Context, tx *wtx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO tool_grants (tool, grants, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (tool) DO UPDATE SET grants = excluded.grants, updated_at = excluded.updated_at`, tool, string(raw), nanos(at))
		return err
	})
	if err != nil {
		return fmt.Errorf("set grants of %s: %w", tool, mapErr(err))
	}
	return nil
}

// DeleteToolGrants forgets every grant of tool, as when it is removed.
func (s *Store) DeleteToolGrants(ctx context.Context, tool string) error {
	err := s.wr.write(ctx, func(ctx context.Context, tx *wtx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM tool_grants WHERE tool = ?`, tool)
		return err
	})
	if err != nil {
		return fmt.Errorf("delete grants of %s: %w", tool, mapErr(err))
	}
	return nil
}
