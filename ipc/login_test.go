package ipc_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// consoleServer is a server with a console login, a fake clock, a
// guarded route and its log in a buffer.
type consoleServer struct {
	*testServer
	clock *fakeClock
	log   *syncBuffer
	base  string // http://127.0.0.1:PORT
}

func startConsoleServer(t *testing.T, cfg ipc.Config) *consoleServer {
	t.Helper()
	cs := &consoleServer{clock: newFakeClock(), log: &syncBuffer{}}
	cfg.Now = cs.clock.Now
	cfg.Logger = slog.New(slog.NewTextHandler(cs.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Routes = append(cfg.Routes, ipc.Route{Pattern: "GET /data", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "data")
	})})
	cs.testServer = startServer(t, ipctest.New(), cfg)
	cs.base = "http://127.0.0.1:" + strconv.Itoa(cs.port)
	return cs
}

// loginURL asks the server for a login link over the protocol, as
// `keel open` does.
func (cs *consoleServer) loginURL(t *testing.T) string {
	t.Helper()
	c := dial(t, cs.testServer)
	var res protocol.ConsoleLoginResult
	c.callOK(protocol.MethodConsoleLogin, nil, &res)
	return res.URL
}

// get does one request without following redirects.
func get(t *testing.T, method, u string, header http.Header) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// getBody is get that also returns the body.
func getBody(t *testing.T, method, u string, header http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

// login redeems a fresh login link and returns the session cookie.
func (cs *consoleServer) login(t *testing.T) *http.Cookie {
	t.Helper()
	resp := get(t, http.MethodGet, cs.loginURL(t), nil)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("GET login URL = %d, want 303", resp.StatusCode)
	}
	for _, c := range resp.Cookies() {
		if strings.HasPrefix(c.Name, protocol.SessionCookiePrefix) {
			return c
		}
	}
	t.Fatalf("login set no session cookie: %v", resp.Header.Values("Set-Cookie"))
	return nil
}

func cookieHeader(c *http.Cookie, kv ...string) http.Header {
	h := http.Header{"Cookie": {c.Name + "=" + c.Value}}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// TestLoginCode follows `keel open`'s link over real loopback HTTP: the
// code is long and random, works once, redirects to "/" with no code in
// Location, sets a session cookie with the right flags and never
// reaches the log.
func TestLoginCode(t *testing.T) {
	t.Parallel()
	cs := startConsoleServer(t, ipc.Config{})
	link := cs.loginURL(t)
	u, err := url.Parse(link)
	if err != nil {
		t.Fatal(err)
	}
	code := u.Query().Get("code")
	if u.Scheme != "http" || u.Host != "127.0.0.1:"+strconv.Itoa(cs.port) || u.Path != protocol.LoginPath || len(code) < 22 {
		t.Fatalf("console.login URL = %q, want http://127.0.0.1:%d/login?code= and a code of at least 128 bits", link, cs.port)
	}
	if other := cs.loginURL(t); other == link {
		t.Errorf("two console.login calls gave the same URL %q", link)
	}

	// A HEAD (link preview) does not use the code up.
	if resp := get(t, http.MethodHead, link, nil); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("HEAD login URL = %d, want 405", resp.StatusCode)
	}

	resp := get(t, http.MethodGet, link, nil)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("GET login URL = %d, want 303", resp.StatusCode)
	}
	if loc := resp.Header.Get("Location"); loc != "/" {
		t.Errorf("Location = %q, want \"/\"", loc)
	}
	for k, want := range map[string]string{"Referrer-Policy": "no-referrer", "Cache-Control": "no-store"} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	cookies := resp.Cookies()
	if len(cookies) != 1 {
		t.Fatalf("login set %d cookies (%v), want 1", len(cookies), resp.Header.Values("Set-Cookie"))
	}
	ck := cookies[0]
	if want := protocol.SessionCookiePrefix + strconv.Itoa(cs.port); ck.Name != want {
		t.Errorf("cookie name = %q, want %q", ck.Name, want)
	}
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || ck.Domain != "" || len(ck.Value) < 22 {
		t.Errorf("cookie = %q, want HttpOnly, SameSite=Strict, Path=/, no Domain, a long random value", resp.Header.Get("Set-Cookie"))
	}
	if ck.Value == code {
		t.Errorf("the session ID is the login code")
	}
	if strings.Contains(strings.Join(resp.Header.Values("Set-Cookie"), " "), code) {
		t.Errorf("Set-Cookie holds the code")
	}

	// Single use.
	resp, body := getBody(t, http.MethodGet, link, nil)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "keel open") || len(resp.Cookies()) != 0 {
		t.Errorf("GET used login URL = %d %q (cookies %v), want 401 saying to run keel open, no cookie", resp.StatusCode, body, resp.Cookies())
	}
	if got := resp.Header.Get("Referrer-Policy"); got != "no-referrer" {
		t.Errorf("refused login: Referrer-Policy = %q, want no-referrer", got)
	}

	// Wrong, missing and huge codes.
	for _, q := range []string{"?code=" + code + "x", "?code=" + code[:len(code)-1], "", "?code=", "?code=" + strings.Repeat("a", 10000)} {
		if resp := get(t, http.MethodGet, cs.base+protocol.LoginPath+q, nil); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET /login%.40s = %d, want 401", q, resp.StatusCode)
		}
	}

	if log := cs.log.String(); strings.Contains(log, code) || strings.Contains(log, ck.Value) {
		t.Errorf("the log holds the login code or the session ID:\n%s", log)
	}
	if !strings.Contains(cs.log.String(), "login refused") {
		t.Errorf("the log does not mention the refused logins:\n%s", cs.log.String())
	}
}

