package acp_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel/bridges/acp"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestBadInput sends keel acp what a broken or hostile client might:
// each gets its JSON-RPC error with the right id, and the agent goes on
// (a good request after them is answered); the end of its stdin ends it
// cleanly.
func TestBadInput(t *testing.T) {
	t.Parallel()
	dir := newDataDir(t)
	startDaemon(t, dir, scripted.New(nil))
	a := startAgent(t, dir)
	huge := `{"jsonrpc":"2.0","id":99,"method":"session/new","params":{"cwd":"` + strings.Repeat("a", acp.DefaultMaxLineBytes) + `"}}`
	for _, tt := range []struct {
		name, line string
		id         string
		code       int
	}{
		{"malformed JSON", `{"jsonrpc":"2.0","id":1,"method":`, "null", -32700},
		{"a batch", `[{"jsonrpc":"2.0","id":2,"method":"initialize"}]`, "null", -32600},
		{"not 2.0", `{"jsonrpc":"1.0","id":3,"method":"initialize","params":{"protocolVersion":1}}`, "3", -32600},
		{"no method", `{"jsonrpc":"2.0","id":4}`, "4", -32600},
		{"unknown method", `{"jsonrpc":"2.0","id":5,"method":"session/explode","params":{}}`, "5", -32601},
		{"params of the wrong type", `{"jsonrpc":"2.0","id":"six","method":"session/new","params":{"cwd":6}}`, `"six"`, -32602},
		{"a relative cwd", `{"jsonrpc":"2.0","id":7,"method":"session/new","params":{"cwd":"here","mcpServers":[]}}`, "7", -32602},
		{"an unknown session", `{"jsonrpc":"2.0","id":8,"method":"session/prompt","params":{"sessionId":"acp_nope","prompt":[{"type":"text","text":"hi"}]}}`, "8", -32002},
		{"a session nobody made, loaded", `{"jsonrpc":"2.0","id":9,"method":"session/load","params":{"sessionId":"acp_nope","cwd":"/","mcpServers":[]}}`, "9", -32002},
		{"a good session/new among them", `{"jsonrpc":"2.0","id":10,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}`, "10", 0},
		{"a line over the limit", huge, "null", -32600},
	} {
		a.send(t, tt.line)
		r := a.next(t)
		switch {
		case tt.code == 0:
			if r.Error != nil {
				t.Errorf("%s: %s, want a result", tt.name, r)
			}
			continue
		case r.Error == nil || r.Error.Code != tt.code || string(r.ID) != tt.id:
			t.Errorf("%s: got %s, want error %d with id %s", tt.name, r, tt.code, tt.id)
		}
	}
	// Notifications, even unknown or broken ones, get no answer: the
	// next message is the answer to the request after them.
	a.send(t, `{"jsonrpc":"2.0","method":"session/whatever","params":{}}`)
	a.send(t, `{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":42}}`)
	a.send(t, `{"jsonrpc":"2.0","id":11,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`)
	if r := a.next(t); r.Error != nil || string(r.ID) != "11" || !strings.Contains(string(r.Result), `"loadSession":true`) {
		t.Errorf("initialize after bad input = %s", r)
	}
	// EOF: the agent ends, successfully.
	a.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- a.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("keel acp after EOF: %v (stderr %s)", err, a.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Error("keel acp did not end within 30 s of EOF")
	}
}

// TestNoDaemon: without a daemon keel acp says so, and how to start one,
// and exits 1.
func TestNoDaemon(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "acp", "--data-dir", dir)
	cmd.Env = append(os.Environ(), cliEnv+"=1")
	cmd.Stdin = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}` + "\n")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "not running") || !strings.Contains(string(out), "keel daemon") {
		t.Errorf("keel acp without a daemon = %v, %q; want exit 1 saying it is not running and how to start it", err, out)
	}
}
