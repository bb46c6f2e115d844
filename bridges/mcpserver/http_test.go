package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bridges/mcpserver"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// connect opens an MCP session with the shared daemon at /mcp as client
// name, presenting token.
func connect(t *testing.T, token, name string, opts *sdk.ClientOptions) *sdk.ClientSession {
	t.Helper()
	tr := &sdk.StreamableClientTransport{Endpoint: shared.base + "/mcp", HTTPClient: httpClient(token)}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: name, Version: "1"}, opts).Connect(context.Background(), tr, nil)
	if err != nil {
		t.Fatalf("connect to /mcp: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// connectStdio starts `keel mcp` (this test binary as the CLI) for the
// shared daemon and opens an MCP session with it as client name.
func connectStdio(t *testing.T, name string) *sdk.ClientSession {
	t.Helper()
	cmd := exec.Command(os.Args[0], "mcp", "--data-dir", shared.dir)
	cmd.Env = append(os.Environ(), cliEnv+"=1")
	cmd.Stderr = os.Stderr
	cs, err := sdk.NewClient(&sdk.Implementation{Name: name, Version: "1"}, nil).Connect(context.Background(), &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("start keel mcp: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func tool(t *testing.T, cs *sdk.ClientSession, name string) *sdk.Tool {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	for _, tl := range res.Tools {
		if tl.Name == name {
			return tl
		}
	}
	t.Fatalf("tools/list has no %s", name)
	return nil
}

// TestServesTools checks, over both transports, what an MCP client sees
// of keel's tools: wordcount's schemas as keel declares them, its
// read-only class as hints, and calls as the daemon answers them: an
// output as structured content, a schema error and a refused grant as
// isError results carrying keel's tool error, every call in the audit
// trail under the client's name.
func TestServesTools(t *testing.T) {
	t.Parallel()
	transports := map[string]func(t *testing.T, name string) *sdk.ClientSession{
		"http":  func(t *testing.T, name string) *sdk.ClientSession { return connect(t, shared.token, name, nil) },
		"stdio": connectStdio,
	}
	for transport, open := range transports {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			name := "keel-test-" + transport
			cs := open(t, name)
			wc := tool(t, cs, "wordcount")
			f := false
			wantHints := &sdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, DestructiveHint: &f, OpenWorldHint: &f}
			if diff := cmp.Diff(wantHints, wc.Annotations); diff != "" {
				t.Errorf("wordcount annotations (-want +got):\n%s", diff)
			}
			for _, s := range []struct {
				name string
				got  any
				want string
			}{{"inputSchema", wc.InputSchema, `"required":["text"]`}, {"outputSchema", wc.OutputSchema, `"required":["words","lines","chars"]`}} {
				b, _ := json.Marshal(s.got)
				if !bytes.Contains(b, []byte(s.want)) {
					t.Errorf("wordcount %s = %s, want keel's schema (with %s)", s.name, b, s.want)
				}
			}

			tests := []struct {
				tool, args string
				isError    bool
				want       string // structuredContent, or _meta["keel/error"] of an error
			}{
				{"wordcount", `{"text":"one two\nthree"}`, false, `{"chars":13,"lines":2,"words":3}`},
				{"wordcount", `{"text":5}`, true, `{"code":"invalid_input","message":"got number, want string","path":"/text"}`},
				{"readfile", `{"path":"notes.txt"}`, true, `{"code":"permission_denied"}`},
			}
			for _, tt := range tests {
				res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: tt.tool, Arguments: json.RawMessage(tt.args)})
				if err != nil {
					t.Fatalf("tools/call %s %s: %v", tt.tool, tt.args, err)
				}
				got, _ := json.Marshal(res.StructuredContent)
				if res.IsError {
					if res.StructuredContent != nil {
						t.Errorf("tools/call %s %s: an error with structuredContent %s (clients check it against the output schema)", tt.tool, tt.args, got)
					}
					got, _ = json.Marshal(res.Meta[mcpserver.ErrorMetaKey])
				}
				if res.IsError != tt.isError || !jsonHas(t, got, tt.want) {
					t.Errorf("tools/call %s %s = isError %v, %s; want isError %v, %s", tt.tool, tt.args, res.IsError, got, tt.isError, tt.want)
				}
				if len(res.Content) != 1 {
					t.Errorf("tools/call %s %s: content %v, want one text", tt.tool, tt.args, res.Content)
				}
			}

			recs, err := client.Do(context.Background(), shared.c, client.ToolsAudit, protocol.ToolsAuditParams{Limit: 1000})
			if err != nil {
				t.Fatal(err)
			}
			var mine []string
			for _, r := range recs.Records {
				if r.Client == "mcp:"+name {
					mine = append(mine, r.Tool+" "+r.Outcome)
				}
			}
			slices.Sort(mine)
			want := []string{"readfile permission_denied", "wordcount invalid_input", "wordcount ok"}
			if !slices.Equal(mine, want) {
				t.Errorf("audit records of client mcp:%s = %q, want %q", name, mine, want)
			}
		})
	}
}

