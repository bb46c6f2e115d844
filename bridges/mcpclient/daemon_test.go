package mcpclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bridges/mcpclient/mcpfile"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
)

// emptyDataDir is a data directory with no installed tools (the bundled
// ones count as installed already): a daemon on it compiles nothing.
func emptyDataDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	tools := filepath.Join(dir, "tools")
	if err := os.MkdirAll(tools, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tools, ".examples-installed"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startDaemon runs a daemon on dir with model until the test ends (or
// stop), and returns a client of it.
func startDaemon(t *testing.T, dir string, model *scripted.Provider) (c *client.Client, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan protocol.DaemonInfo, 1)
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, daemon.Config{DataDir: dir, Addr: "127.0.0.1:0", Provider: model,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Ready: func(i protocol.DaemonInfo) { ready <- i }})
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		if c != nil {
			c.Close()
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("daemon.Run: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("the daemon did not stop within a minute")
		}
	}
	t.Cleanup(stop)
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("daemon.Run: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the daemon was not ready within a minute")
	}
	c, err := client.DialDataDir(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Initialize(ctx, protocol.InitializeParams{Client: "mcpclient-test"}); err != nil {
		t.Fatal(err)
	}
	return c, stop
}

// keelCLI runs the keel command line on dir (--data-dir first: args may
// end with a command after --).
func keelCLI(t *testing.T, dir string, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	code := cli.Main(context.Background(), append([]string{"--data-dir", dir}, args...), &out, &out)
	return out.String(), code
}

// waitTools waits, tools.changed by tools.changed, until cond holds for
// the daemon's tools.list.
func waitTools(t *testing.T, c *client.Client, what string, cond func([]protocol.ToolInfo) bool) []protocol.ToolInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		tools, err := c.ListTools(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if cond(tools) {
			return tools
		}
		select {
		case <-c.ToolsChanged():
		case <-ctx.Done():
			t.Fatalf("waited a minute for %s; tools.list: %+v", what, tools)
		}
	}
}

// follow returns the events of run id until one of until.
func follow(t *testing.T, c *client.Client, id keel.RunID, until ...keel.EventType) []keel.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := c.Subscribe(ctx, id, 0); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	var evs []keel.Event
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				t.Fatalf("connection closed; got %d events", len(evs))
			}
			if ev.RunID != id || ev.Seq == 0 {
				continue
			}
			evs = append(evs, ev)
			if slices.Contains(until, ev.Type) {
				return evs
			}
		case <-ctx.Done():
			t.Fatalf("run %s: no %v; got %d events", id, until, len(evs))
		}
	}
}

func hasTool(name string) func([]protocol.ToolInfo) bool {
	return func(ts []protocol.ToolInfo) bool {
		return slices.ContainsFunc(ts, func(t protocol.ToolInfo) bool { return t.Name == name })
	}
}