// TestLoginCodeExpires checks the code's lifetime with the injected
// clock: it works until its TTL ends, not after.
func TestLoginCodeExpires(t *testing.T) {
	t.Parallel()
	cs := startConsoleServer(t, ipc.Config{LoginCodeTTL: time.Minute})
	early, late := cs.loginURL(t), cs.loginURL(t)
	cs.clock.advance(time.Minute - time.Second)
	if resp := get(t, http.MethodGet, early, nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("GET login URL after 59s = %d, want 303", resp.StatusCode)
	}
	cs.clock.advance(time.Second)
	if resp := get(t, http.MethodGet, late, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET login URL after 60s = %d, want 401", resp.StatusCode)
	}
}

// TestLoginCodesBounded: at most 16 codes are outstanding; a new one
// pushes out the oldest, and the newest always works.
func TestLoginCodesBounded(t *testing.T) {
	t.Parallel()
	cs := startConsoleServer(t, ipc.Config{})
	c := dial(t, cs.testServer)
	var links []string
	for range 17 {
		var res protocol.ConsoleLoginResult
		c.callOK(protocol.MethodConsoleLogin, nil, &res)
		links = append(links, res.URL)
		cs.clock.advance(time.Millisecond)
	}
	if resp := get(t, http.MethodGet, links[0], nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET the oldest of 17 login URLs = %d, want 401", resp.StatusCode)
	}
	if resp := get(t, http.MethodGet, links[16], nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("GET the newest of 17 login URLs = %d, want 303", resp.StatusCode)
	}
}

