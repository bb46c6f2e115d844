package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keel-runtime/keel/internal/testcache"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/wasmtools/builtin"
)

// shared holds what every test of the package uses, made once by
// TestMain in a temporary directory removed at exit: building the keel
// binary and a Go wasm tool takes seconds each time, and compiling the
// bundled tools tens of seconds (minutes on a loaded machine).
var shared struct {
	// bin is the keel binary built from this package, never with -race
	// (see buildShared).
	bin string
	// tally is testdata/tally built for wasip1 as a reactor.
	tally string
	// cache is a wazero compilation cache (a daemon's DATA_DIR/cache/wazero)
	// holding the bundled tools and tally compiled by bin. newDataDir links
	// it into each test's data directory.
	cache string
	// coverRaw, when coverage is asked for (see coverEnv), is the
	// GOCOVERDIR every keel process the tests start writes its counters
	// to.
	coverRaw string
	// tmp is TestMain's temporary directory; bundledTool unpacks the
	// bundled tools into tmp/bundled once, on first use.
	tmp          string
	bundledOnce  sync.Once
	bundledError error
}

// coverEnv names a new directory, an absolute path, where the tests
// merge the coverage of the keel processes they start: with it set, bin
// is built with -cover for every package of the module, and TestMain
// writes there, at the end, the merged counters (read them with
// `go tool covdata percent -i DIR`) and their text profile, profile.txt
// (for `go tool cover -func`). A process killed with SIGKILL writes no
// counters. Off by default: the instrumented binary is slower.
const coverEnv = "KEEL_TEST_COVERDIR"

// patience is how long a test waits for what should happen, such as a
// restarted daemon compiling tally from cold or a run ending: minutes, so
// that a loaded machine does not fail the tests; only what is stuck does.
const patience = 5 * time.Minute

func TestMain(m *testing.M) {
	flag.Parse()
	code, err := testMain(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cmd/keel TestMain:", err)
		code = 1
	}
	os.Exit(code)
}

func testMain(m *testing.M) (int, error) {
	if testing.Short() {
		return m.Run(), nil // every test here needs the binary: they skip
	}
	tmp, err := os.MkdirTemp("", "keel-cmd-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	shared.tmp = tmp
	coverOut := os.Getenv(coverEnv)
	if coverOut != "" {
		if !filepath.IsAbs(coverOut) {
			return 0, fmt.Errorf("%s=%s: want an absolute path (go test runs in the package directory)", coverEnv, coverOut)
		}
		if entries, _ := os.ReadDir(coverOut); len(entries) > 0 {
			return 0, fmt.Errorf("%s=%s: want a new or empty directory, not one holding another run's counters", coverEnv, coverOut)
		}
		shared.coverRaw = filepath.Join(tmp, "cover")
		if err := os.Mkdir(shared.coverRaw, 0o700); err != nil {
			return 0, err
		}
		os.Setenv("GOCOVERDIR", shared.coverRaw) // every child's environment starts from this one
	}
	start := time.Now()
	if err := buildShared(tmp); err != nil {
		return 0, err
	}
	built := time.Since(start)
	if err := warmCache(tmp); err != nil {
		return 0, err
	}
	if testing.Verbose() {
		fmt.Printf("cmd/keel TestMain: built keel and tally in %s, compiled the tools in %s\n",
			built.Round(time.Millisecond), (time.Since(start) - built).Round(time.Millisecond))
	}
	code := m.Run()
	if coverOut != "" {
		if err := mergeCoverage(shared.coverRaw, coverOut); err != nil {
			return code, err
		}
	}
	return code, nil
}

// mergeCoverage merges the counters in raw into out and writes their
// text profile, out/profile.txt.
func mergeCoverage(raw, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"merge", "-i", raw, "-o", out},
		{"textfmt", "-i", out, "-o", filepath.Join(out, "profile.txt")},
	} {
		cmd := exec.Command("go", append([]string{"tool", "covdata"}, args...)...)
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, b)
		}
	}
	return nil
}