// TestRunThroughDaemon: a user adds server-everything (streamable HTTP,
// labelled pii) with keel mcp add while the daemon runs; its tools appear
// in tools.list with their provenance, a run's model calls its echo
// through the real engine, the result carries the label, the audit
// record names the server, env.describe and keel mcp list show it, and
// keel mcp remove takes its tools away.
func TestRunThroughDaemon(t *testing.T) {
	t.Parallel()
	url := everythingHTTP(t)
	dir := emptyDataDir(t)
	model := scripted.New(nil, scripted.CallTool("mcp-everything-echo", `{"message":"from a run"}`), scripted.Answer("done"))
	c, _ := startDaemon(t, dir, model)
	ctx := context.Background()

	if out, code := keelCLI(t, dir, "mcp", "add", "everything", "--url", url, "--label", "pii"); code != 0 {
		t.Fatalf("keel mcp add = %d: %s", code, out)
	}
	tools := waitTools(t, c, "server-everything's tools", hasTool("mcp-everything-echo"))
	for _, tool := range tools {
		if tool.Name == "mcp-everything-echo" && (tool.Provenance != "mcp:everything/echo" || tool.SideEffects != keel.SideEffectReadOnly || !slices.Equal(tool.Labels, []string{"pii"})) {
			t.Errorf("tools.list: %+v, want provenance mcp:everything/echo, read_only, labels [pii]", tool)
		}
	}

	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "echo something", Model: scripted.DefaultModel.Name, MaxSteps: 3})
	if err != nil {
		t.Fatal(err)
	}
	evs := follow(t, c, run.ID, keel.EventRunSucceeded, keel.EventRunFailed, keel.EventRunCancelled)
	if last := evs[len(evs)-1]; last.Type != keel.EventRunSucceeded {
		t.Fatalf("run ended with %s: %s", last.Type, last.Data)
	}
	var res keel.ToolResultData
	for _, ev := range evs {
		if ev.Type == keel.EventToolResult {
			json.Unmarshal(ev.Data, &res)
		}
	}
	if !strings.Contains(string(res.Output), "Echo: from a run") || !slices.Contains(res.Labels, "pii") {
		t.Errorf("tool.result = %+v, want the echo labelled pii", res)
	}
	audit, err := c.ToolAudit(ctx, "mcp-everything-echo", 5)
	if err != nil || len(audit) != 1 {
		t.Fatalf("tools.audit = %+v, %v, want the run's call", audit, err)
	}
	if rec := audit[0]; rec.RunID != run.ID || rec.Outcome != "ok" || len(rec.Grants) != 1 || rec.Grants[0] != "mcp:everything "+url ||
		!slices.Equal(rec.Labels, []string{"pii"}) || len(rec.Hosts) != 1 {
		t.Errorf("audit record = %+v, want the run's call, ok, naming the server and its URL, labelled pii, with its host", rec)
	}

	env, err := c.Describe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(env.MCPServers) != 1 || env.MCPServers[0].State != "ready" || !slices.Contains(env.MCPServers[0].Tools, "mcp-everything-get-sum") {
		t.Errorf("env.describe mcp_servers = %+v, want everything ready with its tools", env.MCPServers)
	}
	if out, code := keelCLI(t, dir, "mcp", "list"); code != 0 || !strings.Contains(out, "everything  http  "+url) || !strings.Contains(out, "state: ready") {
		t.Errorf("keel mcp list = %d:\n%s\nwant everything, ready", code, out)
	}
	if out, code := keelCLI(t, dir, "mcp", "remove", "everything"); code != 0 {
		t.Fatalf("keel mcp remove = %d: %s", code, out)
	}
	waitTools(t, c, "server-everything's tools gone", func(ts []protocol.ToolInfo) bool { return !hasTool("mcp-everything-echo")(ts) })
}

// TestCrashRecoveryAsks: the daemon stops while a run's call of an MCP
// tool without annotations runs; the daemon started again does not call
// it again (it is a non-idempotent external effect) but waits for a
// person, where a read-only tool's call would run again.
func TestCrashRecoveryAsks(t *testing.T) {
	t.Parallel()
	var holds atomic.Int32
	entered := make(chan struct{}, 4)
	srv := sdk.NewServer(&sdk.Implementation{Name: "peer", Version: "1"}, nil)
	srv.AddTool(&sdk.Tool{Name: "hold", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, _ *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		holds.Add(1)
		entered <- struct{}{}
		<-ctx.Done()
		return &sdk.CallToolResult{}, nil
	})
	p := &peer{srv: srv}
	p.http = newHTTP(t, srv)

	dir := emptyDataDir(t)
	if err := mcpfile.WriteFile(filepath.Join(dir, mcpfile.FileName), mcpfile.File{Servers: map[string]mcpfile.ServerConfig{"peer": {URL: p.http.URL}}}); err != nil {
		t.Fatal(err)
	}
	c, stop := startDaemon(t, dir, scripted.New(nil, scripted.CallTool("mcp-peer-hold", `{}`), scripted.Answer("done")))
	run, err := c.StartRun(context.Background(), protocol.RunStartParams{Goal: "hold", Model: scripted.DefaultModel.Name, MaxSteps: 3})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("the run did not call the tool within a minute")
	}
	stop()

	c, _ = startDaemon(t, dir, scripted.New(nil, scripted.Answer("done")))
	evs := follow(t, c, run.ID, keel.EventRunWaiting, keel.EventRunSucceeded, keel.EventRunFailed)
	last := evs[len(evs)-1]
	if last.Type != keel.EventRunWaiting || !strings.Contains(string(last.Data), "not idempotent") {
		t.Errorf("the resumed run: %s %s, want it waiting for a person (not idempotent)", last.Type, last.Data)
	}
	if n := holds.Load(); n != 1 {
		t.Errorf("the tool was called %d times, want once: not again after the crash", n)
	}
}

