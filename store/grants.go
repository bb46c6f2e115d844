package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/keel-runtime/keel/capabilities"
)

// ToolGrant is what the user granted a tool, and the module it was
// granted to. Its SHA256 is the grant digest (wasmtools.GrantDigest) of
// the tool the grants were given to: the hex SHA-256 of its .wasm file,
// covering its sidecar manifest when it had one. "" for grants stored
// before grants were bound to a module; "wasm:" and the .wasm file's
// digest for grants stored before the digest covered the sidecar
// (migration 011), until the daemon binds them.
type ToolGrant = capabilities.BoundGrants

// ToolGrants returns the stored grants of every tool that has a row.
func (s *Store) ToolGrants(ctx context.Context) (map[string]ToolGrant, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT tool, sha256, grants FROM tool_grants`)
	if err != nil {
		return nil, fmt.Errorf("tool grants: %w", mapErr(err))
	}
	defer rows.Close()
	out := map[string]ToolGrant{}
	for rows.Next() {
		var tool, sum, raw string
		if err := rows.Scan(&tool, &sum, &raw); err != nil {
			return nil, fmt.Errorf("tool grants: %w", mapErr(err))
		}
		var g capabilities.Grants
		if err := json.Unmarshal([]byte(raw), &g); err != nil {
			return nil, fmt.Errorf("tool grants of %s: %w", tool, err)
		}
		out[tool] = ToolGrant{SHA256: sum, Grants: g}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tool grants: %w", mapErr(err))
	}
	return out, nil
}

// SetToolGrants replaces what tool is granted, binding it to the module
// of digest g.SHA256 (empty grants record that the user granted
// nothing).
func (s *Store) SetToolGrants(ctx context.Context, tool string, g ToolGrant, at time.Time) error {
	raw, err := json.Marshal(g.Grants)
	if err != nil {
		return err
	}
	err = s.wr.write(ctx, func(ctx context.Context, tx *wtx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO tool_grants (tool, sha256, grants, updated_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (tool) DO UPDATE SET sha256 = excluded.sha256, grants = excluded.grants, updated_at = excluded.updated_at`, tool, g.SHA256, string(raw), nanos(at))
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
