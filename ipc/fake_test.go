package ipc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testToken = "s3cret-test-token"

// testServer is a Server running on a real loopback listener.
type testServer struct {
	url  string
	port int
	// stop stops the server and returns Run's error; it is also run at
	// cleanup.
	stop func() error
	// grow, for a startSmallBufServer, restores normal socket buffers.
	grow func()
}

func startServer(t *testing.T, b any, cfg ipc.Config) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return startServerOn(t, b, cfg, ln)
}

// smallBufListener gives every accepted connection a small send
// buffer, so that a client that stops reading blocks the server's
// writer after a few KiB instead of megabytes.
type smallBufListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*net.TCPConn
}

func (l *smallBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(8 << 10)
		l.mu.Lock()
		l.conns = append(l.conns, tc)
		l.mu.Unlock()
	}
	return c, err
}

// grow gives the accepted connections normal buffers again: tiny
// buffers make TCP wait for delayed ACKs, which makes reading slow.
func (l *smallBufListener) grow() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.SetWriteBuffer(4 << 20)
	}
}

// startSmallBufServer is startServer with small socket buffers on the
// server's side; clients that want them too dial with smallReadBuffer.
func startSmallBufServer(t *testing.T, b any, cfg ipc.Config) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl := &smallBufListener{Listener: ln}
	ts := startServerOn(t, b, cfg, sl)
	ts.grow = sl.grow
	return ts
}

func startServerOn(t *testing.T, b any, cfg ipc.Config, ln net.Listener) *testServer {
	t.Helper()
	if cfg.Token == "" {
		cfg.Token = testToken
	}
	svc, ok := b.(ipc.Services)
	if !ok {
		svc = ipctest.Services(b)
	}
	s, err := ipc.NewServer(svc, cfg)
	if err != nil {
		ln.Close()
		t.Fatalf("NewServer: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, ln) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(15 * time.Second):
				runErr = fmt.Errorf("Run did not return 15s after its context was cancelled")
			}
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	})
	return &testServer{url: s.URL(ln), port: ln.Addr().(*net.TCPAddr).Port, stop: stop}
}

// dialOpts are the handshake options of a test dial.
type dialOpts struct {
	token        string // bearer token; "" sends none
	subprotocols []string
	origin       string
	host         string
	header       http.Header // more handshake headers (Cookie, say)
	// smallReadBuffer shrinks the client's socket receive buffer; the
	// connection is stored in tcp, for tclient.grow.
	smallReadBuffer bool
	tcp             **net.TCPConn
}

// dialRaw dials the server and returns the connection or the HTTP
// status of the refused handshake.
func dialRaw(t *testing.T, url string, o dialOpts) (*websocket.Conn, int, error) {
	t.Helper()
	tr := &http.Transport{}
	if o.smallReadBuffer {
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetReadBuffer(8 << 10)
				if o.tcp != nil {
					*o.tcp = tc
				}
			}
			return c, err
		}
	}
	t.Cleanup(tr.CloseIdleConnections)
	h := http.Header{}
	if o.token != "" {
		h.Set("Authorization", "Bearer "+o.token)
	}
	if o.origin != "" {
		h.Set("Origin", o.origin)
	}
	for k, v := range o.header {
		h[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: tr},
		HTTPHeader:   h,
		Host:         o.host,
		Subprotocols: o.subprotocols,
	})
	tr.CloseIdleConnections()
	status := 0
	if resp != nil {
		status = resp.StatusCode
	}
	if err == nil {
		ws.SetReadLimit(64 << 20)
		t.Cleanup(func() { ws.CloseNow() })
	}
	return ws, status, err
}

// wireMsg is any frame the server sends.
type wireMsg struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   *protocol.Error `json:"error"`
}

// tclient is a raw JSON-RPC client for tests: it reads one frame at a
// time, so tests see exactly what the server sent and in which order.
type tclient struct {
	t      *testing.T
	ws     *websocket.Conn
	nextID int
	tcp    *net.TCPConn // set if dialled with smallReadBuffer
}