// TestAddStdioNeedsGrant: keel mcp add of a stdio server says it runs
// outside the sandbox and, with no terminal to ask on, grants nothing
// and writes nothing unless --allow-native; keel mcp list says whether
// it is granted.
func TestAddStdioNeedsGrant(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, mcpfile.FileName)
	out, code := keelCLI(t, dir, "mcp", "add", "tool_box", "--stdio", "--", "node", "server.js")
	if code != cli.ExitRefused || !strings.Contains(out, "OUTSIDE keel's WebAssembly sandbox") || !strings.Contains(out, "--allow-native") {
		t.Errorf("keel mcp add --stdio without a grant = %d:\n%s\nwant %d, the warning and how to grant", code, out, cli.ExitRefused)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("mcp.json after a refused add: %v, want none", err)
	}
	if out, code := keelCLI(t, dir, "mcp", "add", "tool_box", "--url", "http://127.0.0.1:1/mcp", "--", "node"); code != cli.ExitUsage {
		t.Errorf("keel mcp add with --url and a command = %d: %s, want %d", code, out, cli.ExitUsage)
	}
	if out, code := keelCLI(t, dir, "mcp", "add", "tool_box", "--allow-native", "--", "node", "server.js"); code != 0 {
		t.Fatalf("keel mcp add --allow-native = %d: %s", code, out)
	}
	f, err := mcpfile.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if c := f.Servers["tool_box"]; !c.Granted() || !slices.Equal(c.Command, []string{"node", "server.js"}) {
		t.Errorf("mcp.json server = %+v, want the command granted", c)
	}
	if out, code := keelCLI(t, dir, "mcp", "list"); code != 0 || !strings.Contains(out, "native process, outside the sandbox") {
		t.Errorf("keel mcp list = %d:\n%s\nwant the server, granted, as a native process", code, out)
	}
}

// TestRunWithServerDown: a run's call of a tool whose server went away
// gets a classified error (crashed, saying the server is not connected)
// at once, the model goes on, and the daemon serves on.
func TestRunWithServerDown(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	dir := emptyDataDir(t)
	if err := mcpfile.WriteFile(filepath.Join(dir, mcpfile.FileName), mcpfile.File{Servers: map[string]mcpfile.ServerConfig{"peer": {URL: p.http.URL}}}); err != nil {
		t.Fatal(err)
	}
	c, _ := startDaemon(t, dir, scripted.New(nil, scripted.CallTool("mcp-peer-plain", `{"text":"x"}`), scripted.Answer("went on")))
	ctx := context.Background()
	waitTools(t, c, "the peer's tools", hasTool("mcp-peer-plain"))
	p.http.CloseClientConnections()
	p.http.Close()
	// The server's state change is a tools.changed too.
	waitTools(t, c, "the peer down", func([]protocol.ToolInfo) bool {
		env, err := c.Describe(ctx)
		return err == nil && len(env.MCPServers) == 1 && env.MCPServers[0].State == "down"
	})
	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "call a server that is down", Model: scripted.DefaultModel.Name, MaxSteps: 3})
	if err != nil {
		t.Fatal(err)
	}
	evs := follow(t, c, run.ID, keel.EventRunSucceeded, keel.EventRunFailed, keel.EventRunCancelled)
	if last := evs[len(evs)-1]; last.Type != keel.EventRunSucceeded {
		t.Fatalf("run ended with %s: %s", last.Type, last.Data)
	}
	var res keel.ToolResultData
	for _, ev := range evs {
		if ev.Type == keel.EventToolResult {
			json.Unmarshal(ev.Data, &res)
		}
	}
	if res.Error == nil || res.Error.Code != keel.ToolCrashed || !strings.Contains(res.Error.Message, "not connected") {
		t.Errorf("tool.result = %+v, want crashed: the server is not connected", res)
	}
	if p.calls.Load() != 0 {
		t.Errorf("the peer was called")
	}
}
