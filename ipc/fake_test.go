package ipc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/protocol"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testToken = "s3cret-test-token"

// fakeBackend is a hand-written in-memory Backend. Events it emits are
// stored first (if Seq > 0) and then passed to every subscriber, as the
// engine does.
type fakeBackend struct {
	mu      sync.Mutex
	runs    map[keel.RunID]keel.Run
	events  map[keel.RunID][]keel.Event
	started []protocol.RunStartParams
	subs    map[int]func(keel.Event)
	nextSub int

	// err, if set for a method name, is what that method returns.
	err map[string]error
	// eventsHook, if set, runs inside Events: before reading the store
	// with before=true, after with before=false.
	eventsHook func(before bool)
	// callTool, if set, implements CallTool.
	callTool func(ctx context.Context, name string, input json.RawMessage) (json.RawMessage, error)
	// pullModel, if set, implements PullModel; by default a pull
	// succeeds at once.
	pullModel func(ctx context.Context, name string, progress func(protocol.ModelsPullProgress)) error
}

func newFake() *fakeBackend {
	return &fakeBackend{
		runs:   make(map[keel.RunID]keel.Run),
		events: make(map[keel.RunID][]keel.Event),
		subs:   make(map[int]func(keel.Event)),
		err:    make(map[string]error),
	}
}

func (f *fakeBackend) addRun(id keel.RunID, status keel.RunStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runs[id] = keel.Run{ID: id, Goal: "goal of " + string(id), Status: status, MaxSteps: 8}
}

func (f *fakeBackend) failWith(method string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err[method]
}

// emit stores ev if it is persisted, then calls every subscriber.
func (f *fakeBackend) emit(ev keel.Event) {
	f.mu.Lock()
	if ev.Seq > 0 {
		f.events[ev.RunID] = append(f.events[ev.RunID], ev)
		r := f.runs[ev.RunID]
		r.LastSeq = ev.Seq
		f.runs[ev.RunID] = r
	}
	fns := make([]func(keel.Event), 0, len(f.subs))
	for _, fn := range f.subs {
		fns = append(fns, fn)
	}
	f.mu.Unlock()
	for _, fn := range fns {
		fn(ev)
	}
}

// emitSeq emits persisted events from..to of run id.
func (f *fakeBackend) emitSeq(id keel.RunID, from, to int64) {
	for seq := from; seq <= to; seq++ {
		f.emit(event(id, seq))
	}
}

func event(id keel.RunID, seq int64) keel.Event {
	return keel.Event{
		RunID: id,
		Seq:   seq,
		Type:  keel.EventModelResult,
		Time:  time.Unix(1700000000+seq, 0).UTC(),
		Data:  json.RawMessage(`{"step":` + strconv.FormatInt(seq, 10) + `}`),
	}
}

func (f *fakeBackend) subscribers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.subs)
}

