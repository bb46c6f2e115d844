package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/keel-runtime/keel"
)

// TestClientTokens: a database from before migration 014 gains the
// table; tokens are created, found by their secret's hash, listed by
// name, touched, kept across a reopen and revoked.
func TestClientTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path, db := migratedTo(t, 13)
	db.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1700000000, 0).UTC()
	vscode := keel.ClientToken{Name: "vscode", SHA256: "aa", Scopes: []string{"read", "run"}, Origins: []string{"vscode-webview://*"}, Created: at}
	ci := keel.ClientToken{Name: "ci", SHA256: "bb", Scopes: []string{"read"}, Created: at, Expires: at.Add(time.Hour)}
	for _, tok := range []keel.ClientToken{vscode, ci} {
		if err := s.CreateClientToken(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateClientToken(ctx, keel.ClientToken{Name: "vscode", SHA256: "cc", Created: at}); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("CreateClientToken of an existing name = %v, want ErrConflict", err)
	}
	if err := s.TouchClientToken(ctx, "vscode", at.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.ClientTokenBySHA256(ctx, "aa")
	vscode.LastUsed = at.Add(time.Minute)
	if err != nil || !cmp.Equal(got, vscode) {
		t.Errorf("ClientTokenBySHA256(aa) = %+v, %v; want %+v", got, err, vscode)
	}
	if _, err := s.ClientTokenBySHA256(ctx, "zz"); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("ClientTokenBySHA256(unknown) = %v, want ErrNotFound", err)
	}
	ci.Origins = []string{}
	list, err := s.ClientTokens(ctx)
	if diff := cmp.Diff([]keel.ClientToken{ci, vscode}, list); err != nil || diff != "" {
		t.Errorf("ClientTokens = %v (-want +got):\n%s", err, diff)
	}
	if err := s.DeleteClientToken(ctx, "vscode"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteClientToken(ctx, "vscode"); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("DeleteClientToken twice = %v, want ErrNotFound", err)
	}
	if _, err := s.ClientTokenBySHA256(ctx, "aa"); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("a revoked token is still found: %v", err)
	}
}
