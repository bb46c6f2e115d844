package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/keel-runtime/keel"
)

// CreateClientToken stores a new client token. It fails with
// keel.ErrConflict if one of that name (or secret) exists.
func (s *Store) CreateClientToken(ctx context.Context, t keel.ClientToken) error {
	scopes, err := json.Marshal(nonNilStrings(t.Scopes))
	if err != nil {
		return err
	}
	origins, err := json.Marshal(nonNilStrings(t.Origins))
	if err != nil {
		return err
	}
	err = s.wr.write(ctx, func(ctx context.Context, tx *wtx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO client_tokens (name, sha256, scopes, origins, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)`,
			t.Name, t.SHA256, string(scopes), string(origins), nanos(t.Created), optNanos(t.Expires))
		return err
	})
	if err != nil {
		return fmt.Errorf("create client token %s: %w", t.Name, mapErr(err))
	}
	return nil
}

// ClientTokenBySHA256 returns the client token whose secret has the hex
// SHA-256 sum, or an error wrapping keel.ErrNotFound.
func (s *Store) ClientTokenBySHA256(ctx context.Context, sum string) (keel.ClientToken, error) {
	row := s.r.QueryRowContext(ctx, `SELECT name, sha256, scopes, origins, created_at, expires_at, last_used FROM client_tokens WHERE sha256 = ?`, sum)
	t, err := scanClientToken(row)
	if err != nil {
		return keel.ClientToken{}, fmt.Errorf("client token: %w", err)
	}
	return t, nil
}

// ClientTokens returns every client token, by name.
func (s *Store) ClientTokens(ctx context.Context) ([]keel.ClientToken, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT name, sha256, scopes, origins, created_at, expires_at, last_used FROM client_tokens ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("client tokens: %w", mapErr(err))
	}
	defer rows.Close()
	out := []keel.ClientToken{}
	for rows.Next() {
		t, err := scanClientToken(rows)
		if err != nil {
			return nil, fmt.Errorf("client tokens: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("client tokens: %w", mapErr(err))
	}
	return out, nil
}

// DeleteClientToken forgets the client token name. It fails with an
// error wrapping keel.ErrNotFound if there is none.
func (s *Store) DeleteClientToken(ctx context.Context, name string) error {
	err := s.wr.write(ctx, func(ctx context.Context, tx *wtx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM client_tokens WHERE name = ?`, name)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			return fmt.Errorf("no client token named %q: %w", name, keel.ErrNotFound)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("revoke client token: %w", mapErr(err))
	}
	return nil
}

// TouchClientToken records that the client token name was used at at. A
// token that no longer exists is not an error.
func (s *Store) TouchClientToken(ctx context.Context, name string, at time.Time) error {
	err := s.wr.write(ctx, func(ctx context.Context, tx *wtx) error {
		_, err := tx.ExecContext(ctx, `UPDATE client_tokens SET last_used = ? WHERE name = ?`, nanos(at), name)
		return err
	})
	if err != nil {
		return fmt.Errorf("client token %s: %w", name, mapErr(err))
	}
	return nil
}

type scanner interface{ Scan(dest ...any) error }

func scanClientToken(row scanner) (keel.ClientToken, error) {
	var t keel.ClientToken
	var scopes, origins string
	var created, expires, used int64
	if err := row.Scan(&t.Name, &t.SHA256, &scopes, &origins, &created, &expires, &used); err != nil {
		if err == sql.ErrNoRows {
			return t, keel.ErrNotFound
		}
		return t, mapErr(err)
	}
	if err := json.Unmarshal([]byte(scopes), &t.Scopes); err != nil {
		return t, fmt.Errorf("scopes of %s: %w", t.Name, err)
	}
	if err := json.Unmarshal([]byte(origins), &t.Origins); err != nil {
		return t, fmt.Errorf("origins of %s: %w", t.Name, err)
	}
	t.Created = fromNanos(created)
	if expires != 0 {
		t.Expires = fromNanos(expires)
	}
	if used != 0 {
		t.LastUsed = fromNanos(used)
	}
	return t, nil
}

// optNanos is nanos, with 0 for the zero time.
func optNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return nanos(t)
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
