package daemon_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/internal/daemontest"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/ollama"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
)

// started is a daemon running in the test process on a temp data dir.
type started struct {
	info protocol.DaemonInfo
	dir  string
	stop func() error // cancels and waits for Run to return
}

// startDaemon runs a daemon on cfg until the test ends
// (daemontest.Start). Unset, the data dir is noTools, the address any free
// loopback port, the logger silent. Without a CacheDir the daemon keeps
// its compilation cache where it does by default, in the data dir, which
// starts as a view of warmCache.
func startDaemon(t *testing.T, cfg daemon.Config) *started {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = noTools(t)
	}
	if cfg.CacheDir == "" {
		cache := filepath.Join(cfg.DataDir, "cache", "wazero")
		if _, err := os.Stat(cache); errors.Is(err, os.ErrNotExist) {
			linkWarmCache(t, cache) // else a daemon before this one made it
		}
	}
	d := daemontest.Start(t, cfg)
	return &started{info: d.Info, dir: d.Dir, stop: d.Stop}
}

// noTools is a new data dir whose daemon installs no tools. Most tests
// call none, and a daemon without tools neither loads the bundled ones
// nor, at shutdown, waits for a load in progress (each costs a core for
// a second, several under -race). Tests that call tools start on
// withTools.
func noTools(t *testing.T) string {
	t.Helper()
	return dataDir(t, []string{})
}

// withTools is a new data dir for a daemon with tools. With no names,
// the daemon installs every bundled tool on its first start, as for a
// user (readfile granted the workspace); with names, the dir holds just
// those bundled tools, granted nothing, and the daemon installs no more.
func withTools(t *testing.T, names ...string) string {
	t.Helper()
	return dataDir(t, names)
}

// dataDir is a new data dir holding the bundled tools names, marked as
// having had the bundled tools installed; with names nil, an empty dir.
func dataDir(t *testing.T, names []string) string {
	t.Helper()
	dir := t.TempDir()
	if names == nil {
		return dir
	}
	tools := filepath.Join(dir, "tools")
	if err := os.MkdirAll(tools, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		bin, err := os.ReadFile(filepath.Join(bundledDir, name+".wasm"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tools, name+".wasm"), bin, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tools, ".examples-installed"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func dial(t *testing.T, dir string) *client.Client { return daemontest.Dial(t, dir) }

// asked returns a model step that replies as f does, and a channel
// closed once the step is asked: the run is then inside that model step.
func asked(f func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error)) (scripted.Step, <-chan struct{}) {
	ch := make(chan struct{})
	var once sync.Once
	return scripted.ReplyFunc(func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
		once.Do(func() { close(ch) })
		return f(ctx, req)
	}), ch
}

// block is scripted.Block's reply: it waits until the call is cancelled.
func block(ctx context.Context, _ models.ChatRequest) (models.ChatResponse, error) {
	<-ctx.Done()
	return models.ChatResponse{}, ctx.Err()
}

// startWaiting starts a run with goal through c and waits until the
// model step made by asked is asked (closes called).
func startWaiting(t *testing.T, c *client.Client, called <-chan struct{}, goal string) keel.Run {
	t.Helper()
	run, err := c.StartRun(context.Background(), protocol.RunStartParams{Goal: goal})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-called:
	case <-time.After(time.Minute):
		t.Fatal("the model was not asked within a minute")
	}
	return run
}

// waitEvent waits until run id journals an event of type typ and returns
// it, watching on a connection of its own to the daemon of dir. It fails
// if the run ends first, or after a minute.
func waitEvent(t *testing.T, dir string, id keel.RunID, typ keel.EventType) keel.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.DialDataDir(ctx, dir)
	if err != nil {
		t.Fatalf("DialDataDir: %v", err)
	}
	defer c.Close()
	if _, err := c.Subscribe(ctx, id, 0); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	var seen []keel.Event
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				t.Fatalf("connection closed waiting for %s; run %s had %v", typ, id, evTypes(seen))
			}
			if ev.RunID != id || ev.Seq == 0 {
				continue
			}
			if ev.Type == typ {
				return ev
			}
			seen = append(seen, ev)
			switch ev.Type {
			case keel.EventRunSucceeded, keel.EventRunFailed, keel.EventRunCancelled:
				t.Fatalf("run %s ended (%s) before %s: %v", id, ev.Data, typ, evTypes(seen))
			}
		case <-ctx.Done():
			t.Fatalf("run %s journaled no %s within a minute: %v", id, typ, evTypes(seen))
		}
	}
}

// waitTools waits until ok holds of what c's tools.list says, checking
// again at each tools.changed notification once the tools found at start
// are loaded, and returns that list. It fails after a minute, saying it
// waited for what.
func waitTools(t *testing.T, c *client.Client, what string, ok func([]protocol.ToolInfo) bool) []protocol.ToolInfo {
	t.Helper()
	// Tools loaded at start are published with no notification; every
	// change after that load is notified.
	waitLoaded(t, c)
	return daemontest.WaitTools(t, c, what, ok)
}