// jsonHas reports whether the JSON object got has every member of want,
// recursively (a subset match).
func jsonHas(t *testing.T, got []byte, want string) bool {
	t.Helper()
	var g, w any
	if json.Unmarshal(got, &g) != nil {
		return false
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	return subset(w, g)
}

func subset(want, got any) bool {
	wm, ok := want.(map[string]any)
	if !ok {
		return cmp.Equal(want, got)
	}
	gm, ok := got.(map[string]any)
	if !ok {
		return false
	}
	for k, v := range wm {
		if !subset(v, gm[k]) {
			return false
		}
	}
	return true
}

// TestScopes: over HTTP an MCP method needs the scope keel's own method
// does (tools/list read, tools/call run), whatever token presents it,
// and /mcp has the WebSocket's token, Origin and Host checks.
func TestScopes(t *testing.T) {
	t.Parallel()
	tokens := map[string]string{}
	for _, scope := range []string{keel.ScopeRead, keel.ScopeRun} {
		res, err := client.Do(context.Background(), shared.c, client.TokenCreate, protocol.TokenCreateParams{Name: "mcp-" + scope, Scopes: []string{scope}})
		if err != nil {
			t.Fatal(err)
		}
		tokens[scope] = res.Token
	}
	call := &sdk.CallToolParams{Name: "wordcount", Arguments: map[string]any{"text": "a"}}
	for _, tt := range []struct {
		scope          string
		listOK, callOK bool
	}{{keel.ScopeRead, true, false}, {keel.ScopeRun, false, true}} {
		cs := connect(t, tokens[tt.scope], "scoped-"+tt.scope, nil)
		_, err := cs.ListTools(context.Background(), nil)
		if (err == nil) != tt.listOK || (err != nil && !forbidden(err)) {
			t.Errorf("token with scope %s: tools/list = %v, want ok %v or forbidden", tt.scope, err, tt.listOK)
		}
		res, err := cs.CallTool(context.Background(), call)
		if (err == nil) != tt.callOK || (err != nil && !forbidden(err)) || (err == nil && res.IsError) {
			t.Errorf("token with scope %s: tools/call = %+v, %v; want ok %v or forbidden", tt.scope, res, err, tt.callOK)
		}
	}

	port := strings.TrimPrefix(shared.base, "http://127.0.0.1:")
	for _, tt := range []struct {
		name   string
		header map[string]string
		host   string
		want   int
	}{
		{"no token", nil, "", http.StatusUnauthorized},
		{"wrong token", map[string]string{"Authorization": "Bearer nope"}, "", http.StatusUnauthorized},
		{"foreign origin", map[string]string{"Authorization": "Bearer " + shared.token, "Origin": "http://evil.example"}, "", http.StatusForbidden},
		{"foreign host", map[string]string{"Authorization": "Bearer " + shared.token}, "evil.example:" + port, http.StatusForbidden},
	} {
		resp := post(t, tt.host, tt.header, initializeBody)
		if resp.StatusCode != tt.want {
			t.Errorf("POST /mcp, %s = %d, want %d", tt.name, resp.StatusCode, tt.want)
		}
	}
}

// forbidden reports whether err is the JSON-RPC error of a missing scope.
func forbidden(err error) bool {
	var je *jsonrpc.Error
	return errors.As(err, &je) && je.Code == mcpserver.CodeForbidden
}

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

// post sends body to /mcp with header (and Host host, if set) and
// returns the response, its body read and closed.
func post(t *testing.T, host string, header map[string]string, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, shared.base+"/mcp", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp
}

// TestToolListChanged: installing and removing a tool notifies every
// MCP session (notifications/tools/list_changed), after which tools/list
// shows the change, over both transports.
func TestToolListChanged(t *testing.T) {
	toolChange.Lock()
	defer toolChange.Unlock()
	changed := map[string]chan struct{}{"http": make(chan struct{}, 8), "stdio": make(chan struct{}, 8)}
	sessions := map[string]*sdk.ClientSession{}
	for transport, ch := range changed {
		opts := &sdk.ClientOptions{ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) { ch <- struct{}{} }}
		if transport == "http" {
			sessions[transport] = connect(t, shared.token, "keel-test-changes", opts)
			continue
		}
		cmd := exec.Command(os.Args[0], "mcp", "--data-dir", shared.dir)
		cmd.Env = append(os.Environ(), cliEnv+"=1")
		cs, err := sdk.NewClient(&sdk.Implementation{Name: "keel-test-changes", Version: "1"}, opts).Connect(context.Background(), &sdk.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		sessions[transport] = cs
	}
	has := func(cs *sdk.ClientSession) bool {
		res, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(res.Tools, func(tl *sdk.Tool) bool { return tl.Name == "writefile" })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := client.Do(ctx, shared.c, client.ToolsInstall, protocol.ToolsInstallParams{Path: shared.spare}); err != nil {
		t.Fatalf("install writefile: %v", err)
	}
	removed := false
	defer func() {
		if !removed {
			client.Do(context.Background(), shared.c, client.ToolsRemove, protocol.ToolRef{Name: "writefile"})
		}
	}()
	for _, step := range []struct {
		name string
		want bool
	}{{"install", true}, {"remove", false}} {
		if step.name == "remove" {
			if _, err := client.Do(ctx, shared.c, client.ToolsRemove, protocol.ToolRef{Name: "writefile"}); err != nil {
				t.Fatalf("remove writefile: %v", err)
			}
			removed = true
		}
		for transport, cs := range sessions {
			// A notification may be followed by others (grants, reload):
			// wait until the list shows the step.
			for has(cs) != step.want {
				select {
				case <-changed[transport]:
				case <-ctx.Done():
					t.Fatalf("%s: no tools/list_changed showing writefile's %s", transport, step.name)
				}
			}
		}
	}
}

// TestStdioNoDaemon: keel mcp with no daemon says so on stderr, with the
// command that starts one, and exits 1 without waiting for its client.
func TestStdioNoDaemon(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "mcp", "--data-dir", dir)
	cmd.Env = append(os.Environ(), cliEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(initializeBody+"\n"), &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("keel mcp without a daemon: %v, want exit status 1", err)
	}
	if msg := stderr.String(); !strings.Contains(msg, "keel daemon is not running") || !strings.Contains(msg, "keel daemon --data-dir "+dir) {
		t.Errorf("keel mcp without a daemon: stderr %q, want it to say none runs and how to start one", msg)
	}
	if stdout.Len() != 0 {
		t.Errorf("keel mcp without a daemon wrote %q to stdout, its MCP channel", stdout.String())
	}
}
