package mcpclient_test

import (
	"context"
	"encoding/json"
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
	"github.com/keel-runtime/keel/internal/daemontest"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
)

// startDaemon runs a daemon on dir with model until the test ends (or
// stop), and returns a client of it.
func startDaemon(t *testing.T, dir string, model *scripted.Provider) (c *client.Client, stop func()) {
	t.Helper()
	d := daemontest.Start(t, daemon.Config{DataDir: dir, Provider: model})
	c = daemontest.Dial(t, dir)
	if _, err := c.Initialize(context.Background(), protocol.InitializeParams{Client: "mcpclient-test"}); err != nil {
		t.Fatal(err)
	}
	return c, func() {
		c.Close()
		if err := d.Stop(); err != nil {
			t.Errorf("daemon.Run: %v", err)
		}
	}
}

// keelCLI runs the keel command line on dir (--data-dir first: args may
// end with a command after --).
func keelCLI(t *testing.T, dir string, args ...string) (string, int) {
	t.Helper()
	out, errOut, code := daemontest.CLI(context.Background(), dir, args...)
	return out + errOut, code
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
	dir := daemontest.EmptyDataDir(t)
	model := scripted.New(nil, scripted.CallTool("mcp-everything-echo", `{"message":"from a run"}`), scripted.Answer("done"))
	c, _ := startDaemon(t, dir, model)
	ctx := context.Background()

	if out, code := keelCLI(t, dir, "mcp", "add", "everything", "--url", url, "--label", "pii"); code != 0 {
		t.Fatalf("keel mcp add = %d: %s", code, out)
	}
	tools := daemontest.WaitTools(t, c, "server-everything's tools", daemontest.HasTool("mcp-everything-echo"))
	for _, tool := range tools {
		if tool.Name == "mcp-everything-echo" && (tool.Provenance != "mcp:everything/echo" || tool.SideEffects != keel.SideEffectReadOnly || !slices.Equal(tool.Labels, []string{"pii"})) {
			t.Errorf("tools.list: %+v, want provenance mcp:everything/echo, read_only, labels [pii]", tool)
		}
	}

	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "echo something", Model: scripted.DefaultModel.Name, MaxSteps: 3})
	if err != nil {
		t.Fatal(err)
	}
	evs := daemontest.Follow(t, c, run.ID, keel.EventRunSucceeded, keel.EventRunFailed, keel.EventRunCancelled)
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
	daemontest.WaitTools(t, c, "server-everything's tools gone", func(ts []protocol.ToolInfo) bool { return !daemontest.HasTool("mcp-everything-echo")(ts) })
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

	dir := daemontest.EmptyDataDir(t)
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
	evs := daemontest.Follow(t, c, run.ID, keel.EventRunWaiting, keel.EventRunSucceeded, keel.EventRunFailed)
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
	dir := daemontest.EmptyDataDir(t)
	if err := mcpfile.WriteFile(filepath.Join(dir, mcpfile.FileName), mcpfile.File{Servers: map[string]mcpfile.ServerConfig{"peer": {URL: p.http.URL}}}); err != nil {
		t.Fatal(err)
	}
	c, _ := startDaemon(t, dir, scripted.New(nil, scripted.CallTool("mcp-peer-plain", `{"text":"x"}`), scripted.Answer("went on")))
	ctx := context.Background()
	daemontest.WaitTools(t, c, "the peer's tools", daemontest.HasTool("mcp-peer-plain"))
	p.http.CloseClientConnections()
	p.http.Close()
	// The server's state change is a tools.changed too.
	daemontest.WaitTools(t, c, "the peer down", func([]protocol.ToolInfo) bool {
		env, err := c.Describe(ctx)
		return err == nil && len(env.MCPServers) == 1 && env.MCPServers[0].State == "down"
	})
	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "call a server that is down", Model: scripted.DefaultModel.Name, MaxSteps: 3})
	if err != nil {
		t.Fatal(err)
	}
	evs := daemontest.Follow(t, c, run.ID, keel.EventRunSucceeded, keel.EventRunFailed, keel.EventRunCancelled)
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
