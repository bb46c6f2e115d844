package cli_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestOpen runs `keel open --print` against a real daemon and follows
// the link as a browser would: it logs in once, the session cookie opens
// the protocol's WebSocket from the daemon's own origin, and the link
// does not work twice.
func TestOpen(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemon.Config{}, scripted.New(nil), map[string]string{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stdout, stderr, code := d.keel(ctx, "open", "--print")
	if code != 0 {
		t.Fatalf("keel open --print = %d, stderr %q", code, stderr)
	}
	link := strings.TrimSpace(stdout)
	info, err := client.ReadDaemonInfo(d.dir)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := url.Parse(info.URL)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(link)
	if err != nil || u.Scheme != "http" || u.Host != ws.Host || u.Path != protocol.LoginPath || u.Query().Get("code") == "" {
		t.Fatalf("keel open printed %q, want http://%s/login?code=…", stdout, ws.Host)
	}
	if !strings.Contains(stderr, "once") {
		t.Errorf("keel open stderr = %q, want a note that the link works once", stderr)
	}

	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(link)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Fatalf("GET the link = %d with cookies %v, want 303 and a session cookie", resp.StatusCode, resp.Cookies())
	}
	ck := resp.Cookies()[0]

	// The page's WebSocket: the cookie and the daemon's own origin.
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	conn, hresp, err := websocket.Dial(dctx, info.URL, &websocket.DialOptions{
		HTTPHeader:   http.Header{"Origin": {"http://" + ws.Host}, "Cookie": {ck.Name + "=" + ck.Value}},
		Subprotocols: []string{protocol.Subprotocol},
	})
	if err != nil {
		status := 0
		if hresp != nil {
			status = hresp.StatusCode
		}
		t.Fatalf("dial with the session cookie: %d %v", status, err)
	}
	defer conn.CloseNow()
	req := `{"jsonrpc":"2.0","id":1,"method":"initialize"}`
	if err := conn.Write(dctx, websocket.MessageText, []byte(req)); err != nil {
		t.Fatal(err)
	}
	_, frame, err := conn.Read(dctx)
	if err != nil || !strings.Contains(string(frame), `"server":"keel"`) {
		t.Errorf("initialize over the session = %s, %v", frame, err)
	}
	conn.Close(websocket.StatusNormalClosure, "")

	resp, err = noRedirect.Get(link)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET the link again = %d, want 401", resp.StatusCode)
	}
}

// TestOpenDaemonDown: without a daemon, keel open says so and fails.
func TestOpenDaemonDown(t *testing.T) {
	t.Parallel()
	d := &testDaemon{dir: t.TempDir()}
	_, stderr, code := d.keel(context.Background(), "open", "--print")
	if code == 0 || !strings.Contains(stderr, client.ErrDaemonNotRunning.Error()) {
		t.Errorf("keel open without a daemon = %d %q, want a failure saying the daemon is not running", code, stderr)
	}
}