// waitLoaded waits until the daemon of c has loaded the tools it found
// at start. Nothing is sent when that load ends (tools.changed reports
// changes, not progress), so it asks tools.list until it no longer says
// "compiling": the one wait of this package that polls.
func waitLoaded(t *testing.T, c *client.Client) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var res protocol.ToolsListResult
		if err := c.Call(context.Background(), protocol.MethodToolsList, struct{}{}, &res); err != nil {
			t.Fatal(err)
		}
		if res.Compiling == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tools still compiling after 2 minutes: %+v", res.Compiling)
		}
	}
}

// runCLI runs the real command line against the daemon of dir.
func runCLI(ctx context.Context, dir string, args ...string) (stdout, stderr string, code int) {
	return daemontest.CLI(ctx, dir, args...)
}

// wantCode fails the test unless err is a protocol error with code, and
// returns that error.
func wantCode(t *testing.T, err error, code int, what string) *protocol.Error {
	t.Helper()
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != code {
		t.Fatalf("%s: err = %v, want code %d", what, err, code)
	}
	return pe
}

// runToEnd starts a run with p, follows it until it ends and returns
// its detail (daemontest.RunToEnd).
func runToEnd(t *testing.T, c *client.Client, p protocol.RunStartParams) protocol.RunDetail {
	t.Helper()
	return daemontest.RunToEnd(t, c, p)
}

// follow subscribes to a run and collects its events until the run ends
// (daemontest.Follow).
func follow(t *testing.T, c *client.Client, id keel.RunID) []keel.Event {
	t.Helper()
	return daemontest.Follow(t, c, id)
}

func evTypes(evs []keel.Event) []keel.EventType { return daemontest.Types(evs) }

// checkJournal opens the SQLite file itself (after the daemon stopped) and
// checks that it holds exactly the events the client saw, in order.
func checkJournal(t *testing.T, dir string, id keel.RunID, seen []keel.Event) {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(dir, "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	stored, err := st.Events(context.Background(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != len(seen) {
		t.Fatalf("SQLite has %d events, client saw %d: %v vs %v", len(stored), len(seen), evTypes(stored), evTypes(seen))
	}
	for i := range stored {
		if stored[i].Seq != int64(i+1) || stored[i].Seq != seen[i].Seq || stored[i].Type != seen[i].Type || !bytes.Equal(stored[i].Data, seen[i].Data) {
			t.Errorf("event %d: stored %d %s, seen %d %s", i, stored[i].Seq, stored[i].Type, seen[i].Seq, seen[i].Type)
		}
	}
}

// TestRunWithScriptedModel drives a run over the real WebSocket, with the
// real bundled wordcount tool, and a scripted model that calls the tool
// and then answers with what the tool returned.
func TestRunWithScriptedModel(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil,
		scripted.CallTool("wordcount", `{"text":"the quick brown fox\njumps"}`),
		scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
			last := req.Messages[len(req.Messages)-1]
			return models.ChatResponse{Message: models.Message{Content: "tool said " + last.Content}}, nil
		}))
	d := startDaemon(t, daemon.Config{DataDir: withTools(t, "wordcount"), Provider: p})
	c := dial(t, d.dir)
	ctx := context.Background()
	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "count the words"})
	if err != nil {
		t.Fatal(err)
	}
	evs := follow(t, c, run.ID)
	want := []keel.EventType{keel.EventRunStarted, keel.EventModelResult, keel.EventToolCall, keel.EventToolResult, keel.EventModelResult, keel.EventRunSucceeded}
	if fmt.Sprint(evTypes(evs)) != fmt.Sprint(want) {
		t.Fatalf("events = %v, want %v", evTypes(evs), want)
	}
	var res keel.ToolResultData
	if err := json.Unmarshal(evs[3].Data, &res); err != nil || res.Error != nil {
		t.Fatalf("tool.result = %s (%v)", evs[3].Data, err)
	}
	var counts struct{ Words, Lines int }
	if err := json.Unmarshal(res.Output, &counts); err != nil || counts.Words != 5 || counts.Lines != 2 {
		t.Errorf("wordcount output = %s, want 5 words on 2 lines", res.Output)
	}
	// The tool's real output reached the model, and the model's answer the run.
	detail, err := c.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if detail.Run.Status != keel.RunSucceeded || detail.Run.Result != "tool said "+string(res.Output) {
		t.Errorf("run = %s %q, want succeeded with the tool's output", detail.Run.Status, detail.Run.Result)
	}
	if got, want := traceTree(t, detail.Spans), "run/ok(step/ok(model.call/ok tool.call/ok) step/ok(model.call/ok))"; got != want {
		t.Errorf("trace = %s, want %s", got, want)
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	checkJournal(t, d.dir, run.ID, evs)
}

