package mcpclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/keel-runtime/keel/bridges/mcpclient/mcpfile"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bridges/mcpclient"
	"github.com/keel-runtime/keel/intercept"
)

// peer is an MCP server of the Go SDK over streamable HTTP (httptest),
// with three tools: "plain" (no annotations: echoes its "text"),
// "block" (read-only; answers when release is closed or the call ends),
// and "fail" (an error result).
type peer struct {
	srv     *sdk.Server
	http    *httptest.Server
	calls   atomic.Int32  // calls of plain
	entered chan struct{} // a call of block started
	release chan struct{}
}

func newPeer(t *testing.T) *peer {
	t.Helper()
	p := &peer{entered: make(chan struct{}, 8), release: make(chan struct{})}
	p.srv = sdk.NewServer(&sdk.Implementation{Name: "peer", Version: "1.2.3"}, nil)
	in := json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`)
	p.srv.AddTool(&sdk.Tool{Name: "plain", Description: "echoes text", InputSchema: in}, func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		p.calls.Add(1)
		var a struct{ Text string }
		json.Unmarshal(req.Params.Arguments, &a)
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "got " + a.Text}}}, nil
	})
	p.srv.AddTool(&sdk.Tool{Name: "block", InputSchema: json.RawMessage(`{"type":"object"}`), Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			p.entered <- struct{}{}
			select {
			case <-p.release:
			case <-ctx.Done():
			}
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "released"}}}, nil
		})
	p.srv.AddTool(&sdk.Tool{Name: "fail", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "no luck"}}}, nil
	})
	p.http = newHTTP(t, p.srv)
	return p
}

// newHTTP serves srv over streamable HTTP until the test ends.
func newHTTP(t *testing.T, srv *sdk.Server) *httptest.Server {
	h := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil))
	t.Cleanup(h.Close)
	return h
}

// opened is a Manager of servers, with its changes (Config.OnChange).
type opened struct {
	m       *mcpclient.Manager
	changes chan struct{}
	n       atomic.Int32 // calls of OnChange
	file    string
	audit   *auditLog
}

// open starts a Manager of servers (written to a fresh mcp.json) with
// short timeouts and a recording interceptor.
func open(t *testing.T, servers map[string]mcpfile.ServerConfig, watch bool) *opened {
	t.Helper()
	o := &opened{changes: make(chan struct{}, 64), file: filepath.Join(t.TempDir(), mcpfile.FileName), audit: &auditLog{}}
	if err := mcpfile.WriteFile(o.file, mcpfile.File{Servers: servers}); err != nil {
		t.Fatal(err)
	}
	m, err := mcpclient.Open(mcpclient.Config{File: o.file, Watch: watch, Logger: testLogger(t), Interceptors: intercept.Tools{o.audit},
		OnChange: func() {
			o.n.Add(1)
			select {
			case o.changes <- struct{}{}:
			default:
			}
		},
		ConnectTimeout: 20 * time.Second, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	o.m = m
	t.Cleanup(m.Close)
	return o
}

// waitFor waits, change by change, until cond holds (at most 30 s).
func (o *opened) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for !cond() {
		select {
		case <-o.changes:
		case <-deadline:
			t.Fatalf("waited 30 s for %s; servers: %+v", what, o.m.Servers())
		}
	}
}

// state is the state of the server name.
func (o *opened) state(name string) string {
	for _, d := range o.m.Servers() {
		if d.Name == name {
			return d.State
		}
	}
	return ""
}

// auditLog records what an interceptor sees after each call.
type auditLog struct {
	mu  sync.Mutex
	log []intercept.ToolOutcome
	inv []keel.ToolInvocation
}

func (a *auditLog) BeforeTool(context.Context, keel.ToolInvocation) intercept.Decision {
	return intercept.Decision{}
}

func (a *auditLog) AfterTool(_ context.Context, inv keel.ToolInvocation, _ intercept.Decision, o intercept.ToolOutcome) {
	a.mu.Lock()
	a.log = append(a.log, o)
	a.inv = append(a.inv, inv)
	a.mu.Unlock()
}

func (a *auditLog) last() (keel.ToolInvocation, intercept.ToolOutcome) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inv[len(a.inv)-1], a.log[len(a.log)-1]
}

// call calls name with args and returns the output or the tool error.
func call(t *testing.T, m *mcpclient.Manager, inv keel.ToolInvocation) (json.RawMessage, *keel.ToolError) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := m.Call(ctx, inv)
	if err == nil {
		return out, nil
	}
	var te *keel.ToolError
	if !errors.As(err, &te) {
		t.Fatalf("Call(%s) = %v, want a *keel.ToolError", inv.Name, err)
	}
	return nil, te
}

func TestInProcessServer(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	o := open(t, map[string]mcpfile.ServerConfig{"peer": {URL: p.http.URL, Labels: []string{"pii"}, TimeoutSeconds: 20}}, false)
	o.waitFor(t, "peer ready", func() bool { return o.state("peer") == mcpclient.StateReady })

	t.Run("classes", func(t *testing.T) {
		for name, want := range map[string]keel.SideEffect{"mcp-peer-plain": keel.SideEffectExternal, "mcp-peer-block": keel.SideEffectReadOnly} {
			if got, ok := o.m.SideEffects(name); !ok || got != want {
				t.Errorf("SideEffects(%s) = %q, %v, want %q (an unannotated tool is an external effect)", name, got, ok, want)
			}
		}
	})
	t.Run("call", func(t *testing.T) {
		touched := &keel.Touched{}
		out, te := call(t, o.m, keel.ToolInvocation{Name: "mcp-peer-plain", Args: json.RawMessage(`{"text":"hi"}`), Touched: touched})
		if te != nil || string(out) != `{"text":"got hi"}` {
			t.Fatalf("call plain = %s, %v, want {\"text\":\"got hi\"}", out, te)
		}
		if strings.Join(touched.Labels, ",") != "pii" || len(touched.Hosts) != 1 {
			t.Errorf("touched = %+v, want the server's label pii and its host", touched)
		}
		inv, oc := o.audit.last()
		if inv.Name != "mcp-peer-plain" || len(oc.Build.Grants) != 1 || !strings.HasPrefix(oc.Build.Grants[0], "mcp:peer ") || oc.Build.Version != "peer 1.2.3" {
			t.Errorf("the interceptor saw %s with build %+v, want the server named (mcp:peer URL, peer 1.2.3)", inv.Name, oc.Build)
		}
	})
	t.Run("schema error before the call", func(t *testing.T) {
		before := p.calls.Load()
		_, te := call(t, o.m, keel.ToolInvocation{Name: "mcp-peer-plain", Args: json.RawMessage(`{"text":42}`)})
		if te == nil || te.Code != keel.ToolInvalidInput || te.Path != "/text" {
			t.Fatalf("call with a number for text = %v, want invalid_input at /text", te)
		}
		if n := p.calls.Load(); n != before {
			t.Errorf("the server was called %d times for invalid arguments, want none", n-before)
		}
	})
	t.Run("error result", func(t *testing.T) {
		_, te := call(t, o.m, keel.ToolInvocation{Name: "mcp-peer-fail"})
		if te == nil || te.Code != keel.ToolFailed || !strings.Contains(te.Message, "no luck") {
			t.Errorf("call fail = %v, want tool_error with the server's text", te)
		}
	})
	t.Run("egress refused", func(t *testing.T) {
		before := p.calls.Load()
		touched := &keel.Touched{}
		refuse := func(ctx context.Context, dest string) error {
			return &keel.EgressRefusal{Tool: "mcp-peer-plain", Destination: dest, Decision: keel.PolicyDecision{Outcome: "deny", Explanation: "test"}}
		}
		_, te := call(t, o.m, keel.ToolInvocation{Name: "mcp-peer-plain", Args: json.RawMessage(`{"text":"x"}`), Egress: refuse, Touched: touched})
		if te == nil || te.Code != keel.ToolPolicyDenied || len(touched.Refused) != 1 || touched.Refused[0].Destination != p.http.URL {
			t.Errorf("call with egress refused = %v (touched %+v), want policy_denied naming the server's URL", te, touched)
		}
		if n := p.calls.Load(); n != before {
			t.Errorf("the server was called despite the refusal")
		}
	})
	t.Run("unknown tool", func(t *testing.T) {
		_, te := call(t, o.m, keel.ToolInvocation{Name: "mcp-peer-nope"})
		if te == nil || te.Code != keel.ToolNotFound {
			t.Errorf("call of an unknown tool = %v, want not_found", te)
		}
	})
}

// TestListChanged: a tool the server adds while connected (it sends
// notifications/tools/list_changed) is there for the next run; one it
// removes is gone.
func TestListChanged(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	o := open(t, map[string]mcpfile.ServerConfig{"peer": {URL: p.http.URL}}, false)
	o.waitFor(t, "peer ready", func() bool { return o.state("peer") == mcpclient.StateReady })
	p.srv.AddTool(&sdk.Tool{Name: "late", InputSchema: json.RawMessage(`{"type":"object"}`), Annotations: &sdk.ToolAnnotations{IdempotentHint: true}},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return &sdk.CallToolResult{}, nil
		})
	o.waitFor(t, "the tool added", func() bool { return o.m.Has("mcp-peer-late") })
	if se, _ := o.m.SideEffects("mcp-peer-late"); se != keel.SideEffectIdempotentWrite {
		t.Errorf("class of an idempotent tool = %q, want idempotent_write", se)
	}
	p.srv.RemoveTools("plain")
	o.waitFor(t, "the tool removed", func() bool { return !o.m.Has("mcp-peer-plain") })
}

// TestServerGoesDown: a server that stops during a call fails the call
// at once (crashed, not a hang until the timeout), a call while it is
// down fails at once, and the Manager reconnects once it is back.
func TestServerGoesDown(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	o := open(t, map[string]mcpfile.ServerConfig{"peer": {URL: p.http.URL, TimeoutSeconds: 600}}, false)
	o.waitFor(t, "peer ready", func() bool { return o.state("peer") == mcpclient.StateReady })
	done := make(chan *keel.ToolError, 1)
	go func() {
		_, te := call(t, o.m, keel.ToolInvocation{Name: "mcp-peer-block"})
		done <- te
	}()
	<-p.entered
	// The server goes away: no new connections, the open ones cut. Not
	// p.http.Close, which waits for the blocked handler, whose context
	// does not always end with its connection (a CI run hung there); it
	// is released when the test ends, before the cleanup's Close.
	defer close(p.release)
	p.http.Listener.Close()
	p.http.CloseClientConnections()
	select {
	case te := <-done:
		if te == nil || te.Code != keel.ToolCrashed {
			t.Fatalf("call when the server went away = %v, want crashed", te)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the call still waits 30 s after its server went away")
	}
	_, te := call(t, o.m, keel.ToolInvocation{Name: "mcp-peer-plain", Args: json.RawMessage(`{"text":"x"}`)})
	if te == nil || te.Code != keel.ToolCrashed {
		t.Errorf("call while the server is down = %v, want crashed", te)
	}
	o.waitFor(t, "peer down", func() bool { return o.state("peer") == mcpclient.StateDown })
	if se, ok := o.m.SideEffects("mcp-peer-block"); !ok || se != keel.SideEffectReadOnly {
		t.Errorf("a server that is down lost its tools' classes: %q, %v", se, ok)
	}
}

// TestStdioNeedsGrant: a stdio server without a native grant bound to its
// command is never started; a grant for another command does not do.
func TestStdioNeedsGrant(t *testing.T) {
	t.Parallel()
	marker := filepath.Join(t.TempDir(), "ran")
	run := mcpfile.ServerConfig{Command: []string{"sh", "-c", "touch " + marker}}
	other := run
	other.NativeGrant = mcpfile.NativeDigest(mcpfile.ServerConfig{Command: []string{"sh", "-c", "true"}})
	o := open(t, map[string]mcpfile.ServerConfig{"ungranted": run, "regranted": other}, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := o.m.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range o.m.Servers() {
		if d.State != mcpclient.StateNotGranted || d.NativeGranted || !strings.Contains(d.Error, "native") {
			t.Errorf("server %s: %+v, want not_granted, saying it needs a native grant", d.Name, d)
		}
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the ungranted command ran (stat %s: %v)", marker, err)
	}
}

// TestReload: the file's changes apply while the Manager runs (Watch):
// a server added connects, one removed goes with its tools.
func TestReload(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	o := open(t, nil, true)
	if err := mcpfile.WriteFile(o.file, mcpfile.File{Servers: map[string]mcpfile.ServerConfig{"peer": {URL: p.http.URL}}}); err != nil {
		t.Fatal(err)
	}
	o.waitFor(t, "the server added to the file", func() bool { return o.m.Has("mcp-peer-plain") })
	if err := mcpfile.WriteFile(o.file, mcpfile.File{}); err != nil {
		t.Fatal(err)
	}
	o.waitFor(t, "the server removed from the file", func() bool { return len(o.m.Servers()) == 0 && !o.m.Has("mcp-peer-plain") })
	// A file that does not read keeps the servers as they were.
	if err := os.WriteFile(o.file, []byte(`{"servers": {"Bad Name": {"url": "http://x"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := o.m.Reload(); err == nil || !errors.Is(err, keel.ErrInvalid) {
		t.Errorf("Reload of a bad file = %v, want an error wrapping keel.ErrInvalid", err)
	}
}

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("KEEL_MCPCLIENT_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestBadServers: what a server sends is not trusted. Tool names that do
// not map to a model's function name, or map to another's, are left out;
// a result over the limit fails the call; a stdio "server" that writes
// no JSON-RPC is down, saying what it wrote on stderr, and its call fails
// at once.
func TestBadServers(t *testing.T) {
	t.Parallel()
	srv := sdk.NewServer(&sdk.Implementation{Name: "bad", Version: "0"}, nil)
	obj := json.RawMessage(`{"type":"object"}`)
	answer := func(text string) sdk.ToolHandler {
		return func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}}, nil
		}
	}
	srv.AddTool(&sdk.Tool{Name: "a.b", InputSchema: obj}, answer("first"))
	srv.AddTool(&sdk.Tool{Name: "a_b", InputSchema: obj}, answer("second"))
	srv.AddTool(&sdk.Tool{Name: strings.Repeat("x", 100), InputSchema: obj}, answer("long"))
	srv.AddTool(&sdk.Tool{Name: "huge", InputSchema: obj}, answer(strings.Repeat("y", 5<<20)))
	h := newHTTP(t, srv)
	garbage := mcpfile.ServerConfig{Command: []string{"sh", "-c", "echo this is not JSON-RPC; echo oops, no server here >&2; exec sleep 60"}}
	garbage.NativeGrant = mcpfile.NativeDigest(garbage)
	o := open(t, map[string]mcpfile.ServerConfig{"bad": {URL: h.URL}, "garbage": garbage}, false)
	o.waitFor(t, "bad ready", func() bool { return o.state("bad") == mcpclient.StateReady })

	var names []string
	for _, s := range o.m.Specs() {
		names = append(names, s.Name)
		if len(s.Name) > 64 {
			t.Errorf("tool %s is longer than a model's function name may be", s.Name)
		}
	}
	if n := strings.Count(strings.Join(names, " "), "mcp-bad-a_b"); n != 1 {
		t.Errorf("tools %v: mcp-bad-a_b %d times, want once (a.b and a_b map to one name)", names, n)
	}
	_, te := call(t, o.m, keel.ToolInvocation{Name: "mcp-bad-huge"})
	if te == nil || te.Code != keel.ToolResourceExhausted {
		t.Errorf("a 5 MiB result = %v, want resource_exhausted", te)
	}
	o.waitFor(t, "garbage down", func() bool { return o.state("garbage") == mcpclient.StateDown })
	for _, d := range o.m.Servers() {
		if d.Name == "garbage" && !strings.Contains(d.Error, "oops, no server here") {
			t.Errorf("garbage's error = %q, want what it wrote on stderr", d.Error)
		}
	}
}
