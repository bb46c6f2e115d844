package browsertest_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/internal/wasmtest"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
)

// timeout bounds each wait on the page: generous, as the machine may be
// busy (tests wait on DOM conditions, never on time).
const timeout = 90 * time.Second

var (
	browserOnce sync.Once
	browserCtx  context.Context // the running browser; tabs derive from it
	browserErr  error
	stopBrowser = func() {}
)

func TestMain(m *testing.M) {
	code := m.Run()
	stopBrowser()
	os.Exit(code)
}

// chromium finds the browser: KEEL_CHROMIUM, else chromium or
// chromium-browser on PATH.
func chromium() string {
	if p := os.Getenv("KEEL_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// newTab returns a tab in a browser context of its own (its own
// cookies, none at first), in the one headless Chromium the package's
// tests share, for the test alone until it ends. Tabs are pooled: a new
// browser context and its window cost about a second of Chromium's time,
// so a tab a test is done with goes back to the pool (on about:blank,
// its cookies and viewport cleared) and the next test takes it. Every
// tab runs instrumentJS in each document it loads. Without a chromium
// the test skips, unless CI or KEEL_TEST_REQUIRE_CHROMIUM is set: then it
// fails.
func newTab(t *testing.T) context.Context {
	t.Helper()
	path := chromium()
	if path == "" {
		if os.Getenv("CI") != "" || os.Getenv("KEEL_TEST_REQUIRE_CHROMIUM") != "" {
			t.Fatal("no chromium on PATH (install Debian's chromium, or set KEEL_CHROMIUM), and CI requires the browser tests")
		}
		t.Skip("no chromium on PATH; install it (apt-get install chromium) to run the browser tests")
	}
	browserOnce.Do(func() {
		opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.WindowSize(1280, 900))
		if os.Geteuid() == 0 {
			opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
		}
		alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancel := chromedp.NewContext(alloc)
		browserErr = chromedp.Do(ctx)
		browserCtx = ctx
		stopBrowser = func() { cancel(); cancelAlloc() }
	})
	if browserErr != nil {
		t.Fatalf("start chromium: %v", browserErr)
	}
	tabsMu.Lock()
	var tb tab
	if n := len(idleTabs); n > 0 {
		tb, idleTabs = idleTabs[n-1], idleTabs[:n-1]
	}
	tabsMu.Unlock()
	if tb.ctx == nil {
		ctx, cancel := chromedp.NewContext(browserCtx, chromedp.WithNewBrowserContext())
		err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: instrumentJS})
			return err
		}))
		if err != nil {
			cancel()
			t.Fatalf("open a tab: %v", err)
		}
		tb = tab{ctx, cancel}
	}
	t.Cleanup(tb.release)
	return tb.ctx
}

// tab is a pooled tab.
type tab struct {
	ctx    context.Context
	cancel context.CancelFunc
}

var (
	tabsMu   sync.Mutex
	idleTabs []tab
)

// release leaves the page (its connection closes, its timers stop),
// clears the cookies and the viewport, and puts the tab back in the
// pool; a tab that fails to is closed.
func (tb tab) release() {
	ctx, cancel := context.WithTimeout(tb.ctx, 30*time.Second)
	defer cancel()
	err := chromedp.Do(ctx, chromedp.Navigate("about:blank"), chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		if _, err := cdp.Call(ctx, tg, network.ClearBrowserCookies, cdp.Empty{}); err != nil {
			return err
		}
		_, err := cdp.Call(ctx, tg, emulation.ClearDeviceMetricsOverride, cdp.Empty{})
		return err
	}))
	if err != nil {
		tb.cancel()
		return
	}
	tabsMu.Lock()
	idleTabs = append(idleTabs, tb)
	tabsMu.Unlock()
}

// run runs steps in the tab, each wait bounded, failing the test with
// what was being done and the page's text.
func run(t *testing.T, tab context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	get(t, tab, what, chromedp.Steps(steps...))
}

