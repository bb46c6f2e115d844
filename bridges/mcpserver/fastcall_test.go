package mcpserver_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// rawSession is an MCP session over HTTP driven by hand.
type rawSession struct {
	t     *testing.T
	token string
	id    string
}

// openRaw initializes a session with the shared daemon as client name,
// presenting token.
func openRaw(t *testing.T, token, name string) *rawSession {
	t.Helper()
	s := &rawSession{t: t, token: token}
	resp, body := s.post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"` + name + `","version":"1"}}}`)
	if s.id = resp.Header.Get("Mcp-Session-Id"); resp.StatusCode != http.StatusOK || s.id == "" {
		t.Fatalf("initialize: %s %s", resp.Status, body)
	}
	if resp, body := s.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %s %s", resp.Status, body)
	}
	return s
}

// post sends body in the session (with its ID once it has one) and
// returns the response and its body.
func (s *rawSession) post(body string) (*http.Response, string) {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, shared.base+"/mcp", strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if s.id != "" {
		req.Header.Set("Mcp-Session-Id", s.id)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return resp, string(b)
}

// TestDirectCall: a plain tools/call over HTTP, which /mcp answers
// itself (the direct path), gets the answer the SDK gives to the same
// call with _meta (which the direct path leaves to it): results, tool
// errors and the policy's refusals alike, with the same content type.
func TestDirectCall(t *testing.T) {
	t.Parallel()
	s := openRaw(t, shared.token, "keel-test-direct")
	for _, tt := range []struct{ name, params string }{
		{"result", `"name":"wordcount","arguments":{"text":"one two"}`},
		{"no arguments", `"name":"wordcount"`},
		{"invalid input", `"name":"wordcount","arguments":{"text":3}`},
		{"permission denied", `"name":"readfile","arguments":{"path":"x"}`},
		{"policy denied", `"name":"stamp","arguments":{"note":"forbidden"}`},
		{"not elicitable", `"name":"stamp","arguments":{"note":"yes"}`},
		{"unknown tool", `"name":"nosuchtool","arguments":{}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			direct, dbody := s.post(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{` + tt.params + `}}`)
			viaSDK, sbody := s.post(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{` + tt.params + `,"_meta":{}}}`)
			var got, want any
			if err := json.Unmarshal([]byte(dbody), &got); err != nil {
				t.Fatalf("direct answer %s %q: %v", direct.Status, dbody, err)
			}
			if err := json.Unmarshal([]byte(sbody), &want); err != nil {
				t.Fatalf("the SDK's answer %s %q: %v", viaSDK.Status, sbody, err)
			}
			if diff := cmp.Diff(want, got); diff != "" || direct.StatusCode != viaSDK.StatusCode {
				t.Errorf("tools/call {%s}: direct answer differs from the SDK's (-sdk +direct):\n%s\nstatus %d, SDK's %d", tt.params, diff, direct.StatusCode, viaSDK.StatusCode)
			}
			if ct := direct.Header.Get("Content-Type"); ct != viaSDK.Header.Get("Content-Type") {
				t.Errorf("Content-Type = %q, the SDK's %q", ct, viaSDK.Header.Get("Content-Type"))
			}
		})
	}
}

// TestDirectCallSessions: the direct path answers only in a live
// session, for the credential that opened it: a session ended with
// DELETE is not found (404), another credential's is refused (403), and
// a token without the run scope gets the scope's error.
func TestDirectCallSessions(t *testing.T) {
	t.Parallel()
	call := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"wordcount","arguments":{"text":"a"}}}`
	tokens := map[string]string{}
	for _, scope := range []string{keel.ScopeRead, keel.ScopeRun} {
		res, err := client.Do(context.Background(), shared.c, client.TokenCreate, protocol.TokenCreateParams{Name: "direct-" + scope, Scopes: []string{scope}})
		if err != nil {
			t.Fatal(err)
		}
		tokens[scope] = res.Token
	}

	s := openRaw(t, shared.token, "keel-test-direct-sessions")
	if resp, body := s.post(call); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"structuredContent"`) {
		t.Fatalf("tools/call = %s %s, want a result", resp.Status, body)
	}
	other := &rawSession{t: t, token: tokens[keel.ScopeRun], id: s.id}
	if resp, body := other.post(call); resp.StatusCode != http.StatusForbidden {
		t.Errorf("tools/call in another credential's session = %s %s, want 403", resp.Status, body)
	}
	read := openRaw(t, tokens[keel.ScopeRead], "keel-test-direct-read")
	if resp, body := read.post(call); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"code":-32050`) {
		t.Errorf("tools/call with a read-only token = %s %s, want the JSON-RPC error -32050", resp.Status, body)
	}

	req, err := http.NewRequest(http.MethodDelete, shared.base+"/mcp", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+shared.token)
	req.Header.Set("Mcp-Session-Id", s.id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE = %s, want 204", resp.Status)
	}
	if resp, body := s.post(call); resp.StatusCode != http.StatusNotFound {
		t.Errorf("tools/call after DELETE = %s %s, want 404", resp.Status, body)
	}
}
