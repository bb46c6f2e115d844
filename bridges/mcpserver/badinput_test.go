package mcpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bridges/mcpserver"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestBadInput sends /mcp what a broken or hostile client might, over
// real HTTP: each gets a clear refusal, and afterwards the same session,
// a new one and keel's own protocol all still work.
func TestBadInput(t *testing.T) {
	t.Parallel()
	auth := map[string]string{"Authorization": "Bearer " + shared.token}
	resp := post(t, "", auth, initializeBody)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		t.Fatalf("initialize = %d, session %q", resp.StatusCode, sid)
	}
	inSession := map[string]string{"Authorization": "Bearer " + shared.token, "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"}
	if resp := post(t, "", inSession, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notifications/initialized = %d, want 202", resp.StatusCode)
	}

	huge := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"wordcount","arguments":{"text":"` + strings.Repeat("a ", 3<<20) + `"}}}`
	for _, tt := range []struct {
		name string
		head map[string]string
		body string
		want int
	}{
		{"malformed JSON, no session", auth, `{"jsonrpc":"2.0","id":1,"method":`, http.StatusBadRequest},
		{"malformed JSON in a session", inSession, `{"jsonrpc":`, http.StatusBadRequest},
		{"not JSON-RPC", inSession, `[1,2,3]`, http.StatusBadRequest},
		{"unknown method", inSession, `{"jsonrpc":"2.0","id":2,"method":"keel/nope","params":{}}`, http.StatusBadRequest},
		{"unknown session", map[string]string{"Authorization": "Bearer " + shared.token, "Mcp-Session-Id": "nope", "Mcp-Protocol-Version": "2025-06-18"},
			`{"jsonrpc":"2.0","id":3,"method":"tools/list"}`, http.StatusNotFound},
		{"over 4 MiB", inSession, huge, http.StatusRequestEntityTooLarge},
	} {
		if resp := post(t, "", tt.head, tt.body); resp.StatusCode != tt.want {
			t.Errorf("%s: POST /mcp = %d, want %d", tt.name, resp.StatusCode, tt.want)
		}
	}

	// A client that goes away during its call: the request's connection
	// closes once the response has begun (or at once, if the call is
	// quicker).
	ctx, cancel := context.WithCancel(context.Background())
	big := `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"wordcount","arguments":{"text":"` + strings.Repeat("word ", 200<<10) + `"}}}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, shared.base+"/mcp", strings.NewReader(big))
	for k, v := range inSession {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		cancel()
		resp.Body.Close()
	}
	cancel()

	// The session still answers.
	resp = post(t, "", inSession, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"wordcount","arguments":{"text":"still here"}}}`)
	if body, _ := readAll(resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, wordcountOutput) {
		t.Errorf("a call in the same session after bad input = %d %s, want the count", resp.StatusCode, body)
	}
	// A new session does.
	cs := connect(t, shared.token, "after-bad-input", nil)
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "wordcount", Arguments: map[string]any{"text": "a b c"}})
	if got, _ := json.Marshal(res.StructuredContent); err != nil || res.IsError || !jsonHas(t, got, wordcountOutput) {
		t.Errorf("a new session's call after bad input = %s, %v", got, err)
	}
	// keel's own protocol does.
	cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
	defer ccancel()
	if out, err := shared.c.CallTool(cctx, "wordcount", json.RawMessage(`{"text":"x"}`)); err != nil || !jsonHas(t, out.Output, wordcountOutput) {
		t.Errorf("tools.call after bad MCP input = %s, %v", out.Output, err)
	}
}

func readAll(resp *http.Response) (string, error) {
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestDisconnectMidCall: a client that goes away while its call waits
// (for its user's answer to an elicitation, so the call is surely in
// flight) ends the call: the audit trail records it with the ask and no
// answer, and meanwhile and afterwards other clients are served. Over
// both transports: HTTP (the request's connection drops) and stdio (keel
// mcp is killed).
func TestDisconnectMidCall(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{"http", "stdio"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			name := "keel-test-gone-" + transport
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if transport == "http" {
				asked := make(chan struct{})
				var once sync.Once
				opts := &sdk.ClientOptions{ElicitationHandler: func(ctx context.Context, _ *sdk.ElicitRequest) (*sdk.ElicitResult, error) {
					once.Do(func() { close(asked) })
					<-ctx.Done()
					return nil, ctx.Err()
				}}
				tr := &http.Transport{}
				cs, err := sdk.NewClient(&sdk.Implementation{Name: name, Version: "1"}, opts).Connect(ctx,
					&sdk.StreamableClientTransport{Endpoint: shared.base + "/mcp", HTTPClient: &http.Client{Transport: bearer{shared.token, tr}}}, nil)
				if err != nil {
					t.Fatal(err)
				}
				callCtx, hangUp := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() {
					_, err := cs.CallTool(callCtx, &sdk.CallToolParams{Name: "stamp", Arguments: map[string]any{"note": "gone"}})
					done <- err
				}()
				select {
				case <-asked:
				case err := <-done:
					t.Fatalf("stamp returned before its elicitation: %v", err)
				}
				othersServed(t, ctx)
				// The request's connection drops, and so does the
				// session's stream.
				hangUp()
				tr.CloseIdleConnections()
				cs.Close()
				<-done
			} else {
				stdioHangUp(t, ctx, name)
			}
			waitAudit(t, ctx, "mcp:"+name, string(keel.ToolPolicyDenied))
			othersServed(t, ctx)
		})
	}
}

// stdioHangUp starts keel mcp as client name (declaring elicitation),
// calls stamp and kills keel mcp once the daemon asks its user.
func stdioHangUp(t *testing.T, ctx context.Context, name string) {
	cmd := exec.CommandContext(ctx, os.Args[0], "mcp", "--data-dir", shared.dir)
	cmd.Env = append(os.Environ(), cliEnv+"=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stdout)
	lines.Buffer(nil, 1<<20)
	send := func(msg string) {
		if _, err := io.WriteString(stdin, msg+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"elicitation":{}},"clientInfo":{"name":"` + name + `","version":"1"}}}`)
	if !lines.Scan() || !strings.Contains(lines.Text(), `"result"`) {
		t.Fatalf("initialize over stdio: %q %v", lines.Text(), lines.Err())
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"stamp","arguments":{"note":"gone"}}}`)
	for lines.Scan() {
		if strings.Contains(lines.Text(), `"id":2,`) {
			t.Fatalf("stamp was answered without an elicitation: %s", lines.Text())
		}
		if strings.Contains(lines.Text(), `"method":"elicitation/create"`) {
			othersServed(t, ctx)
			cmd.Process.Kill()
			return
		}
	}
	t.Fatalf("keel mcp ended before the elicitation: %v", lines.Err())
}

// othersServed checks that another MCP session and keel's own protocol
// are served.
func othersServed(t *testing.T, ctx context.Context) {
	t.Helper()
	cs := connect(t, shared.token, "keel-test-bystander", nil)
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "wordcount", Arguments: map[string]any{"text": "a b c"}})
	if got, _ := json.Marshal(res.StructuredContent); err != nil || res.IsError || !jsonHas(t, got, wordcountOutput) {
		t.Errorf("another session's call = %s, %v", got, err)
	}
	if out, err := shared.c.CallTool(ctx, "wordcount", json.RawMessage(`{"text":"x"}`)); err != nil || !jsonHas(t, out.Output, wordcountOutput) {
		t.Errorf("tools.call = %s, %v", out.Output, err)
	}
}

// waitAudit waits until the audit trail holds a call of stamp by client
// with outcome. Nothing signals when the daemon has noticed a
// disconnection, so it reads the trail again every 20 ms until ctx ends.
func waitAudit(t *testing.T, ctx context.Context, who, outcome string) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		recs, err := client.Do(ctx, shared.c, client.ToolsAudit, protocol.ToolsAuditParams{Tool: "stamp", Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs.Records {
			if r.Client == who && r.Outcome == outcome && r.Policy != nil && r.Policy.Outcome == "ask" && r.Policy.Approver == who {
				return
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("no audit record of the call %s abandoned (outcome %s, an ask it did not answer)", who, outcome)
		}
	}
}

// TestStdioBadInput sends keel mcp what a broken client might: each line
// gets a JSON-RPC error (a line over 4 MiB too, read without holding it)
// and keel mcp goes on serving.
func TestStdioBadInput(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "mcp", "--data-dir", shared.dir)
	cmd.Env = append(os.Environ(), cliEnv+"=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stdout)
	lines.Buffer(nil, 1<<20)
	go func() {
		msgs := []string{
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bad","version":"1"}}}`,
			`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
			`{"jsonrpc":"2.0","id":2,"method":`,
			`{"jsonrpc":"2.0","id":3,"method":"keel/nope","params":{}}`,
			`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"wordcount","arguments":{"text":"` + strings.Repeat("a ", 3<<20) + `"}}}`,
			`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"wordcount","arguments":{"text":"still here"}}}`,
		}
		for _, m := range msgs {
			io.WriteString(stdin, m+"\n")
		}
	}()
	// The daemon's HTTP transport refuses an unknown method as a bad
	// request: invalid request (-32600), not method not found.
	want := map[string]int{"1": 0, "null": -32700, "3": -32600, "5": 0}
	tooLarge := false
	for len(want) > 0 && lines.Scan() {
		var msg struct {
			ID    json.RawMessage `json:"id"`
			Error *struct {
				Code int `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(lines.Bytes(), &msg); err != nil {
			t.Fatalf("keel mcp wrote %q: %v", lines.Text(), err)
		}
		id, code := string(msg.ID), 0
		if msg.Error != nil {
			code = msg.Error.Code
		}
		if id == "null" && code == mcpserver.CodeMessageTooLarge {
			tooLarge = true
			continue
		}
		w, ok := want[id]
		if !ok || w != code {
			t.Errorf("keel mcp answered %s", lines.Text())
		}
		if id == "5" && !strings.Contains(lines.Text(), `"words":3`) {
			t.Errorf("a call after bad input = %s", lines.Text())
		}
		delete(want, id)
	}
	if len(want) > 0 || !tooLarge {
		t.Errorf("keel mcp left unanswered %v (and the message over 4 MiB: answered %v): %v", want, tooLarge, lines.Err())
	}
}