// get runs one action in the tab and returns its value, as run does.
func get[T any](t *testing.T, tab context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, timeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		tctx, cancel := context.WithTimeout(tab, 5*time.Second)
		defer cancel()
		body, _ := chromedp.Run(tctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ''`))
		t.Fatalf("%s: %v\npage text:\n%s", what, err, body)
	}
	return v
}

// css is a CSS selector (chromedp's typed selector).
type css = chromedp.CSS

// instance is a daemon serving the console on a loopback port.
type instance struct {
	base string // http://127.0.0.1:PORT
	dir  string
	info protocol.DaemonInfo
}

// tally is a tool that compiles in milliseconds (a Go-built one takes a
// minute under -race): a hand-built reactor whose every call returns
// {"words":2}, read-only, whose input is {"text": string}.
const tally = "tally"

// startKeel runs a daemon until the test ends, on a new data dir with
// model provider p and, if withTally, the tool tally (granted nothing;
// no bundled tools).
func startKeel(t *testing.T, p models.Provider, requireApproval []keel.SideEffect, withTally bool) *instance {
	t.Helper()
	dir := t.TempDir()
	toolDir := filepath.Join(dir, "tools")
	if err := os.MkdirAll(toolDir, 0o700); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{".examples-installed": nil} // no bundled tools
	if withTally {
		files[tally+".wasm"] = wasmtest.CannedReactor(`{"output":{"words":2}}`)
		files[tally+".manifest.json"] = []byte(`{"name":"tally","description":"Count words.","side_effects":"read_only",
"input_schema":{"type":"object","properties":{"text":{"type":"string"}}}}`)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(toolDir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k := &instance{base: "http://" + ln.Addr().String(), dir: dir}
	ready := make(chan protocol.DaemonInfo, 1)
	d, err := daemon.New(daemon.Config{
		DataDir:         dir,
		Addr:            ln.Addr().String(),
		Provider:        p,
		RequireApproval: requireApproval,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		Ready:           func(i protocol.DaemonInfo) { ready <- i },
	})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("daemon: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("daemon did not stop within a minute")
		}
		d.Close()
	})
	select {
	case k.info = <-ready:
	case err := <-done:
		t.Fatalf("daemon stopped before ready: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("daemon not ready within 2 minutes")
	}
	if withTally {
		k.waitToolsLoaded(t)
	}
	return k
}

// waitToolsLoaded waits until k has compiled the tools it found at
// start (the daemon says so with tools.changed), so that a run the test
// starts runs at once.
func (k *instance) waitToolsLoaded(t *testing.T) {
	t.Helper()
	c := k.dial(t)
	timeout := time.After(5 * time.Minute)
	for {
		res, err := c.ToolsList(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if res.Compiling == nil {
			return
		}
		select {
		case <-c.ToolsChanged():
		case <-timeout:
			t.Fatalf("tools still compiling after 5 minutes: %+v", res.Compiling)
		}
	}
}

// dial is a native client of k, for what the test checks behind the
// page's back.
func (k *instance) dial(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.DialDataDir(context.Background(), k.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func wantScreenshots() bool { return os.Getenv("KEEL_CONSOLE_SCREENSHOTS") != "" }

// screenshot writes png as NAME into KEEL_CONSOLE_SCREENSHOTS, if set.
func screenshot(t *testing.T, name string, png []byte) {
	t.Helper()
	dir := os.Getenv("KEEL_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Errorf("write screenshot: %v", err)
	}
}

// poll is how often a wait looks at the page again. chromedp's default
// for element waits, 5 ms, costs a DevTools round trip per waiting tab
// every 5 ms, which with several tabs waiting at once keeps a core busy;
// 25 ms costs a fifth of that and adds at most 25 ms to a wait.
const poll = 25 * time.Millisecond

// waitJS polls a JavaScript expression in the page until it is true.
func waitJS(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(poll), chromedp.WithPollingTimeout(timeout))
}

// visible waits until sel matches a visible element.
func visible(sel css) chromedp.Action[chromedp.Void] {
	return chromedp.WaitVisible(sel, chromedp.RetryInterval(poll))
}

// enabled waits until sel matches an enabled element.
func enabled(sel css) chromedp.Action[chromedp.Void] {
	return chromedp.WaitEnabled(sel, chromedp.RetryInterval(poll))
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// textOf reads the visible text of the first element matching sel. The
// page re-renders parts of itself as events stream in, so the node a
// query found can be gone when its text is read ("No node with given id
// found", met in a CI run): the read is made again then, from a new
// query.
func textOf(sel css) chromedp.Action[string] {
	return func(ctx context.Context, t *chromedp.Target) (string, error) {
		for {
			s, err := chromedp.Text(sel, chromedp.RetryInterval(poll))(ctx, t)
			if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "No node with given id") {
				return s, err
			}
		}
	}
}
