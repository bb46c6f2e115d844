package ipc_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestLogout ends a console session over real loopback HTTP: a POST
// from another origin, or without one (and no Sec-Fetch-Site:
// same-origin), or a GET, ends nothing; a POST from the daemon's own
// page clears the cookie, closes the WebSocket
// opened with the session (1008 "logged out"), and from then on the old
// cookie opens nothing (status 401, WebSocket refused), while another
// session goes on.
func TestLogout(t *testing.T) {
	t.Parallel()
	cs := startConsoleServer(t, ipc.Config{})
	ck, other := cs.login(t), cs.login(t)
	own := http.Header{"Origin": {cs.base}}
	status := func(ck *http.Cookie) int {
		return get(t, http.MethodGet, cs.base+protocol.StatusPath, cookieHeader(ck, "Origin", cs.base)).StatusCode
	}
	dialSession := func(ck *http.Cookie) (*tclient, int, error) {
		ws, st, err := dialRaw(t, cs.url, dialOpts{subprotocols: []string{protocol.Subprotocol}, origin: cs.base, header: cookieHeader(ck)})
		if err != nil {
			return nil, st, err
		}
		return &tclient{t: t, ws: ws}, st, nil
	}
	c, _, err := dialSession(ck)
	if err != nil {
		t.Fatal(err)
	}
	c.callOK(protocol.MethodInitialize, nil, nil)

	refused := []struct {
		name   string
		method string
		header http.Header
		want   int
	}{
		{"GET", http.MethodGet, cookieHeader(ck, "Origin", cs.base), http.StatusMethodNotAllowed},
		{"another origin", http.MethodPost, cookieHeader(ck, "Origin", "http://127.0.0.1:1"), http.StatusForbidden},
		{"no origin", http.MethodPost, cookieHeader(ck), http.StatusForbidden},
		{"null origin", http.MethodPost, cookieHeader(ck, "Origin", "null"), http.StatusForbidden},
		{"null origin, another port", http.MethodPost, cookieHeader(ck, "Origin", "null", "Sec-Fetch-Site", "same-site"), http.StatusForbidden},
		{"another origin, same-origin fetch", http.MethodPost, cookieHeader(ck, "Origin", "http://127.0.0.1:1", "Sec-Fetch-Site", "same-origin"), http.StatusForbidden},
	}
	for _, tt := range refused {
		if resp := get(t, tt.method, cs.base+protocol.LogoutPath, tt.header); resp.StatusCode != tt.want || len(resp.Cookies()) != 0 {
			t.Errorf("%s %s (%s) = %d, cookies %v; want %d and none", tt.method, protocol.LogoutPath, tt.name, resp.StatusCode, resp.Cookies(), tt.want)
		}
	}
	if st := status(ck); st != http.StatusOK {
		t.Fatalf("after refused logouts the session's status = %d, want 200", st)
	}

	// A form posted from the console (whose Referrer-Policy is
	// no-referrer) carries Origin: null; the browser vouches for it with
	// Sec-Fetch-Site.
	resp := get(t, http.MethodPost, cs.base+protocol.LogoutPath, cookieHeader(ck, "Origin", "null", "Sec-Fetch-Site", "same-origin"))
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Errorf("POST %s = %d to %q, want 303 to /", protocol.LogoutPath, resp.StatusCode, resp.Header.Get("Location"))
	}
	cleared := false
	for _, c := range resp.Cookies() {
		cleared = cleared || (c.Name == ck.Name && c.Value == "" && c.MaxAge < 0)
	}
	if !cleared {
		t.Errorf("logout's Set-Cookie = %v, want %s cleared (Max-Age=0)", resp.Header.Values("Set-Cookie"), ck.Name)
	}
	_, err = c.tryRead(10 * time.Second)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation || ce.Reason != "logged out" {
		t.Errorf("the session's connection after logout: %v, want close 1008 \"logged out\"", err)
	}
	if st := status(ck); st != http.StatusUnauthorized {
		t.Errorf("the old cookie's status = %d, want 401", st)
	}
	if _, st, err := dialSession(ck); err == nil || st != http.StatusUnauthorized {
		t.Errorf("a WebSocket with the old cookie: %d %v, want 401", st, err)
	}
	if st := status(other); st != http.StatusOK {
		t.Errorf("another session after the logout: status %d, want 200", st)
	}
	// Logging out again, or with no session, is no error.
	if resp := get(t, http.MethodPost, cs.base+protocol.LogoutPath, own); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("POST %s without a session = %d, want 303", protocol.LogoutPath, resp.StatusCode)
	}
	if !strings.Contains(cs.log.String(), "ended by logout") {
		t.Errorf("the log does not mention the logout:\n%s", cs.log.String())
	}
}