// grow gives a smallReadBuffer client a normal receive buffer again.
func (c *tclient) grow() {
	if c.tcp != nil {
		c.tcp.SetReadBuffer(4 << 20)
	}
}

func dial(t *testing.T, ts *testServer) *tclient {
	t.Helper()
	return dialWith(t, ts, dialOpts{})
}

// dialWith dials with the test token, keel.v1 and the options of o.
func dialWith(t *testing.T, ts *testServer, o dialOpts) *tclient {
	t.Helper()
	o.token = testToken
	o.subprotocols = []string{protocol.Subprotocol}
	var tcp *net.TCPConn
	o.tcp = &tcp
	ws, status, err := dialRaw(t, ts.url, o)
	if err != nil {
		t.Fatalf("dial: status %d: %v", status, err)
	}
	return &tclient{t: t, ws: ws, tcp: tcp}
}

func (c *tclient) writeRaw(data string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageText, []byte(data)); err != nil {
		c.t.Fatalf("write %.80s: %v", data, err)
	}
}

// send sends a request with a fresh numeric id and returns the id.
func (c *tclient) send(method string, params any) string {
	c.t.Helper()
	c.nextID++
	id := strconv.Itoa(c.nextID)
	req := map[string]any{"jsonrpc": "2.0", "id": c.nextID, "method": method}
	if params != nil {
		req["params"] = params
	}
	data, err := json.Marshal(req)
	if err != nil {
		c.t.Fatal(err)
	}
	c.writeRaw(string(data))
	return id
}

// read returns the next frame, failing the test after readPatience.
func (c *tclient) read() wireMsg {
	c.t.Helper()
	m, err := c.tryRead(readPatience)
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return m
}

// readPatience bounds read's wait for a frame that must come: it only
// bounds a hang, so it is long (5 s failed TestDeltaFloodIsFolded under
// -race on the 2 cores at load 14, the flood's 200 KiB still in flight).
const readPatience = time.Minute

func (c *tclient) tryRead(timeout time.Duration) (wireMsg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, data, err := c.ws.Read(ctx)
	if err != nil {
		return wireMsg{}, err
	}
	var m wireMsg
	if err := json.Unmarshal(data, &m); err != nil {
		return wireMsg{}, fmt.Errorf("frame %.200s: %v", data, err)
	}
	if m.JSONRPC != "2.0" {
		return wireMsg{}, fmt.Errorf("frame %.200s: jsonrpc = %q, want 2.0", data, m.JSONRPC)
	}
	return m, nil
}

// call sends a request and reads the next frame, which must be its
// response.
func (c *tclient) call(method string, params any) wireMsg {
	c.t.Helper()
	id := c.send(method, params)
	m := c.read()
	if string(m.ID) != id || m.Method != "" {
		c.t.Fatalf("%s: got frame id=%s method=%q, want the response with id %s", method, m.ID, m.Method, id)
	}
	return m
}

// callOK is call for a request that must succeed; it decodes the result
// into out.
func (c *tclient) callOK(method string, params, out any) {
	c.t.Helper()
	m := c.call(method, params)
	if m.Error != nil {
		c.t.Fatalf("%s: error %d %q, want success", method, m.Error.Code, m.Error.Message)
	}
	if out != nil {
		if err := json.Unmarshal(m.Result, out); err != nil {
			c.t.Fatalf("%s: decode result %s: %v", method, m.Result, err)
		}
	}
}

// readEvent reads the next frame, which must be a run.event.
func (c *tclient) readEvent() keel.Event {
	c.t.Helper()
	m := c.read()
	if m.Method != protocol.NotifyRunEvent || m.ID != nil {
		c.t.Fatalf("got frame id=%s method=%q error=%v, want a %s notification", m.ID, m.Method, m.Error, protocol.NotifyRunEvent)
	}
	var ev keel.Event
	if err := json.Unmarshal(m.Params, &ev); err != nil {
		c.t.Fatalf("decode event %s: %v", m.Params, err)
	}
	return ev
}
