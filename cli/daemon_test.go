package cli_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
)

// testDaemon is a real daemon, in this process, serving the CLI over its
// real loopback WebSocket: a data dir with no tools (so nothing compiles)
// and a scripted model.
type testDaemon struct {
	dir string
	c   *client.Client
}

// startDaemon starts a daemon with cfg (its data dir, address, logger and
// provider filled in when empty) and stops it when the test ends. files
// are written into the data dir first (models.json, say).
func startDaemon(t *testing.T, cfg daemon.Config, p models.Provider, files map[string]string) *testDaemon {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tools"), 0o700); err != nil {
		t.Fatal(err)
	}
	// The bundled tools count as installed once: none are compiled.
	files[filepath.Join("tools", ".examples-installed")] = ""
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg.DataDir, cfg.Addr, cfg.Provider = dir, "127.0.0.1:0", p
	cfg.CacheDir = filepath.Join(dir, "cache")
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ready := make(chan protocol.DaemonInfo, 1)
	cfg.Ready = func(i protocol.DaemonInfo) { ready <- i }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- daemon.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("daemon.Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("daemon did not stop within 30s")
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("daemon.Run: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("daemon not ready within a minute")
	}
	c, err := client.DialDataDir(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &testDaemon{dir: dir, c: c}
}

// keel runs the command line against d's daemon until ctx ends.
func (d *testDaemon) keel(ctx context.Context, args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = cli.Main(ctx, append(args, "--data-dir", d.dir), &out, &errb)
	return out.String(), errb.String(), code
}
