package datadir_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-runtime/keel/ipc/datadir"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestLockOneDaemon checks that a second Lock of the same directory
// fails with ErrAlreadyRunning naming the holder's daemon.json, and
// succeeds once the first is released.
func TestLockOneDaemon(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	unlock, err := datadir.Lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := datadir.WriteInfo(dir, protocol.DaemonInfo{URL: "ws://127.0.0.1:1/", PID: 4242, TokenFile: datadir.TokenFile}); err != nil {
		t.Fatal(err)
	}
	_, err = datadir.Lock(dir)
	if !errors.Is(err, datadir.ErrAlreadyRunning) || !strings.Contains(err.Error(), "pid 4242") {
		t.Fatalf("second Lock = %v, want ErrAlreadyRunning naming pid 4242", err)
	}
	unlock()
	unlock2, err := datadir.Lock(dir)
	if err != nil {
		t.Fatalf("Lock after unlock = %v", err)
	}
	unlock2()
}

// TestTokenRoundTrip checks that EnsureToken makes a private token once,
// and that a client finds the same through daemon.json.
func TestTokenRoundTrip(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tok, path, err := datadir.EnsureToken(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil {
		t.Fatal(err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file %s mode %v, want 0600", path, fi.Mode().Perm())
	}
	if again, _, err := datadir.EnsureToken(dir); err != nil || again != tok {
		t.Fatalf("second EnsureToken = %q, %v, want %q", again, err, tok)
	}
	if err := datadir.WriteInfo(dir, protocol.DaemonInfo{URL: "ws://127.0.0.1:1/", TokenFile: filepath.Base(path)}); err != nil {
		t.Fatal(err)
	}
	info, err := datadir.ReadInfo(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := datadir.ReadToken(dir, info); err != nil || got != tok {
		t.Fatalf("ReadToken = %q, %v, want %q", got, err, tok)
	}
	datadir.RemoveInfo(dir)
	if _, err := datadir.ReadInfo(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ReadInfo after RemoveInfo = %v, want os.ErrNotExist", err)
	}
}

// TestTokenTightened checks that a token file others can read is made
// private, and that one too short is refused.
func TestTokenTightened(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, datadir.TokenFile)
	if err := os.WriteFile(path, []byte(strings.Repeat("a", 64)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := datadir.EnsureToken(dir); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil {
		t.Fatal(err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode after EnsureToken = %v, want 0600", fi.Mode().Perm())
	}
	if err := os.WriteFile(path, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := datadir.EnsureToken(dir); err == nil {
		t.Error("EnsureToken of a short token = nil, want an error")
	}
}