// TestRunWithRealOllama runs against the real Ollama and the real tools,
// with a native-tools model and a completion-only one (whose tool calls
// come from schema-constrained JSON).
func TestRunWithRealOllama(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemon.Config{Provider: realOllama(t)})
	c := dial(t, d.dir)
	ctx := context.Background()
	var runs [][]keel.Event
	var ids []keel.RunID
	for _, model := range []string{envOr("KEEL_TEST_OLLAMA_TOOLS_MODEL", "keel-tiny-tools"), envOr("KEEL_TEST_OLLAMA_MODEL", "keel-tiny")} {
		run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "Count the words in: once upon a time", Model: model, MaxSteps: 3})
		if err != nil {
			t.Fatalf("StartRun(%s): %v", model, err)
		}
		evs := follow(t, c, run.ID)
		last := evs[len(evs)-1]
		if last.Type != keel.EventRunSucceeded && last.Type != keel.EventRunFailed {
			t.Errorf("%s: run ended with %s, want succeeded or failed", model, last.Type)
		}
		detail, err := c.GetRun(ctx, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		var modelSpans int
		for _, s := range detail.Spans {
			if s.Kind != keel.SpanModelCall {
				continue
			}
			modelSpans++
			if s.Status != keel.SpanOK || s.PromptTokens <= 0 || s.CompletionTokens <= 0 || s.Duration <= 0 {
				t.Errorf("%s: model span %+v lacks status/tokens/duration", model, s)
			}
		}
		if modelSpans == 0 {
			t.Errorf("%s: no model spans", model)
		}
		runs, ids = append(runs, evs), append(ids, run.ID)
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	for i := range runs {
		checkJournal(t, d.dir, ids[i], runs[i])
	}
}

