package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/internal/daemontest"
	"github.com/keel-runtime/keel/ipc/client"
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
	dir := daemontest.EmptyDataDir(t)
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg.DataDir, cfg.Provider = dir, p
	cfg.CacheDir = filepath.Join(dir, "cache")
	daemontest.Start(t, cfg)
	return &testDaemon{dir: dir, c: daemontest.Dial(t, dir)}
}

// keel runs the command line against d's daemon until ctx ends.
func (d *testDaemon) keel(ctx context.Context, args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = cli.Main(ctx, append(args, "--data-dir", d.dir), &out, &errb)
	return out.String(), errb.String(), code
}
