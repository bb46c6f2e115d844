package daemon_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
)

var errBroken = errors.New("listener broke")

// breakingListener is a listener whose Accept fails with errBroken once
// broken, as a listener can fail under a server.
type breakingListener struct {
	net.Listener
	once   sync.Once
	broken chan struct{}
}

func (l *breakingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	select {
	case <-l.broken:
		if c != nil {
			c.Close()
		}
		return nil, errBroken
	default:
	}
	return c, err
}

func (l *breakingListener) breakNow() {
	l.once.Do(func() { close(l.broken) })
	// Wake the Accept in progress.
	if c, err := net.Dial("tcp", l.Addr().String()); err == nil {
		c.Close()
	}
}

// TestServeOnCallersListener: the daemon serves on the listener its
// caller bound; New holds the data directory until Close; a listener
// that fails stops the daemon in order (daemon.json removed) and Serve
// says why.
func TestServeOnCallersListener(t *testing.T) {
	t.Parallel()
	dir := noTools(t)
	ready := make(chan protocol.DaemonInfo, 1)
	cfg := daemon.Config{DataDir: dir, Provider: scripted.New(nil), CacheDir: filepath.Join(dir, "cache", "wazero"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Ready: func(i protocol.DaemonInfo) { ready <- i }}
	d, err := daemon.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := daemon.New(cfg); !errors.Is(err, daemon.ErrAlreadyRunning) {
		t.Fatalf("second New on the data dir = %v, want ErrAlreadyRunning", err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &breakingListener{Listener: inner, broken: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- d.Serve(context.Background(), ln) }()
	var info protocol.DaemonInfo
	select {
	case info = <-ready:
	case err := <-done:
		t.Fatalf("Serve returned before ready: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("daemon not ready within 2 minutes")
	}
	port := strconv.Itoa(inner.Addr().(*net.TCPAddr).Port)
	if !strings.Contains(info.URL, ":"+port+"/") {
		t.Errorf("daemon.json URL %s, want the caller's listener, port %s", info.URL, port)
	}
	if _, err := dial(t, dir).Describe(context.Background()); err != nil {
		t.Fatalf("env.describe on the caller's listener: %v", err)
	}

	ln.breakNow()
	select {
	case err := <-done:
		if !errors.Is(err, errBroken) {
			t.Errorf("Serve after its listener broke = %v, want it to wrap %v", err, errBroken)
		}
	case <-time.After(time.Minute):
		t.Fatal("Serve did not return within a minute of its listener breaking")
	}
	if _, err := os.Stat(filepath.Join(dir, protocol.DaemonFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("daemon.json after the daemon stopped: %v, want it removed", err)
	}
	if err := d.Serve(context.Background(), inner); err == nil {
		t.Error("a second Serve = nil, want an error")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d2, err := daemon.New(cfg)
	if err != nil {
		t.Fatalf("New after Close = %v, want the data dir free", err)
	}
	d2.Close()
}