// TestPlanWithRealOllama runs `keel run --plan` against the real Ollama
// with the completion-only tiny model: the planner's output schema, sent
// as is, crashed Ollama's runner three times and failed the run. The plan
// may be nonsense; the run must end (succeeded, or failed with a clear
// reason) and no model call may have crashed the runner.
func TestPlanWithRealOllama(t *testing.T) {
	t.Parallel()
	p := realOllama(t)
	// Short replies keep the test quick on a busy machine.
	dir := noTools(t)
	if err := os.WriteFile(filepath.Join(dir, daemon.ModelsConfigFile), []byte(`{"ollama":{"default_max_tokens":64}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: p})
	c := dial(t, d.dir)
	ctx := context.Background()
	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "Write a short story about a dog, then give it a title.",
		Model: envOr("KEEL_TEST_OLLAMA_MODEL", "keel-tiny"), Kind: keel.KindPlan, MaxSteps: 2})
	if err != nil {
		t.Fatal(err)
	}
	evs := follow(t, c, run.ID)
	detail, err := c.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plan run: %s %q after %v", detail.Run.Status, detail.Run.Error, evTypes(evs))
	if !detail.Run.Status.Terminal() {
		t.Fatalf("run = %s, want an end", detail.Run.Status)
	}
	if detail.Run.Status == keel.RunFailed && detail.Run.Error == "" {
		t.Errorf("the run failed without a reason")
	}
	var calls int
	for _, s := range detail.Spans {
		if s.Kind != keel.SpanModelCall {
			continue
		}
		calls++
		if strings.Contains(s.Error, string(models.KindCrashed)) || strings.Contains(s.Error, string(models.KindOverloaded)) {
			t.Errorf("model span %s: %s; the runner must not crash", s.Name, s.Error)
		}
	}
	if calls == 0 {
		t.Errorf("no planner call was made")
	}
	if strings.Contains(detail.Run.Error, string(models.KindCrashed)) || strings.Contains(detail.Run.Error, string(models.KindOverloaded)) {
		t.Errorf("run error %q: the runner crashed", detail.Run.Error)
	}
}

// ollamaMu keeps the tests of the real Ollama to one at a time: they
// share one server, whose model runner answers one request at a time, and
// each bounds how long its runs may take.
var ollamaMu sync.Mutex

// realOllama skips the test unless OLLAMA_HOST names a real Ollama, and
// otherwise holds it for the test alone (ollamaMu) and returns a provider
// of it that computes on one thread: several stall each other on a busy
// machine (ollama.Config.NumThread), where the tiny test models then take
// seconds a token.
func realOllama(t *testing.T) models.Provider {
	t.Helper()
	host := os.Getenv("OLLAMA_HOST")
	if host == "" {
		t.Skip("OLLAMA_HOST is not set; start one with: eval \"$(../shared/ollama/start)\"")
	}
	ollamaMu.Lock()
	t.Cleanup(ollamaMu.Unlock)
	p, err := ollama.New(ollama.Config{Host: host, NumThread: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func TestDaemonFilesAndSingleInstance(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemon.Config{Provider: scripted.New(nil)})
	info, err := client.ReadDaemonInfo(d.dir)
	if err != nil {
		t.Fatal(err)
	}
	if info.PID != os.Getpid() || info.Protocol != protocol.Version || !strings.HasPrefix(info.URL, "ws://127.0.0.1:") || !strings.HasSuffix(info.URL, protocol.Path) {
		t.Errorf("daemon.json = %+v", info)
	}
	fi, err := os.Stat(info.TokenFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode = %v, want 0600", fi.Mode().Perm())
	}
	// A second daemon on the same data dir refuses, and leaves the first alone.
	err = daemon.Run(context.Background(), daemon.Config{DataDir: d.dir, Addr: "127.0.0.1:0", Provider: scripted.New(nil), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if !errors.Is(err, daemon.ErrAlreadyRunning) {
		t.Fatalf("second daemon = %v, want ErrAlreadyRunning", err)
	}
	if _, err := dial(t, d.dir).Describe(context.Background()); err != nil {
		t.Fatalf("first daemon stopped answering: %v", err)
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d.dir, protocol.DaemonFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("daemon.json still there after clean shutdown: %v", err)
	}
	// A stale daemon.json (dead pid) is replaced by the next start.
	stale := `{"url":"ws://127.0.0.1:1/v1/ws","pid":999999999,"protocol":"keel/1","token_file":"x"}`
	if err := os.WriteFile(filepath.Join(d.dir, protocol.DaemonFile), []byte(stale), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DialDataDir(context.Background(), d.dir); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("DialDataDir(stale) = %v, want 'not running'", err)
	}
	d2 := startDaemon(t, daemon.Config{DataDir: d.dir, Provider: scripted.New(nil)})
	if d2.info.URL == "ws://127.0.0.1:1/v1/ws" {
		t.Error("stale daemon.json was not replaced")
	}
	dial(t, d.dir)
}

func TestNonLoopbackRefused(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:0"} {
		err := daemon.Run(context.Background(), daemon.Config{DataDir: t.TempDir(), Addr: addr, Provider: scripted.New(nil)})
		if err == nil || !strings.Contains(err.Error(), "not a loopback address") {
			t.Errorf("Run(addr %s) = %v, want a refusal", addr, err)
		}
	}
}

// TestAllowOriginTooBroadRefused: an --allow-origin that would let every
// web page in is refused before the daemon starts, with a clear error.
func TestAllowOriginTooBroadRefused(t *testing.T) {
	t.Parallel()
	for _, o := range []string{"*", "http://*", "https://*", "null", "https://*.com"} {
		err := daemon.Run(context.Background(), daemon.Config{DataDir: t.TempDir(), Addr: "127.0.0.1:0", AllowedOrigins: []string{o}, Provider: scripted.New(nil)})
		if !errors.Is(err, ipc.ErrOriginPattern) || !strings.Contains(err.Error(), "--allow-origin") {
			t.Errorf("Run(--allow-origin %s) = %v, want an ErrOriginPattern naming the flag", o, err)
		}
	}
}

// TestShutdownLeavesRunsInterrupted stops the daemon while a run waits on
// the model; the run is journaled as interrupted and a restarted daemon
// serves it with its events intact.
func TestShutdownLeavesRunsInterrupted(t *testing.T) {
	t.Parallel()
	step, called := asked(block)
	d := startDaemon(t, daemon.Config{Provider: scripted.New(nil, step)})
	c := dial(t, d.dir)
	run := startWaiting(t, c, called, "wait forever")
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	// The next daemon resumes the run from its journal: the model step
	// that never finished is asked again, and the run ends.
	d2 := startDaemon(t, daemon.Config{DataDir: d.dir, Provider: scripted.New(nil, scripted.Answer("resumed answer"))})
	c2 := dial(t, d2.dir)
	follow(t, c2, run.ID)
	detail, err := c2.GetRun(context.Background(), run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if detail.Run.Status != keel.RunSucceeded || detail.Run.Result != "resumed answer" {
		t.Errorf("after restart: %s %q, want succeeded with the answer", detail.Run.Status, detail.Run.Result)
	}
	got := evTypes(detail.Events)
	want := []keel.EventType{keel.EventRunStarted, keel.EventRunInterrupted, keel.EventRunResumed, keel.EventModelResult, keel.EventRunSucceeded}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events = %v, want %v", got, want)
	}
	// One tree: the step the shutdown cut holds the interrupted model
	// call, closed with an error, and the resumed one.
	if got, want := traceTree(t, detail.Spans), "run/ok(step/ok(model.call/error model.call/ok))"; got != want {
		t.Errorf("trace = %s, want %s", got, want)
	}
}

// TestStopWhileToolsLoad: a daemon serves while the tools it found at
// start still load: env.describe (and keel doctor) counts those still
// compiling. Stopped then, the daemon stops at once, the load given up,
// rather than wait for it (minutes for a cold compile of many tools): its
// tools are naps that each take the whole call timeout (10 s) to say what
// they are, enough of them that the loading workers (as many as the
// cores but one) would take over a minute, startDaemon's bound on a stop.
func TestStopWhileToolsLoad(t *testing.T) {
	t.Parallel()
	dir := noTools(t)
	naps := 7 * max(1, runtime.GOMAXPROCS(0)-1)
	for i := range naps {
		if err := os.WriteFile(filepath.Join(dir, "tools", fmt.Sprintf("nap_%d.wasm", i)), napModule(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: scripted.New(nil)})
	c := dial(t, d.dir)
	ctx := context.Background()
	compiling := func() bool {
		t.Helper()
		var res protocol.ToolsListResult
		if err := c.Call(ctx, protocol.MethodToolsList, struct{}{}, &res); err != nil {
			t.Fatal(err)
		}
		return res.Compiling != nil
	}
	if !compiling() {
		t.Fatal("tools.list says nothing is compiling right after the start")
	}
	env, err := c.Describe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, errs, code := runCLI(ctx, d.dir, "doctor")
	if !compiling() {
		t.Fatal("the tools loaded within this test; the checks above saw nothing still compiling")
	}
	if env.ToolsCompiling < 1 || env.ToolsCompiling > naps {
		t.Errorf("env.describe: tools_compiling = %d, want 1 to %d (the tools found at start)", env.ToolsCompiling, naps)
	}
	if code != cli.ExitOK || !strings.Contains(out, "still compiling") {
		t.Errorf("keel doctor while tools load: code %d, want it to say some are still compiling\n%s%s", code, out, errs)
	}
	if err := d.stop(); err != nil {
		t.Fatalf("stop while tools load: %v", err)
	}
}

// napModule is a command module that sleeps an hour, through WASI
// poll_oneoff, whatever its arguments: asked for its manifest, it takes
// the whole call timeout, sleeping (keel's sleep ends with the call).
//
//	(module
//	  (import "wasi_snapshot_preview1" "poll_oneoff" (func (param i32 i32 i32 i32) (result i32)))
//	  (memory (export "memory") 1)
//	  ;; one subscription at 0: a relative clock, timeout at 24
//	  (data (i32.const 24) "<3600 s in ns, u64 LE>")
//	  (func (export "_start") (drop (call 0 (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128)))))
func napModule() []byte {
	sec := func(id byte, content ...byte) []byte { return append([]byte{id, byte(len(content))}, content...) }
	name := func(s string) []byte { return append([]byte{byte(len(s))}, s...) }
	imp := append(append(name("wasi_snapshot_preview1"), name("poll_oneoff")...), 0x00, 0x00)
	exp := append(append(append([]byte{0x02}, name("memory")...), 0x02, 0x00), append(name("_start"), 0x00, 0x01)...)
	code := []byte{0x00, 0x41, 0x00, 0x41, 0xc0, 0x00, 0x41, 0x01, 0x41, 0x80, 0x01, 0x10, 0x00, 0x1a, 0x0b}
	hour := binary.LittleEndian.AppendUint64(nil, uint64(time.Hour))
	data := append([]byte{0x01, 0x00, 0x41, 0x18, 0x0b, byte(len(hour))}, hour...)
	var m []byte
	m = append(m, 0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00)
	m = append(m, sec(1, 0x02, 0x60, 0x04, 0x7f, 0x7f, 0x7f, 0x7f, 0x01, 0x7f, 0x60, 0x00, 0x00)...)
	m = append(m, sec(2, append([]byte{0x01}, imp...)...)...)
	m = append(m, sec(3, 0x01, 0x01)...)
	m = append(m, sec(5, 0x01, 0x00, 0x01)...)
	m = append(m, sec(7, exp...)...)
	m = append(m, sec(10, append([]byte{0x01, byte(len(code))}, code...)...)...)
	m = append(m, sec(11, data...)...)
	return m
}

// startWithEndedRun starts a daemon on dir whose model answers "ok", and
// one run that has ended, succeeded, with three events: the data that
// bad input must leave intact.
func startWithEndedRun(t *testing.T, dir string) (*started, *client.Client, keel.Run) {
	t.Helper()
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: scripted.New(nil, scripted.Answer("ok"))})
	c := dial(t, d.dir)
	run, err := c.StartRun(context.Background(), protocol.RunStartParams{Goal: "first"})
	if err != nil {
		t.Fatal(err)
	}
	follow(t, c, run.ID)
	return d, c, run
}

// TestBadInputKeepsDaemonAndData sends invalid tool arguments, an unknown
// tool and a run for a missing model through the daemon; each gets its
// documented code, and earlier runs stay intact.
func TestBadInputKeepsDaemonAndData(t *testing.T) {
	t.Parallel()
	_, c, run := startWithEndedRun(t, withTools(t, "wordcount"))
	ctx := context.Background()
	cases := []struct {
		name   string
		method string
		params any
		code   int
	}{
		{"invalid tool arguments", protocol.MethodToolsCall, protocol.ToolsCallParams{Name: "wordcount", Input: json.RawMessage(`{"text":7}`)}, protocol.CodeInvalidToolInput},
		{"unknown tool", protocol.MethodToolsCall, protocol.ToolsCallParams{Name: "nope", Input: json.RawMessage(`{}`)}, protocol.CodeNotFound},
		{"missing model", protocol.MethodRunStart, protocol.RunStartParams{Goal: "x", Model: "no-such-model"}, protocol.CodeModelUnavailable},
		{"unknown run", protocol.MethodRunGet, protocol.RunRef{RunID: "run_nope"}, protocol.CodeNotFound},
		{"cancel ended run", protocol.MethodRunCancel, protocol.RunRef{RunID: run.ID}, protocol.CodeConflict},
		{"unknown method", "run.explode", struct{}{}, protocol.CodeMethodNotFound},
		{"pull without a name", protocol.MethodModelsPull, protocol.ModelsPullParams{}, protocol.CodeInvalidParams},
		{"pull from a provider that cannot pull", protocol.MethodModelsPull, protocol.ModelsPullParams{Name: "qwen2.5:0.5b"}, protocol.CodeUnavailable},
	}
	for _, tt := range cases {
		var out json.RawMessage
		err := c.Call(ctx, tt.method, tt.params, &out)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != tt.code {
			t.Errorf("%s: err = %v, want code %d", tt.name, err, tt.code)
		}
	}
	detail, err := c.GetRun(ctx, run.ID)
	if err != nil || detail.Run.Status != keel.RunSucceeded || len(detail.Events) != 3 {
		t.Errorf("earlier run after bad input = %+v, %v", detail.Run, err)
	}
}

// TestCLI runs the real command line against a daemon in the process.
func TestCLI(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil, scripted.CallTool("wordcount", `{"text":"a b c"}`), scripted.Answer("three words"))
	d := startDaemon(t, daemon.Config{DataDir: withTools(t), Provider: p})
	keelCLI := func(args ...string) (string, string, int) { return runCLI(context.Background(), d.dir, args...) }
	out, errs, code := keelCLI("run", "count", "a b c")
	if code != cli.ExitOK || !strings.Contains(out, "run succeeded") || !strings.Contains(out, "three words") || !strings.Contains(out, `tool  ← wordcount {"words":3,"lines":1,"chars":5}`) {
		t.Errorf("keel run: code %d\n%s\n%s", code, out, errs)
	}
	out, _, code = keelCLI("runs")
	if code != 0 || !strings.Contains(out, "succeeded") || !strings.Contains(out, "count a b c") {
		t.Errorf("keel runs: code %d\n%s", code, out)
	}
	id := strings.Fields(strings.Split(out, "\n")[1])[0]
	out, _, code = keelCLI("show", id)
	if code != 0 || !strings.Contains(out, "tool.call") || !strings.Contains(out, "wordcount") || !strings.Contains(out, "total:") {
		t.Errorf("keel show: code %d\n%s", code, out)
	}
	out, _, code = keelCLI("tools", "list")
	if code != 0 || !strings.Contains(out, "wordcount") || !strings.Contains(out, "readfile") || !strings.Contains(out, `"required"`) {
		t.Errorf("keel tools list: code %d\n%s", code, out)
	}
	out, _, code = keelCLI("tool", "call", "wordcount", `{"text":"x y"}`)
	if code != 0 || !strings.Contains(out, `"words": 2`) {
		t.Errorf("keel tool call: code %d\n%s", code, out)
	}
	_, errs, code = keelCLI("tool", "call", "wordcount", `{"text":1}`)
	if code != cli.ExitFailure || !strings.Contains(errs, "/text") {
		t.Errorf("keel tool call (bad input): code %d, stderr %s", code, errs)
	}
	if _, errs, code := keelCLI("tool", "call", "wordcount"); code != cli.ExitUsage || !strings.Contains(errs, "--help") {
		t.Errorf("keel tool call (missing input): code %d, want %d; stderr %s", code, cli.ExitUsage, errs)
	}
	// The audit trail has the run's call (with run and step) and the direct ones.
	out, _, code = keelCLI("tools", "audit", "--json")
	var recs []keel.ToolAudit
	if err := json.Unmarshal([]byte(out), &recs); code != 0 || err != nil || len(recs) != 3 {
		t.Fatalf("keel tools audit --json: code %d, %d records (%v)\n%s", code, len(recs), err, out)
	}
	sum := sha256.Sum256([]byte(`{"text":"a b c"}`))
	runCall, bad := recs[2], recs[0]
	if runCall.RunID != keel.RunID(id) || runCall.Step != 1 || runCall.Tool != "wordcount" || runCall.Outcome != "ok" ||
		runCall.ArgsSHA256 != hex.EncodeToString(sum[:]) || len(runCall.SHA256) != 64 || runCall.Version == "" {
		t.Errorf("audit of the run's call = %+v", runCall)
	}
	if bad.RunID != "" || bad.Outcome != string(keel.ToolInvalidInput) {
		t.Errorf("audit of the bad direct call = %+v", bad)
	}
	out, _, code = keelCLI("tools", "audit", "--tool", "wordcount")
	if code != 0 || !strings.Contains(out, "direct") || !strings.Contains(out, id+" step 1") {
		t.Errorf("keel tools audit: code %d\n%s", code, out)
	}
	out, _, code = keelCLI("doctor")
	if code != 0 || !strings.Contains(out, "provider  scripted") || !strings.Contains(out, d.info.URL) || !strings.Contains(out, "readfile") {
		t.Errorf("keel doctor: code %d\n%s", code, out)
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	out, _, code = keelCLI("doctor")
	if code != cli.ExitFailure || !strings.Contains(out, "not running") || !strings.Contains(out, "keel daemon --data-dir") {
		t.Errorf("keel doctor without daemon: code %d\n%s", code, out)
	}
}

// TestToolsHotReload deletes a bundled tool from a running daemon's tool
// directory and puts it back; tools.list follows without a restart.
func TestToolsHotReload(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemon.Config{DataDir: withTools(t), Provider: scripted.New(nil)})
	c := dial(t, d.dir)
	ctx := context.Background()
	waitNames := func(want string) {
		t.Helper()
		waitTools(t, c, "tools "+want, func(tools []protocol.ToolInfo) bool {
			var n []string
			for _, tl := range tools {
				n = append(n, tl.Name)
			}
			return strings.Join(n, ",") == want
		})
	}
	// Loaded first (waitTools waits for that), so that each change below
	// is one the daemon sees.
	waitNames("fetch,readfile,wordcount,writefile")
	path := filepath.Join(d.dir, "tools", "wordcount.wasm")
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	select { // drain a signal left from the initial load
	case <-c.ToolsChanged():
	default:
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.ToolsChanged():
	case <-time.After(time.Minute):
		t.Fatal("no tools.changed notification after a tool was deleted")
	}
	waitNames("fetch,readfile,writefile")
	if err := os.WriteFile(path, bin, 0o644); err != nil {
		t.Fatal(err)
	}
	waitNames("fetch,readfile,wordcount,writefile")
	if _, err := c.CallTool(ctx, "wordcount", json.RawMessage(`{"text":"back again"}`)); err != nil {
		t.Fatalf("call after reload: %v", err)
	}

	// A replacement that requests more than was granted gets none of the
	// new request: readfile, granted the workspace, now also asks for an
	// environment value through a sidecar manifest. The sidecar is part of
	// what grants are bound to, so the tool first has none of them (they
	// are pending); confirmed, it gets the workspace back, not HOME.
	if err := os.WriteFile(filepath.Join(d.dir, "workspace", "a.txt"), []byte("hi"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CallTool(ctx, "readfile", json.RawMessage(`{"path":"a.txt"}`)); err != nil {
		t.Fatalf("readfile before the replacement: %v", err)
	}
	tools, err := c.ListTools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var spec protocol.ToolInfo
	for _, tl := range tools {
		if tl.Name == "readfile" {
			spec = tl
		}
	}
	manifest, _ := json.Marshal(map[string]any{
		"name": "readfile", "version": "0.2.0", "description": spec.Description,
		"input_schema": spec.InputSchema, "output_schema": spec.OutputSchema, "side_effects": spec.SideEffects,
		"requests": map[string]any{"fs": []map[string]any{{"guest_path": "/workspace", "read_only": true}}, "env": []string{"HOME"}},
	})
	if err := os.WriteFile(filepath.Join(d.dir, "tools", "readfile.manifest.json"), manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	info := waitTool(t, c, "readfile", "readfile with its sidecar manifest", func(info protocol.ToolInfo) bool { return info.Version == "0.2.0" })
	if info.PendingGrants == nil || !info.Grants.Empty() {
		t.Fatalf("readfile with a new sidecar: grants %+v, pending %+v; want none, the workspace pending", info.Grants, info.PendingGrants)
	}
	if _, err := c.CallTool(ctx, "readfile", json.RawMessage(`{"path":"a.txt"}`)); err == nil || !strings.Contains(err.Error(), "permission_denied") {
		t.Fatalf("readfile with its grants pending = %v, want permission_denied", err)
	}
	if _, err := c.GrantTool(ctx, protocol.ToolsGrantParams{Name: "readfile", Confirm: info.GrantDigest}); err != nil {
		t.Fatalf("confirm: %v", err)
	}
	_, err = c.CallTool(ctx, "readfile", json.RawMessage(`{"path":"a.txt"}`))
	if err == nil || !strings.Contains(err.Error(), "permission_denied") || !strings.Contains(err.Error(), "HOME") {
		t.Fatalf("replacement requesting env HOME, confirmed = %v, want permission_denied naming HOME", err)
	}
}

// TestToolInstallAndGrants walks a user through removing, installing,
// granting and revoking a tool with the real CLI, checking each step
// takes effect on real calls and that grants survive a restart.
func TestToolInstallAndGrants(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemon.Config{DataDir: withTools(t, "readfile"), Provider: scripted.New(nil)})
	src := t.TempDir()
	bin, err := os.ReadFile(filepath.Join(d.dir, "tools", "readfile.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "readfile.wasm"), bin, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "junk.wasm"), []byte("not wasm at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	notes := t.TempDir()
	if err := os.WriteFile(filepath.Join(notes, "n.txt"), []byte("secret plans"), 0o644); err != nil {
		t.Fatal(err)
	}
	keelCLI := func(args ...string) (string, int) {
		var out bytes.Buffer
		code := cli.Main(context.Background(), append(args, "--data-dir", d.dir), &out, &out)
		return out.String(), code
	}
	c := dial(t, d.dir)
	ctx := context.Background()
	read := func() error {
		_, err := c.CallTool(ctx, "readfile", json.RawMessage(`{"path":"n.txt"}`))
		return err
	}

	if out, code := keelCLI("tools", "install", filepath.Join(src, "readfile.wasm")); code != cli.ExitFailure || !strings.Contains(out, "already installed") {
		t.Fatalf("install over an installed tool: code %d\n%s", code, out)
	}
	if out, code := keelCLI("tools", "install", filepath.Join(src, "junk.wasm")); code != cli.ExitFailure || !strings.Contains(out, "junk.wasm") {
		t.Fatalf("install of a broken file: code %d\n%s", code, out)
	}
	if out, code := keelCLI("tools", "remove", "readfile"); code != 0 {
		t.Fatalf("remove: code %d\n%s", code, out)
	}
	wantCode(t, read(), protocol.CodeNotFound, "call after remove")

	out, code := keelCLI("tools", "install", filepath.Join(src, "readfile.wasm"))
	if code != 0 || !strings.Contains(out, "granted: nothing") || !strings.Contains(out, "fs  /workspace (read-only)") || !strings.Contains(out, "validating and compiling") {
		t.Fatalf("install without grants: code %d\n%s", code, out)
	}
	wantCode(t, read(), protocol.CodeToolError, "call without a grant")
	if err := read(); !strings.Contains(err.Error(), "permission_denied") || !strings.Contains(err.Error(), "/workspace") {
		t.Errorf("denial %v does not name the missing grant", err)
	}
	if out, code := keelCLI("tools", "grant", "readfile", "net:https://example.com:443"); code != cli.ExitFailure || !strings.Contains(out, "does not request") {
		t.Fatalf("grant of something not requested: code %d\n%s", code, out)
	}
	// Asking for read-write on a read-only request still grants read-only.
	out, code = keelCLI("tools", "grant", "readfile", "fs:/workspace="+notes)
	if code != 0 || !strings.Contains(out, "(read-only)") {
		t.Fatalf("grant: code %d\n%s", code, out)
	}
	if err := read(); err != nil {
		t.Fatalf("call after grant: %v", err)
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}

	// Grants survive a restart, and the removed-then-installed tool is not reset.
	d2 := startDaemon(t, daemon.Config{DataDir: d.dir, Provider: scripted.New(nil)})
	c = dial(t, d2.dir)
	if err := read(); err != nil {
		t.Fatalf("call after restart: %v", err)
	}
	if out, code := keelCLI("tools", "revoke", "readfile", "--all"); code != 0 || !strings.Contains(out, "no grants") {
		t.Fatalf("revoke: code %d\n%s", code, out)
	}
	wantCode(t, read(), protocol.CodeToolError, "call after revoke")

	// --replace from a module without a sidecar drops a sidecar left in
	// the tool directory, which would otherwise win over the new manifest.
	tools, _ := c.ListTools(ctx)
	var rf protocol.ToolInfo
	for _, tl := range tools {
		if tl.Name == "readfile" {
			rf = tl
		}
	}
	stale, _ := json.Marshal(map[string]any{"name": "readfile", "version": "9.9.9", "description": "stale",
		"input_schema": rf.InputSchema, "side_effects": "read_only", "requests": rf.Requests})
	if err := os.WriteFile(filepath.Join(d.dir, "tools", "readfile.manifest.json"), stale, 0o644); err != nil {
		t.Fatal(err)
	}
	waitTool(t, c, "readfile", "readfile with the stale sidecar", func(info protocol.ToolInfo) bool { return info.Version == "9.9.9" })
	if out, code := keelCLI("tools", "install", "--replace", filepath.Join(src, "readfile.wasm")); code != 0 || !strings.Contains(out, "readfile 0.1.0") {
		t.Fatalf("install --replace: code %d\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(d.dir, "tools", "readfile.manifest.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale sidecar still in the tool directory: %v", err)
	}
	if _, err := c.Describe(ctx); err != nil {
		t.Fatalf("daemon unhealthy after the tool changes: %v", err)
	}
}
