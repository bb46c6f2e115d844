package cli_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestToken creates, lists and revokes a client token against a real
// daemon (real store), and uses it from a VS Code webview's origin over
// the real WebSocket: its scopes hold, and revoking it closes the
// connection.
func TestToken(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemon.Config{}, scripted.New(nil), map[string]string{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	out, errs, code := d.keel(ctx, "token", "create", "--name", "vscode", "--scope", "read,run", "--origin", "vscode-webview://*", "--expires", "30d")
	tok := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(tok, "keel_ct_") || !strings.Contains(errs, "only time") {
		t.Fatalf("keel token create = %d %q %q, want the token on stdout and a warning on stderr", code, out, errs)
	}
	if _, errs, code := d.keel(ctx, "token", "create", "--name", "wide", "--origin", "http://*"); code == 0 || !strings.Contains(errs, "every http page") {
		t.Errorf("keel token create --origin 'http://*' = %d %q, want a refusal saying why", code, errs)
	}
	if _, errs, code := d.keel(ctx, "token", "create", "--name", "vscode"); code == 0 || !strings.Contains(errs, "exists") {
		t.Errorf("keel token create of an existing name = %d %q, want a conflict", code, errs)
	}
	if _, errs, code := d.keel(ctx, "token", "create", "--name", "x", "--expires", "soon"); code != 2 {
		t.Errorf("keel token create --expires soon = %d %q, want a usage error", code, errs)
	}

	info, err := client.ReadDaemonInfo(d.dir)
	if err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	conn, resp, err := websocket.Dial(dctx, info.URL, &websocket.DialOptions{
		HTTPHeader:   http.Header{"Origin": {"vscode-webview://0a1b2c3d"}},
		Subprotocols: []string{protocol.Subprotocol, protocol.TokenSubprotocolPrefix + tok},
	})
	if err != nil {
		t.Fatalf("dial from the webview with the token: %v %v", resp, err)
	}
	defer conn.CloseNow()
	roundTrip := func(frame string) string {
		t.Helper()
		if err := conn.Write(dctx, websocket.MessageText, []byte(frame)); err != nil {
			t.Fatal(err)
		}
		_, got, err := conn.Read(dctx)
		if err != nil {
			t.Fatal(err)
		}
		return string(got)
	}
	if got := roundTrip(`{"jsonrpc":"2.0","id":1,"method":"initialize"}`); !strings.Contains(got, `"scopes":["read","run"]`) {
		t.Errorf("initialize with the token = %s, want scopes read and run", got)
	}
	if got := roundTrip(`{"jsonrpc":"2.0","id":2,"method":"tools.remove","params":{"name":"x"}}`); !strings.Contains(got, `"code":-32004`) || !strings.Contains(got, `"scope":"tools"`) {
		t.Errorf("tools.remove with a read,run token = %s, want -32004 naming the tools scope", got)
	}

	out, _, code = d.keel(ctx, "token", "list")
	if code != 0 || !strings.Contains(out, "vscode") || !strings.Contains(out, "read,run") || !strings.Contains(out, "vscode-webview://*") || strings.Contains(out, tok[8:]) {
		t.Errorf("keel token list = %d\n%s\nwant the token's name, scopes and origin, never the token", code, out)
	}
	// Used (by the dial above) and expiring: no "never" in its row.
	if !strings.Contains(out, "LAST USED") || strings.Contains(out, "never") {
		t.Errorf("keel token list = \n%s\nwant a last use and an expiry", out)
	}

	out, errs, code = d.keel(ctx, "token", "revoke", "vscode")
	if code != 0 || !strings.Contains(out, "closed 1 connection") {
		t.Errorf("keel token revoke = %d %q %q, want one connection closed", code, out, errs)
	}
	_, _, err = conn.Read(dctx)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation {
		t.Errorf("the webview's connection after revoke: %v, want close 1008", err)
	}
	if out, _, _ := d.keel(ctx, "token", "list"); !strings.Contains(out, "no client tokens") {
		t.Errorf("keel token list after revoke = %q", out)
	}
	if _, errs, code := d.keel(ctx, "token", "revoke", "vscode"); code == 0 || !strings.Contains(errs, "vscode") {
		t.Errorf("keel token revoke twice = %d %q, want not found", code, errs)
	}
}
