// Package daemontest runs a real keel daemon inside a test process, on a
// temporary data directory and a free loopback port, and gives tests the
// waits they share: a run followed to its end over the real WebSocket,
// tools.list watched until a condition holds, the real command line run
// against the daemon. Only tests use this package.
package daemontest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/internal/dbtest"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// How long the helpers wait before they fail the test. They wait on
// events, never on the clock: these only bound a hang.
const (
	readyTimeout = 2 * time.Minute
	stopTimeout  = time.Minute
	waitTimeout  = 2 * time.Minute
)

// Daemon is a daemon running in the test process.
type Daemon struct {
	Dir  string              // its data directory
	Info protocol.DaemonInfo // what it published when ready

	stopOnce sync.Once
	cancel   context.CancelFunc
	done     chan error
	err      error
}

// Start runs daemon.Run on cfg until Stop or the test's end, and returns
// once the daemon is ready. Unset fields are filled in: DataDir with a
// new EmptyDataDir, Addr with a free loopback port, Logger with one that
// discards, Synchronous with "NORMAL": the tests check what the daemon
// journals and answers, not what a power cut leaves of it, and each
// commit at FULL waits for an fsync (a test about durability sets
// "FULL"; cmd/keel's crash tests run the real binary, at FULL). A data
// directory that exists without a database is given one already
// migrated (dbtest.SeedDataDir), as a daemon's first start leaves it. It fails the test when the daemon stops before it is ready,
// and (at the test's end) when it returns an error on its way down.
func Start(t testing.TB, cfg daemon.Config) *Daemon {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = EmptyDataDir(t)
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Synchronous == "" {
		cfg.Synchronous = "NORMAL"
	}
	if err := dbtest.SeedDataDir(cfg.DataDir); err != nil {
		t.Fatal(err)
	}
	ready := make(chan protocol.DaemonInfo, 1)
	cfg.Ready = func(i protocol.DaemonInfo) { ready <- i }
	ctx, cancel := context.WithCancel(context.Background())
	d := &Daemon{Dir: cfg.DataDir, cancel: cancel, done: make(chan error, 1)}
	go func() { d.done <- daemon.Run(ctx, cfg) }()
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("daemon stop: %v", err)
		}
	})
	select {
	case d.Info = <-ready:
	case err := <-d.done:
		d.stopOnce.Do(func() { d.err = err })
		cancel()
		t.Fatalf("daemon.Run returned before it was ready: %v", err)
	case <-time.After(readyTimeout):
		t.Fatalf("the daemon was not ready within %v", readyTimeout)
	}
	return d
}

// Stop cancels the daemon and waits for daemon.Run to return, and
// returns its error. Only the first call stops; later ones return the
// same error.
func (d *Daemon) Stop() error {
	d.stopOnce.Do(func() {
		d.cancel()
		select {
		case d.err = <-d.done:
		case <-time.After(stopTimeout):
			d.err = errors.New("the daemon did not stop within " + stopTimeout.String())
		}
	})
	return d.err
}

// EmptyDataDir is a new data directory whose daemon installs no tools
// (the bundled ones count as installed already), so it compiles nothing.
func EmptyDataDir(t testing.TB) string {
	t.Helper()
	return DataDir(t, nil)
}

// DataDir is a new data directory whose tools/ holds files (name to
// content, a module and its sidecar manifest say), the bundled tools
// counting as installed already.
func DataDir(t testing.TB, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	tools := filepath.Join(dir, "tools")
	if err := os.MkdirAll(tools, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tools, ".examples-installed"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(tools, name), body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Dial connects a client to the daemon of data directory dir, closed at
// the test's end.
func Dial(t testing.TB, dir string) *client.Client {
	t.Helper()
	c, err := client.DialDataDir(context.Background(), dir)
	if err != nil {
		t.Fatalf("DialDataDir: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Ended lists the events that end a run.
var Ended = []keel.EventType{keel.EventRunSucceeded, keel.EventRunFailed, keel.EventRunCancelled}

// Follow subscribes c to run id and returns its events, in order, up to
// and including the first of type until (Ended when none is given: an
// interruption is not an end, the run resumes). Other runs' events on c
// are skipped. It fails the test when the connection closes or after
// two minutes.
func Follow(t testing.TB, c *client.Client, id keel.RunID, until ...keel.EventType) []keel.Event {
	t.Helper()
	if len(until) == 0 {
		until = Ended
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := c.Subscribe(ctx, id, 0); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	var evs []keel.Event
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				t.Fatalf("connection closed following run %s; got %v", id, Types(evs))
			}
			if ev.RunID != id || ev.Seq == 0 {
				continue
			}
			evs = append(evs, ev)
			if slices.Contains(until, ev.Type) {
				return evs
			}
		case <-ctx.Done():
			t.Fatalf("run %s: none of %v within %v; got %v", id, until, waitTimeout, Types(evs))
		}
	}
}

// RunToEnd starts a run with p through c, follows it until it ends and
// returns its detail.
func RunToEnd(t testing.TB, c *client.Client, p protocol.RunStartParams) protocol.RunDetail {
	t.Helper()
	run, err := c.StartRun(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	Follow(t, c, run.ID)
	got, err := c.GetRun(context.Background(), run.ID)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// Types lists the types of evs, for failure messages.
func Types(evs []keel.Event) []keel.EventType {
	out := make([]keel.EventType, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

// WaitTools asks c's daemon for tools.list until ok holds of it, again
// at each tools.changed notification, and returns that list. It fails
// after two minutes, saying it waited for what. Tools a daemon loads at
// start are published without a notification: call it once they are
// loaded, or on a daemon that starts with none.
func WaitTools(t testing.TB, c *client.Client, what string, ok func([]protocol.ToolInfo) bool) []protocol.ToolInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for {
		tools, err := c.ListTools(ctx)
		if err != nil {
			t.Fatalf("%s: tools.list: %v", what, err)
		}
		if ok(tools) {
			return tools
		}
		select {
		case <-c.ToolsChanged():
		case <-ctx.Done():
			t.Fatalf("%s: not within %v; tools.list = %+v", what, waitTimeout, tools)
		}
	}
}

// HasTool holds of a tools.list naming name.
func HasTool(name string) func([]protocol.ToolInfo) bool {
	return func(ts []protocol.ToolInfo) bool {
		return slices.ContainsFunc(ts, func(t protocol.ToolInfo) bool { return t.Name == name })
	}
}

// CLI runs the real command line (cli.Main) against the daemon of data
// directory dir until ctx ends; --data-dir goes first, so args may end
// with a command after --.
func CLI(ctx context.Context, dir string, args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = cli.Main(ctx, append([]string{"--data-dir", dir}, args...), &out, &errb)
	return out.String(), errb.String(), code
}
