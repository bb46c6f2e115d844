package ipc_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

func TestNewServerRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  ipc.Config
	}{
		{"no token", ipc.Config{}},
		{"origin with path", ipc.Config{Token: "t", AllowedOrigins: []string{"http://localhost:5173/app"}}},
		{"origin without scheme", ipc.Config{Token: "t", AllowedOrigins: []string{"localhost:5173"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ipc.NewServer(ipctest.Services(ipctest.New()), tt.cfg); err == nil {
				t.Errorf("NewServer(%+v) = nil error, want an error", tt.cfg)
			}
		})
	}
}

func TestHandshakeSecurity(t *testing.T) {
	const allowed = "http://localhost:5173"
	ts := startServer(t, ipctest.New(), ipc.Config{AllowedOrigins: []string{allowed}})
	port := strconv.Itoa(ts.port)
	browser := []string{protocol.Subprotocol, protocol.TokenSubprotocolPrefix + testToken}

	tests := []struct {
		name       string
		opts       dialOpts
		wantStatus int // 0: the upgrade succeeds
	}{
		{"bearer token", dialOpts{token: testToken, subprotocols: []string{protocol.Subprotocol}}, 0},
		{"bearer token without subprotocol", dialOpts{token: testToken}, 0},
		{"no token", dialOpts{subprotocols: []string{protocol.Subprotocol}}, http.StatusUnauthorized},
		{"wrong token", dialOpts{token: testToken + "x"}, http.StatusUnauthorized},
		{"token prefix", dialOpts{token: testToken[:5]}, http.StatusUnauthorized},
		{"browser subprotocol token", dialOpts{subprotocols: browser, origin: allowed}, 0},
		{"browser wrong subprotocol token", dialOpts{subprotocols: []string{protocol.Subprotocol, protocol.TokenSubprotocolPrefix + "nope"}, origin: allowed}, http.StatusUnauthorized},
		{"foreign origin", dialOpts{token: testToken, origin: "http://evil.example"}, http.StatusForbidden},
		{"foreign origin with browser token", dialOpts{subprotocols: browser, origin: "http://evil.example:5173"}, http.StatusForbidden},
		{"allowed origin, other port", dialOpts{token: testToken, origin: "http://localhost:5174"}, http.StatusForbidden},
		{"allowed origin, other scheme", dialOpts{token: testToken, origin: "https://localhost:5173"}, http.StatusForbidden},
		{"null origin", dialOpts{token: testToken, origin: "null"}, http.StatusForbidden},
		{"allowed origin with bearer", dialOpts{token: testToken, origin: allowed}, 0},
		{"host localhost", dialOpts{token: testToken, host: "localhost:" + port}, 0},
		{"host ::1", dialOpts{token: testToken, host: "[::1]:" + port}, 0},
		{"foreign host", dialOpts{token: testToken, host: "evil.example:" + port}, http.StatusForbidden},
		{"loopback host, other port", dialOpts{token: testToken, host: "127.0.0.1:" + strconv.Itoa(ts.port+1)}, http.StatusForbidden},
		{"host without port", dialOpts{token: testToken, host: "127.0.0.1"}, http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws, status, err := dialRaw(t, ts.url, tt.opts)
			if tt.wantStatus == 0 {
				if err != nil {
					t.Fatalf("dial: status %d, %v; want an upgrade", status, err)
				}
				if got := ws.Subprotocol(); len(tt.opts.subprotocols) > 0 && got != protocol.Subprotocol {
					t.Errorf("Subprotocol() = %q, want %q", got, protocol.Subprotocol)
				}
				c := &tclient{t: t, ws: ws}
				c.callOK(protocol.MethodInitialize, nil, nil)
				return
			}
			if err == nil {
				t.Fatalf("dial succeeded, want HTTP %d", tt.wantStatus)
			}
			if status != tt.wantStatus {
				t.Errorf("dial status = %d (%v), want %d", status, err, tt.wantStatus)
			}
		})
	}
}