// TestSessionCookieOrigin checks over a real WebSocket and real HTTP
// that the session cookie counts only from the daemon's own origin:
// another origin (another local port, a configured one, a foreign one)
// or no Origin at all on a WebSocket does not get in with it.
func TestSessionCookieOrigin(t *testing.T) {
	t.Parallel()
	const allowed = "http://localhost:5173"
	cs := startConsoleServer(t, ipc.Config{AllowedOrigins: []string{allowed}})
	ck := cs.login(t)
	port := strconv.Itoa(cs.port)
	own := cs.base
	otherPort := "http://127.0.0.1:" + strconv.Itoa(cs.port+1)

	ws := []struct {
		name   string
		origin string
		host   string
		want   int // 0: upgraded
	}{
		{"own origin", own, "", 0},
		{"own origin, localhost", "http://localhost:" + port, "localhost:" + port, 0},
		{"own origin in capitals", "HTTP://127.0.0.1:" + port, "", 0},
		{"origin of another host name", "http://localhost:" + port, "", http.StatusForbidden},
		{"foreign origin", "http://evil.example", "", http.StatusForbidden},
		{"another local port", otherPort, "", http.StatusForbidden},
		{"https own host", "https://127.0.0.1:" + port, "", http.StatusForbidden},
		{"null origin", "null", "", http.StatusForbidden},
		{"allowed origin needs the token", allowed, "", http.StatusUnauthorized},
		{"no origin", "", "", http.StatusUnauthorized},
	}
	for _, tt := range ws {
		t.Run("ws/"+tt.name, func(t *testing.T) {
			conn, status, err := dialRaw(t, cs.url, dialOpts{
				subprotocols: []string{protocol.Subprotocol}, origin: tt.origin, host: tt.host,
				header: cookieHeader(ck),
			})
			if tt.want == 0 {
				if err != nil {
					t.Fatalf("dial with cookie from %s: status %d, %v; want an upgrade", tt.origin, status, err)
				}
				c := &tclient{t: t, ws: conn}
				var res protocol.InitializeResult
				c.callOK(protocol.MethodInitialize, nil, &res)
				if res.Server != "keel" {
					t.Errorf("initialize over a session = %+v", res)
				}
				return
			}
			if err == nil || status != tt.want {
				t.Errorf("dial with cookie from %q = status %d (%v), want %d", tt.origin, status, err, tt.want)
			}
		})
	}

	routes := []struct {
		name   string
		header http.Header
		want   int
	}{
		{"own origin", cookieHeader(ck, "Origin", own), http.StatusOK},
		{"same-origin fetch, no Origin", cookieHeader(ck, "Sec-Fetch-Site", "same-origin"), http.StatusOK},
		{"same-site (another port), no Origin", cookieHeader(ck, "Sec-Fetch-Site", "same-site"), http.StatusUnauthorized},
		{"cross-site, no Origin", cookieHeader(ck, "Sec-Fetch-Site", "cross-site"), http.StatusUnauthorized},
		{"no Origin, no fetch metadata", cookieHeader(ck), http.StatusUnauthorized},
		{"foreign origin", cookieHeader(ck, "Origin", "http://evil.example"), http.StatusForbidden},
		{"another local port", cookieHeader(ck, "Origin", otherPort), http.StatusForbidden},
		{"own origin, wrong cookie", cookieHeader(&http.Cookie{Name: ck.Name, Value: ck.Value + "x"}, "Origin", own), http.StatusUnauthorized},
		{"own origin, another daemon's cookie name", cookieHeader(&http.Cookie{Name: protocol.SessionCookiePrefix + "1", Value: ck.Value}, "Origin", own), http.StatusUnauthorized},
	}
	for _, tt := range routes {
		t.Run("route/"+tt.name, func(t *testing.T) {
			if resp := get(t, http.MethodGet, cs.base+"/data", tt.header); resp.StatusCode != tt.want {
				t.Errorf("GET /data %v = %d, want %d", tt.header, resp.StatusCode, tt.want)
			}
		})
	}
}

// TestSessionExpiry checks the idle and absolute lifetimes of a session
// with the injected clock.
func TestSessionExpiry(t *testing.T) {
	t.Parallel()
	cs := startConsoleServer(t, ipc.Config{SessionIdleTimeout: time.Hour, SessionMaxAge: 3 * time.Hour})
	ok := func(ck *http.Cookie) int {
		return get(t, http.MethodGet, cs.base+"/data", cookieHeader(ck, "Origin", cs.base)).StatusCode
	}
	idle := cs.login(t)
	cs.clock.advance(time.Hour - time.Second)
	if got := ok(idle); got != http.StatusOK {
		t.Fatalf("session used after 59m59s = %d, want 200", got)
	}
	// Use restarted the idle timeout.
	cs.clock.advance(time.Hour - time.Second)
	if got := ok(idle); got != http.StatusOK {
		t.Fatalf("session used 59m59s after its last use = %d, want 200", got)
	}
	cs.clock.advance(time.Hour)
	if got := ok(idle); got != http.StatusUnauthorized {
		t.Errorf("session idle for an hour = %d, want 401", got)
	}

	busy := cs.login(t)
	for range 5 {
		cs.clock.advance(30 * time.Minute)
		if got := ok(busy); got != http.StatusOK {
			t.Fatalf("session in use = %d, want 200", got)
		}
	}
	cs.clock.advance(30 * time.Minute) // 3h after login
	if got := ok(busy); got != http.StatusUnauthorized {
		t.Errorf("session 3h after login, used every 30m = %d, want 401", got)
	}
}

