package mcpserver_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/internal/testcache"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/datadir"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/wasmtools/builtin"
)

// cliEnv, set to "1", makes the test binary the keel command line: the
// stdio tests and the TypeScript client start it as `keel mcp`.
const cliEnv = "KEEL_MCPSERVER_TEST_CLI"

// The daemon every test of the package shares, started by TestMain:
// wordcount (read-only, no grants) and readfile (requests a directory,
// granted none, so its calls are refused) are installed; writefile is at
// hand to install and remove (toolChange).
var (
	shared struct {
		dir   string // data dir
		base  string // http://127.0.0.1:PORT
		token string // the daemon's own token
		c     *client.Client
		// spare holds writefile.wasm, not installed.
		spare string
	}
	// toolChange serializes the tests that install or remove a tool.
	toolChange sync.Mutex
)

func TestMain(m *testing.M) {
	if os.Getenv(cliEnv) == "1" {
		os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	code, err := testMain(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpserver TestMain:", err)
		code = 1
	}
	os.Exit(code)
}

func testMain(m *testing.M) (int, error) {
	tmp, err := os.MkdirTemp("", "keel-mcpserver-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	bundled := filepath.Join(tmp, "bundled")
	if err := builtin.Install(bundled); err != nil {
		return 0, err
	}
	dir := filepath.Join(tmp, "data")
	tools := filepath.Join(dir, "tools")
	if err := os.MkdirAll(tools, 0o700); err != nil {
		return 0, err
	}
	// The bundled tools count as installed: only these two are there.
	if err := os.WriteFile(filepath.Join(tools, ".examples-installed"), nil, 0o600); err != nil {
		return 0, err
	}
	for _, name := range []string{"wordcount", "readfile"} {
		if err := copyFile(filepath.Join(bundled, name+".wasm"), filepath.Join(tools, name+".wasm")); err != nil {
			return 0, err
		}
	}
	shared.spare = filepath.Join(bundled, "writefile.wasm")
	cache, err := compileCache(bundled)
	if err != nil {
		return 0, err
	}

	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan protocol.DaemonInfo, 1)
	done := make(chan error, 1)
	cfg := daemon.Config{DataDir: dir, Addr: "127.0.0.1:0", CacheDir: cache,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Ready:  func(i protocol.DaemonInfo) { ready <- i }}
	go func() { done <- daemon.Run(ctx, cfg) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				fmt.Fprintln(os.Stderr, "daemon.Run:", err)
			}
		case <-time.After(30 * time.Second):
			fmt.Fprintln(os.Stderr, "the daemon did not stop within 30 s")
		}
	}()
	var info protocol.DaemonInfo
	select {
	case info = <-ready:
	case err := <-done:
		return 0, fmt.Errorf("daemon.Run: %w", err)
	case <-time.After(time.Minute):
		return 0, fmt.Errorf("the daemon was not ready within a minute")
	}
	tok, err := datadir.ReadToken(dir, info)
	if err != nil {
		return 0, err
	}
	c, err := client.DialDataDir(ctx, dir)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	// A call waits for its tool to compile: after these, both are ready
	// (or loaded from the cache) for every test.
	for _, name := range []string{"wordcount", "readfile"} {
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Minute)
		_, err := c.CallTool(wctx, name, json.RawMessage(`{"text":"warm up","path":"x"}`))
		wcancel()
		if err != nil && !isToolError(err) {
			return 0, fmt.Errorf("warm up %s: %w", name, err)
		}
	}
	shared.dir, shared.token, shared.c = dir, tok, c
	shared.base = "http://" + strings.TrimSuffix(strings.TrimPrefix(info.URL, "ws://"), protocol.Path)
	return m.Run(), nil
}

// isToolError reports whether err is a tool's failure (the call reached
// the tool).
func isToolError(err error) bool {
	pe, ok := err.(*protocol.Error)
	return ok && (pe.Code == protocol.CodeToolError || pe.Code == protocol.CodeInvalidToolInput)
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}

// compileCache returns a wazero compilation cache for the tools in dir
// that outlives the test binary (compiling Go modules takes seconds, far
// more under -race), under a key naming what its content depends on:
// wazero's version, wasmtools' code and the tool files.
func compileCache(dir string) (string, error) {
	h := sha256.New()
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range bi.Deps {
			if dep.Path == "github.com/tetratelabs/wazero" {
				fmt.Fprintf(h, "wazero %s %s\n", dep.Version, dep.Sum)
			}
		}
	}
	src, err := filepath.Glob(filepath.Join("..", "..", "wasmtools", "*.go"))
	if err != nil || len(src) == 0 {
		return "", fmt.Errorf("wasmtools sources for the cache key: %v (found %d)", err, len(src))
	}
	wasm, _ := filepath.Glob(filepath.Join(dir, "*.wasm"))
	for _, f := range append(src, wasm...) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %x\n", filepath.Base(f), sha256.Sum256(b))
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]
	base, err := os.UserCacheDir()
	if err != nil {
		return filepath.Join(dir, "cache"), nil
	}
	parent := filepath.Join(base, "keel", "mcpserver-test")
	testcache.PruneDirs(parent, key, 24*time.Hour, 512*testcache.MiB)
	return filepath.Join(parent, key), nil
}

// bearer is an http.RoundTripper that adds a token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// httpClient is an HTTP client that presents token.
func httpClient(token string) *http.Client {
	return &http.Client{Transport: bearer{token: token, next: http.DefaultTransport}}
}