// buildShared builds the keel binary and tally.wasm into tmp, both at once.
//
// The binary is built without -race even when the tests run with it: a
// race-built daemon compiles the tools about 8 times slower (the bundled
// tools and tally took 281 s of CPU against 36 s), and the crash tests
// compile tally from cold twice. These tests check what the real binary
// does across SIGKILLs and restarts; the daemon's code runs under -race
// in the daemon package's tests, which start it in-process.
func buildShared(tmp string) error {
	shared.bin = filepath.Join(tmp, "keel")
	shared.tally = filepath.Join(tmp, "tally.wasm")
	keel := exec.Command("go", "build", "-o", shared.bin, ".")
	if shared.coverRaw != "" {
		keel = exec.Command("go", "build", "-cover", "-coverpkg=github.com/keel-runtime/keel/...", "-o", shared.bin, ".")
	}
	tally := exec.Command("go", "build", "-trimpath", "-buildmode=c-shared", "-o", shared.tally, "./testdata/tally")
	tally.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, cmd := range []*exec.Cmd{keel, tally} {
		wg.Go(func() {
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// warmCache makes shared.cache a wazero compilation cache holding the
// bundled tools and tally compiled by the keel binary. It outlives the
// test binary (compiling these Go modules takes tens of seconds), under
// a key naming what its content depends on (testcache.Dir); a cache
// already complete (marked by warmDone) is used as it is. Otherwise it
// starts the daemon once on a data directory of its own holding tally
// beside the bundled tools, with that cache, waits until it has compiled
// them all, and stops it.
func warmCache(tmp string) error {
	cache, err := testcache.Dir("cmd-test", filepath.Join("..", "..", "wasmtools"), filepath.Join(tmp, "cache"), 512*testcache.MiB,
		shared.tally, filepath.Join("..", "..", "wasmtools", "builtin", "embedded"))
	if err != nil {
		return err
	}
	shared.cache = cache
	if _, err := os.Stat(filepath.Join(cache, warmDone)); err == nil {
		return nil
	}
	dir := filepath.Join(tmp, "warm")
	if err := os.MkdirAll(filepath.Join(dir, "tools"), 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "cache"), 0o700); err != nil {
		return err
	}
	if err := os.Symlink(cache, filepath.Join(dir, "cache", "wazero")); err != nil {
		return err
	}
	if err := copyFile(shared.tally, filepath.Join(dir, "tools", "tally.wasm")); err != nil {
		return err
	}
	env := append(os.Environ(), "OLLAMA_HOST="+deadAddr(), "KEEL_DATA_DIR="+dir)
	// No deadline: minutes under -race on a loaded machine.
	p, err := startDaemon(env, dir, 0)
	if err != nil {
		return fmt.Errorf("warm the tool cache: %w", err)
	}
	c, err := client.DialDataDir(context.Background(), dir)
	if err == nil {
		err = toolsReady(c, 0)
		c.Close()
	}
	if serr := p.terminate(time.Minute); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("warm the tool cache: %w\n%s", err, p.logs.String())
	}
	// The warm daemon's tool index names a temporary directory: only the
	// compiled modules are worth keeping.
	index, _ := filepath.Glob(filepath.Join(cache, "index-v*"))
	for _, d := range index {
		os.RemoveAll(d)
	}
	return os.WriteFile(filepath.Join(cache, warmDone), nil, 0o600)
}

// warmDone marks a complete warm cache (a dot file: testcache.Link does
// not link it).
const warmDone = ".warm"

// newDataDir returns a new data directory, under a test's temp dir tmp,
// whose wazero cache is a view of shared.cache (testcache.Link): a
// daemon started on it loads the bundled tools and tally compiled, and
// what it writes stays in its own directory.
func newDataDir(tmp string) (string, error) {
	dir := filepath.Join(tmp, "data")
	if err := os.MkdirAll(filepath.Join(dir, "tools"), 0o700); err != nil {
		return "", err
	}
	return dir, testcache.Link(shared.cache, filepath.Join(dir, "cache", "wazero"))
}

// testDataDir returns a new data directory under tmp (newDataDir) and
// the environment of a keel process on it, with no Ollama reachable.
// With tools (paths of modules) it holds those alone, the bundled
// examples counting as installed (loading them at each start would cost
// seconds); without, the daemon installs the bundled examples, as for a
// user.
func testDataDir(t *testing.T, tmp string, tools ...string) (dir string, env []string) {
	t.Helper()
	dir, err := newDataDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools {
		if err := copyFile(tool, filepath.Join(dir, "tools", filepath.Base(tool))); err != nil {
			t.Fatal(err)
		}
	}
	if len(tools) > 0 {
		if err := os.WriteFile(filepath.Join(dir, "tools", ".examples-installed"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir, append(os.Environ(), "OLLAMA_HOST="+deadAddr(), "KEEL_DATA_DIR="+dir)
}

// bundledTool returns the path of the bundled tool name's module,
// unpacked once for the package (from the copy testcache.Installed keeps
// in the user cache directory: unpacking takes seconds of CPU under
// -race). Its compiled code is in shared.cache.
func bundledTool(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join(shared.tmp, "bundled")
	shared.bundledOnce.Do(func() {
		builtinDir := filepath.Join("..", "..", "wasmtools", "builtin")
		shared.bundledError = testcache.Installed("bundled-test", builtinDir, []string{filepath.Join(builtinDir, "embedded")}, dir, builtin.Install)
	})
	if shared.bundledError != nil {
		t.Fatalf("unpack the bundled tools: %v", shared.bundledError)
	}
	return filepath.Join(dir, name+".wasm")
}

// deadAddr is a loopback address where nothing listens: Ollama is down.
func deadAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o600)
}

// keelProc is a daemon process the tests started.
type keelProc struct {
	cmd  *exec.Cmd
	logs *syncWriter   // its stderr
	done chan struct{} // closed once it has exited; err is then set
	err  error         // what cmd.Wait returned
}

// startDaemon starts `keel daemon` on data directory dir with the extra
// flags args, and waits until it serves: its log says it is ready and
// dir/daemon.json names it. timeout 0 waits as long as it takes.
func startDaemon(env []string, dir string, timeout time.Duration, args ...string) (*keelProc, error) {
	os.Remove(filepath.Join(dir, protocol.DaemonFile)) // a stale file from a kill
	args = append([]string{"daemon", "--addr", "127.0.0.1:0"}, args...)
	p := &keelProc{cmd: exec.Command(shared.bin, args...), logs: newSyncWriter(), done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stderr = p.logs
	ready := p.logs.when("keel daemon ready")
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	var expired <-chan time.Time
	if timeout > 0 {
		expired = time.After(timeout)
	}
	select {
	case <-ready:
	case <-p.done:
		return nil, fmt.Errorf("daemon exited early: %v\n%s", p.err, p.logs.String())
	case <-expired:
		p.cmd.Process.Kill()
		<-p.done
		return nil, fmt.Errorf("daemon not ready in %s\n%s", timeout, p.logs.String())
	}
	// It logs that it is ready once daemon.json is written, whole.
	if info, err := client.ReadDaemonInfo(dir); err != nil || info.PID != p.cmd.Process.Pid {
		p.cmd.Process.Kill()
		<-p.done
		return nil, fmt.Errorf("daemon ready, but daemon.json = %+v, %v; want pid %d", info, err, p.cmd.Process.Pid)
	}
	return p, nil
}

// terminate stops the daemon with SIGTERM and waits for it to exit, at
// most timeout (then kills it). It returns its exit error.
func (p *keelProc) terminate(timeout time.Duration) error {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("daemon did not stop within %s of SIGTERM", timeout)
	}
}

// startKeel starts the daemon of binary bin (shared.bin) on data
// directory dir, with args added to its flags, and waits until it
// serves. When the test ends the daemon is killed if it still runs.
func startKeel(t *testing.T, bin string, env []string, dir string, args ...string) *keelProc {
	t.Helper()
	if bin != shared.bin {
		t.Fatalf("startKeel(%s): only the binary TestMain built", bin)
	}
	p, err := startDaemon(env, dir, patience, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// kill kills the daemon with SIGKILL and waits for it to be gone.
func (p *keelProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

// stop stops the daemon with SIGTERM, as a user would, and waits.
func (p *keelProc) stop(t *testing.T) {
	t.Helper()
	if err := p.terminate(time.Minute); err != nil {
		t.Errorf("daemon stop: %v\n%s", err, p.logs.String())
	}
}

// syncWriter collects a process's output while it is read, and says when
// some text appears in it.
type syncWriter struct {
	mu    sync.Mutex
	b     *strings.Builder
	waits []textWait
}

type textWait struct {
	text string
	seen chan struct{}
}

func newSyncWriter() *syncWriter { return &syncWriter{b: &strings.Builder{}} }

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	from := w.b.Len()
	w.b.Write(p)
	s := w.b.String()
	kept := w.waits[:0]
	for _, tw := range w.waits {
		if strings.Contains(s[max(0, from-len(tw.text)):], tw.text) {
			close(tw.seen)
		} else {
			kept = append(kept, tw)
		}
	}
	w.waits = kept
	return len(p), nil
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// when returns a channel closed once text has been written (at once if
// it already was).
func (w *syncWriter) when(text string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := make(chan struct{})
	if strings.Contains(w.b.String(), text) {
		close(seen)
	} else {
		w.waits = append(w.waits, textWait{text, seen})
	}
	return seen
}

// toolsReady waits until the daemon has compiled the tools it found at
// start (it resumes interrupted runs then), at most timeout (0: no
// bound). The daemon sends no notification for it: this asks tools.list
// every 20 ms.
func toolsReady(c *client.Client, timeout time.Duration) error {
	var deadline <-chan time.Time
	if timeout > 0 {
		deadline = time.After(timeout)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		res, err := c.ToolsList(context.Background())
		if err != nil {
			return fmt.Errorf("tools.list: %w", err)
		}
		if res.Compiling == nil {
			return nil
		}
		select {
		case <-tick.C:
		case <-deadline:
			return fmt.Errorf("tools still compiling after %s: %+v", timeout, *res.Compiling)
		}
	}
}