// TestHandshakeResponses checks the plain HTTP replies: the status, a
// short text body, and that the token is never echoed.
func TestHandshakeResponses(t *testing.T) {
	ts := startServer(t, ipctest.New(), ipc.Config{})
	base := "http://127.0.0.1:" + strconv.Itoa(ts.port)
	tests := []struct {
		name       string
		path       string
		header     map[string]string
		wantStatus int
		wantBody   string
	}{
		{"other path", "/", map[string]string{"Authorization": "Bearer " + testToken}, http.StatusNotFound, "not found"},
		{"no token", protocol.Path, nil, http.StatusUnauthorized, "unauthorized"},
		{"foreign origin", protocol.Path, map[string]string{"Origin": "http://evil.example"}, http.StatusForbidden, "Origin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			req, err := http.NewRequest(http.MethodGet, base+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "websocket")
			req.Header.Set("Sec-WebSocket-Version", "13")
			req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
			req.Header.Set("Sec-WebSocket-Protocol", protocol.Subprotocol+", "+protocol.TokenSubprotocolPrefix+"offered-Zq9")
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.wantStatus || !strings.Contains(string(body), tt.wantBody) {
				t.Errorf("GET %s = %d %q, want %d containing %q", tt.path, resp.StatusCode, body, tt.wantStatus, tt.wantBody)
			}
			if strings.Contains(string(body), "offered-Zq9") || strings.Contains(resp.Header.Get("Sec-WebSocket-Protocol"), "token") {
				t.Errorf("response echoes the offered token: %q %v", body, resp.Header)
			}
		})
	}
}

// TestBrowserTokenNotEchoed checks that the server selects keel.v1 and
// never the token subprotocol.
func TestBrowserTokenNotEchoed(t *testing.T) {
	ts := startServer(t, ipctest.New(), ipc.Config{})
	// Token first: a server that picked the first offered protocol it
	// recognises would echo the token.
	ws, status, err := dialRaw(t, ts.url, dialOpts{subprotocols: []string{protocol.TokenSubprotocolPrefix + testToken, protocol.Subprotocol}})
	if err != nil {
		t.Fatalf("dial: status %d: %v", status, err)
	}
	if got := ws.Subprotocol(); got != protocol.Subprotocol {
		t.Errorf("Subprotocol() = %q, want %q", got, protocol.Subprotocol)
	}
	ws.Close(websocket.StatusNormalClosure, "")
}

func TestRunTwice(t *testing.T) {
	s, err := ipc.NewServer(ipctest.Services(ipctest.New()), ipc.Config{Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ln1 := listen(t)
	if err := s.Run(ctx, ln1); err != nil {
		t.Fatalf("first Run = %v, want nil", err)
	}
	ln2 := listen(t)
	defer ln2.Close()
	if err := s.Run(context.Background(), ln2); err == nil {
		t.Errorf("second Run = nil, want an error")
	}
}

func TestURL(t *testing.T) {
	s, err := ipc.NewServer(ipctest.Services(ipctest.New()), ipc.Config{Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	defer ln.Close()
	want := "ws://127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port) + "/v1/ws"
	if got := s.URL(ln); got != want {
		t.Errorf("URL = %q, want %q", got, want)
	}
}

func TestShutdownClosesClients(t *testing.T) {
	f := ipctest.New()
	ts := startServer(t, f, ipc.Config{})
	c := dial(t, ts)
	c.callOK(protocol.MethodInitialize, nil, nil)

	stopped := make(chan error, 1)
	go func() { stopped <- ts.stop() }()
	_, err := c.tryRead(10 * time.Second)
	if got := websocket.CloseStatus(err); got != websocket.StatusGoingAway {
		t.Errorf("read after shutdown: %v (status %d), want close status %d", err, got, websocket.StatusGoingAway)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
	if n := f.Subscribers(); n != 0 {
		t.Errorf("after Run returned, backend has %d subscribers, want 0", n)
	}
}

// TestShutdownUnresponsiveClient checks that Run returns even when a
// client never answers the close handshake.
func TestShutdownUnresponsiveClient(t *testing.T) {
	ts := startServer(t, ipctest.New(), ipc.Config{})
	c := dial(t, ts)
	c.callOK(protocol.MethodInitialize, nil, nil)
	// c never reads again, so it never answers the close frame.
	start := time.Now()
	if err := ts.stop(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("Run took %v to return, want it bounded by the shutdown grace", d)
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// TestRunWaitsForCalls checks that Run returns only after the Backend
// calls in flight have returned.
func TestRunWaitsForCalls(t *testing.T) {
	f := ipctest.New()
	entered := make(chan struct{})
	var returned atomic.Bool
	f.OnCallTool = func(ctx context.Context, _ string, _ json.RawMessage) (json.RawMessage, error) {
		close(entered)
		<-ctx.Done()
		time.Sleep(300 * time.Millisecond) // a slow clean-up
		returned.Store(true)
		return nil, ctx.Err()
	}
	ts := startServer(t, f, ipc.Config{})
	c := dial(t, ts)
	c.send(protocol.MethodToolsCall, protocol.ToolsCallParams{Name: "slow"})
	<-entered
	go func() { // answer the close handshake
		for {
			if _, err := c.tryRead(10 * time.Second); err != nil {
				return
			}
		}
	}()
	if err := ts.stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if !returned.Load() {
		t.Error("Run returned while CallTool was still running")
	}
}