func (f *fakeBackend) StartRun(_ context.Context, p protocol.RunStartParams) (keel.Run, error) {
	if err := f.failWith("StartRun"); err != nil {
		return keel.Run{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started = append(f.started, p)
	id := keel.RunID(fmt.Sprintf("run-%d", len(f.started)))
	r := keel.Run{ID: id, Goal: p.Goal, Model: p.Model, MaxSteps: p.MaxSteps, Status: keel.RunQueued}
	f.runs[id] = r
	return r, nil
}

func (f *fakeBackend) CancelRun(_ context.Context, id keel.RunID) (keel.Run, error) {
	if err := f.failWith("CancelRun"); err != nil {
		return keel.Run{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.runs[id]
	if !ok {
		return keel.Run{}, fmt.Errorf("run %q: %w", id, keel.ErrNotFound)
	}
	if r.Status.Terminal() {
		return keel.Run{}, fmt.Errorf("run %q already %s: %w", id, r.Status, keel.ErrConflict)
	}
	r.Status = keel.RunCancelled
	f.runs[id] = r
	return r, nil
}

func (f *fakeBackend) ListRuns(_ context.Context, limit int) ([]keel.Run, error) {
	if err := f.failWith("ListRuns"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var runs []keel.Run
	for _, r := range f.runs {
		if len(runs) == limit {
			break
		}
		runs = append(runs, r)
	}
	return runs, nil
}

func (f *fakeBackend) GetRun(_ context.Context, id keel.RunID) (keel.Run, error) {
	if err := f.failWith("GetRun"); err != nil {
		return keel.Run{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.runs[id]
	if !ok {
		return keel.Run{}, fmt.Errorf("run %q: %w", id, keel.ErrNotFound)
	}
	return r, nil
}

func (f *fakeBackend) Events(_ context.Context, id keel.RunID, afterSeq int64) ([]keel.Event, error) {
	if err := f.failWith("Events"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	hook := f.eventsHook
	f.mu.Unlock()
	if hook != nil {
		hook(true)
	}
	f.mu.Lock()
	var out []keel.Event
	for _, ev := range f.events[id] {
		if ev.Seq > afterSeq {
			out = append(out, ev)
		}
	}
	f.mu.Unlock()
	if hook != nil {
		hook(false)
	}
	return out, nil
}

func (f *fakeBackend) Spans(_ context.Context, id keel.RunID) ([]keel.Span, error) {
	if err := f.failWith("Spans"); err != nil {
		return nil, err
	}
	return []keel.Span{{ID: "span-1", RunID: id, Kind: keel.SpanModelCall, Name: "m", Status: keel.SpanOK}}, nil
}

func (f *fakeBackend) Subscribe(fn func(keel.Event)) func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextSub++
	n := f.nextSub
	f.subs[n] = fn
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.subs, n)
	}
}

func (f *fakeBackend) ListTools(context.Context) ([]protocol.ToolInfo, error) {
	if err := f.failWith("ListTools"); err != nil {
		return nil, err
	}
	return []protocol.ToolInfo{{ToolSpec: keel.ToolSpec{
		Name: "echo", Description: "echoes its input", InputSchema: json.RawMessage(`{"type":"object"}`),
		SideEffects: keel.SideEffectReadOnly,
	}}}, nil
}

func (f *fakeBackend) CallTool(ctx context.Context, name string, input json.RawMessage) (json.RawMessage, error) {
	f.mu.Lock()
	call := f.callTool
	f.mu.Unlock()
	if call != nil {
		return call(ctx, name, input)
	}
	if err := f.failWith("CallTool"); err != nil {
		return nil, err
	}
	return input, nil
}

func (f *fakeBackend) InspectTool(_ context.Context, path string) (protocol.ToolInfo, error) {
	return protocol.ToolInfo{ToolSpec: keel.ToolSpec{Name: strings.TrimSuffix(filepath.Base(path), ".wasm")}}, nil
}

func (f *fakeBackend) InstallTool(_ context.Context, p protocol.ToolsInstallParams) (protocol.ToolInfo, error) {
	return protocol.ToolInfo{ToolSpec: keel.ToolSpec{Name: strings.TrimSuffix(filepath.Base(p.Path), ".wasm")}, Grants: p.Grants}, nil
}

func (f *fakeBackend) RemoveTool(context.Context, string) error { return nil }

func (f *fakeBackend) GrantTool(_ context.Context, p protocol.ToolsGrantParams) (protocol.ToolInfo, error) {
	return protocol.ToolInfo{ToolSpec: keel.ToolSpec{Name: p.Name}, Grants: p.Grants}, nil
}

func (f *fakeBackend) RevokeTool(_ context.Context, p protocol.ToolsRevokeParams) (protocol.ToolInfo, error) {
	return protocol.ToolInfo{ToolSpec: keel.ToolSpec{Name: p.Name}}, nil
}

func (f *fakeBackend) ToolAudit(_ context.Context, tool string, limit int) ([]keel.ToolAudit, error) {
	return []keel.ToolAudit{{Tool: tool, Step: limit, Outcome: "ok"}}, nil
}

func (f *fakeBackend) Describe(context.Context) (capabilities.Environment, error) {
	if err := f.failWith("Describe"); err != nil {
		return capabilities.Environment{}, err
	}
	return capabilities.Environment{Runtime: "keel", Version: "test", Network: "loopback"}, nil
}

func (f *fakeBackend) ListModels(context.Context) (protocol.ModelsListResult, error) {
	if err := f.failWith("ListModels"); err != nil {
		return protocol.ModelsListResult{}, err
	}
	return protocol.ModelsListResult{
		Models:    []protocol.ModelInfo{{Name: "tiny", Provider: "fake", Capabilities: []string{"completion"}, ContextLength: 2048}},
		Providers: []protocol.ProviderStatus{{Name: "fake", Reachable: true}},
	}, nil
}

func (f *fakeBackend) PullModel(ctx context.Context, name string, progress func(protocol.ModelsPullProgress)) error {
	f.mu.Lock()
	pull := f.pullModel
	f.mu.Unlock()
	if pull != nil {
		return pull(ctx, name, progress)
	}
	return f.failWith("PullModel")
}

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

func startServer(t *testing.T, b ipc.Backend, cfg ipc.Config) *testServer {
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
func startSmallBufServer(t *testing.T, b ipc.Backend, cfg ipc.Config) *testServer {
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

func startServerOn(t *testing.T, b ipc.Backend, cfg ipc.Config, ln net.Listener) *testServer {
	t.Helper()
	if cfg.Token == "" {
		cfg.Token = testToken
	}
	s, err := ipc.NewServer(b, cfg)
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

// read returns the next frame.
func (c *tclient) read() wireMsg {
	c.t.Helper()
	m, err := c.tryRead(5 * time.Second)
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return m
}

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