// TestRelayBoundsMemory: a client line far over the relay's bound is
// read past without being held (a 64 MiB line costs well under 64 MiB of
// allocation) and answered with CodeMessageTooLarge; the next message is
// relayed. Not parallel: it counts the process's allocations.
func TestRelayBoundsMemory(t *testing.T) {
	const huge = 64 << 20
	in := io.MultiReader(
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"huge","version":"1"}}}`+"\n"+`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"text":"`),
		io.LimitReader(repeatReader('a'), huge),
		strings.NewReader(`"}}`+"\n"+`{"jsonrpc":"2.0","id":3,"method":"ping"}`+"\n"))
	var out bytes.Buffer
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := mcpserver.Relay(context.Background(), mcpserver.RelayConfig{URL: shared.base + "/mcp", Token: shared.token, MaxMessageBytes: 1 << 20}, in, &out)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatalf("Relay: %v", err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if !strings.Contains(l, `"method":"notifications/`) {
			lines = append(lines, l)
		}
	}
	if len(lines) != 3 || !strings.Contains(lines[1], `"id":null,"error":{"code":-32600`) || !strings.Contains(lines[2], `"id":3,"result"`) {
		t.Errorf("Relay wrote:\n%s\nwant initialize's result, a too-large error, ping's result", out.String())
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > huge/4 {
		t.Errorf("relaying past a %d MiB line allocated %d MiB", huge>>20, alloc>>20)
	}
}

// repeatReader reads as an endless run of one byte.
type repeatReader byte

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}