// TestStatusEndpoint checks what a page learns from GET /v1/status: 200
// with a good token or session, 401 without, 403 for a refused origin,
// which may read only that keel refuses it.
func TestStatusEndpoint(t *testing.T) {
	t.Parallel()
	const allowed = "http://localhost:5173"
	cs := startConsoleServer(t, ipc.Config{AllowedOrigins: []string{allowed}, Version: "1.2.3"})
	ck := cs.login(t)
	bearer := http.Header{"Authorization": {"Bearer " + testToken}}
	tests := []struct {
		name     string
		header   http.Header
		want     int
		wantBody protocol.Status
		wantACAO string
	}{
		{"no credentials", nil, http.StatusUnauthorized,
			protocol.Status{Daemon: "keel", Version: "1.2.3", Protocol: protocol.Version, Reason: protocol.ReasonLoginRequired}, ""},
		{"token", bearer, http.StatusOK,
			protocol.Status{Daemon: "keel", Version: "1.2.3", Protocol: protocol.Version, Authenticated: true, Via: "token", Scopes: keel.Scopes}, ""},
		{"session, own page", cookieHeader(ck, "Sec-Fetch-Site", "same-origin"), http.StatusOK,
			protocol.Status{Daemon: "keel", Version: "1.2.3", Protocol: protocol.Version, Authenticated: true, Via: "session", Scopes: []string{"read", "run", "approve", "tools", "knowledge"}}, ""},
		{"session from another port", cookieHeader(ck, "Sec-Fetch-Site", "same-site"), http.StatusUnauthorized,
			protocol.Status{Daemon: "keel", Version: "1.2.3", Protocol: protocol.Version, Reason: protocol.ReasonLoginRequired}, ""},
		{"allowed origin with token", http.Header{"Authorization": {"Bearer " + testToken}, "Origin": {allowed}}, http.StatusOK,
			protocol.Status{Daemon: "keel", Version: "1.2.3", Protocol: protocol.Version, Authenticated: true, Via: "token", Scopes: keel.Scopes}, allowed},
		{"refused origin with token", http.Header{"Authorization": {"Bearer " + testToken}, "Origin": {"http://evil.example"}}, http.StatusForbidden,
			protocol.Status{Daemon: "keel", Reason: protocol.ReasonOriginRefused}, "http://evil.example"},
		{"refused origin with cookie", cookieHeader(ck, "Origin", "http://evil.example"), http.StatusForbidden,
			protocol.Status{Daemon: "keel", Reason: protocol.ReasonOriginRefused}, "http://evil.example"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := getBody(t, http.MethodGet, cs.base+protocol.StatusPath, tt.header)
			var got protocol.Status
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatalf("GET %s: body %q: %v", protocol.StatusPath, body, err)
			}
			got.Message = ""
			if resp.StatusCode != tt.want || !cmp.Equal(got, tt.wantBody) {
				t.Errorf("GET %s = %d %+v, want %d %+v", protocol.StatusPath, resp.StatusCode, got, tt.want, tt.wantBody)
			}
			if acao := resp.Header.Get("Access-Control-Allow-Origin"); acao != tt.wantACAO {
				t.Errorf("Access-Control-Allow-Origin = %q, want %q", acao, tt.wantACAO)
			}
			if resp.Header.Get("Access-Control-Allow-Credentials") != "" {
				t.Errorf("Access-Control-Allow-Credentials is set: a foreign page could read with the cookie")
			}
		})
	}

	// A preflight for the Authorization header.
	resp := get(t, http.MethodOptions, cs.base+protocol.StatusPath, http.Header{
		"Origin": {allowed}, "Access-Control-Request-Method": {"GET"}, "Access-Control-Request-Headers": {"authorization"}})
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != allowed ||
		!strings.Contains(strings.ToLower(resp.Header.Get("Access-Control-Allow-Headers")), "authorization") {
		t.Errorf("preflight = %d %v, want 204 allowing %s and Authorization", resp.StatusCode, resp.Header, allowed)
	}
}
