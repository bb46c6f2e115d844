package mcpserver_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
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
