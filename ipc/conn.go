package ipc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// conn is one client connection. Its goroutines: the reader (reads
// frames, starts one handler goroutine per request, at most maxInFlight
// at once), the writer (drains the outbound queue, the only goroutine
// that writes data frames) and the handlers. serve starts and joins
// them all.
type conn struct {
	s   *Server
	ws  *websocket.Conn
	nc  net.Conn // the underlying connection, closed outright on forced shutdown
	log *slog.Logger
	// host is the Host header the client connected with (checked): the
	// daemon's address as the client knows it.
	host string
	// who is the credential the client connected with.
	who caller

	// ctx is cancelled when the connection ends; handlers and Services
	// calls run under it.
	ctx    context.Context
	cancel context.CancelFunc

	q        *outQueue
	sem      chan struct{}
	handlers sync.WaitGroup

	endOnce   sync.Once
	ended     chan struct{}
	endCode   websocket.StatusCode
	endReason string

	subsMu sync.Mutex
	subs   map[keel.RunID]*subscription

	// client is what the client called itself in initialize ("" before
	// or without one): who a run.declassify without "by" is recorded
	// as.
	client atomic.Pointer[string]
}

// clientName returns what the client called itself in initialize, or
// "" if it has not.
func (c *conn) clientName() string {
	if p := c.client.Load(); p != nil {
		return *p
	}
	return ""
}

func (s *Server) newConn(nc net.Conn, remote, host string, who caller) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	return &conn{
		s:      s,
		nc:     nc,
		host:   host,
		who:    who,
		log:    s.log.With(logkey.Remote, remote),
		ctx:    ctx,
		cancel: cancel,
		q:      newOutQueue(s.cfg.QueueSize),
		sem:    make(chan struct{}, maxInFlight),
		ended:  make(chan struct{}),
		subs:   make(map[keel.RunID]*subscription),
	}
}

// end asks the connection to close with code and reason. The first call
// wins; end never blocks, so the Runs' callback may call it.
func (c *conn) end(code websocket.StatusCode, reason string) {
	c.endOnce.Do(func() {
		c.endCode, c.endReason = code, reason
		close(c.ended)
	})
}

// serve runs the connection until it ends and returns once every
// goroutine it started has exited.
func (c *conn) serve(ws *websocket.Conn) {
	c.ws = ws
	ws.SetReadLimit(protocol.MaxFrameBytes)
	c.log.Debug("ipc: client connected")

	unsubscribe := func() {}
	if c.s.svc.Runs != nil {
		unsubscribe = c.s.svc.Runs.Subscribe(c.onEvent)
	}
	var wg sync.WaitGroup
	wg.Go(c.readLoop)
	wg.Go(c.writeLoop)

	<-c.ended
	unsubscribe()
	c.closeSubs()
	c.cancel()
	c.q.close()
	if c.endCode == websocket.StatusPolicyViolation {
		c.log.Warn("ipc: client dropped", logkey.Reason, c.endReason)
	}
	// Close writes the close frame, waits for the peer's and closes the
	// connection, which unblocks the reader and a blocked writer. The
	// writer has stopped taking frames, so the close frame goes out as
	// soon as a frame being written is done.
	if err := ws.Close(c.endCode, c.endReason); err != nil {
		c.log.Debug("ipc: close", logkey.Err, err)
	}
	wg.Wait()
	c.handlers.Wait()
	// After the handlers: a runs.subscribe in flight adds c on its way out.
	c.s.watch.remove(c)
	c.log.Debug("ipc: client disconnected")
}

// readLoop reads frames until the connection fails or closes. A frame
// larger than protocol.MaxFrameBytes fails the read; the websocket
// library has then already sent close status 1009.
func (c *conn) readLoop() {
	defer c.end(websocket.StatusNormalClosure, "")
	for {
		// Not c.ctx: cancelling a read closes the connection without a
		// close frame. serve's ws.Close ends this read.
		_, data, err := c.ws.Read(context.Background())
		if err != nil {
			if errors.Is(err, websocket.ErrMessageTooBig) {
				c.log.Warn("ipc: frame too large, closing connection", logkey.Err, err)
			}
			return
		}
		if !c.dispatch(data) {
			return
		}
	}
}

// writeLoop writes queued frames until the connection ends.
func (c *conn) writeLoop() {
	for {
		m, err := c.q.pop(c.ctx)
		if err != nil {
			return
		}
		data := m.data
		if m.isEv {
			data, err = encodeEvent(m.ev)
			if err != nil {
				c.log.Error("ipc: encode event", logkey.Err, err)
				continue
			}
		}
		// Not c.ctx either: a cancelled write closes the connection at
		// once, and serve wants to send a close frame first.
		if err := c.ws.Write(context.Background(), websocket.MessageText, data); err != nil {
			c.end(websocket.StatusInternalError, "write failed")
			return
		}
	}
}

// eventPrefix starts every run.event notification; encodeEvent appends
// the event and the closing brace, which saves re-validating the event
// as json.Marshal of a protocol.Notification would.
var eventPrefix = []byte(`{"jsonrpc":"2.0","method":"` + protocol.NotifyRunEvent + `","params":`)

func encodeEvent(ev keel.Event) ([]byte, error) {
	params, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(eventPrefix)+len(params)+1)
	out = append(out, eventPrefix...)
	out = append(out, params...)
	return append(out, '}'), nil
}

// dispatch handles one frame. It reports false when the connection is
// ending.
func (c *conn) dispatch(data []byte) bool {
	req, rerr := parseRequest(data)
	if rerr != nil {
		var id json.RawMessage
		if req != nil {
			id = req.id
		}
		return c.reply(id, nil, rerr) == nil
	}
	h, ok := c.s.served[req.method]
	if !ok {
		if req.id == nil {
			return true
		}
		return c.reply(req.id, nil, &protocol.Error{
			Code:    protocol.CodeMethodNotFound,
			Message: fmt.Sprintf("method not found: %q", req.method),
		}) == nil
	}
	if need := scopeOf(req.method); need != "" && !c.who.scopes.has(need) {
		if req.id == nil {
			return true
		}
		c.log.Warn("ipc: method refused", logkey.Method, req.method, logkey.Reason, "missing scope "+need)
		return c.reply(req.id, nil, forbidden(req.method, need)) == nil
	}
	select {
	case c.sem <- struct{}{}:
	case <-c.ended:
		return false
	}
	c.handlers.Add(1)
	go func() {
		defer c.handlers.Done()
		defer func() { <-c.sem }()
		c.call(req, h)
	}()
	return true
}

// call runs one request's handler and queues its response.
func (c *conn) call(req *request, h methodFunc) {
	defer func() {
		if v := recover(); v != nil {
			c.log.Error("ipc: handler panicked", logkey.Method, req.method, logkey.Err, fmt.Sprint(v), logkey.Stack, string(debug.Stack()))
			if req.id != nil {
				c.reply(req.id, nil, internalError())
			}
		}
	}()
	ctx := c.ctx
	if req.id != nil {
		ctx = context.WithValue(ctx, requestIDKey{}, req.id)
	}
	res, err := h(ctx, c, req.params)
	var then func()
	if f, ok := res.(followUp); ok {
		res, then = f.result, f.then
	}
	var rerr *protocol.Error
	if err != nil {
		rerr = rpcError(c.log, req.method, err) // logs unexpected errors, even of notifications
	}
	if req.id != nil && c.reply(req.id, res, rerr) != nil {
		return
	}
	if err == nil && then != nil {
		then()
	}
}

// reply queues a response, waiting for room in the queue.
func (c *conn) reply(id json.RawMessage, result any, rerr *protocol.Error) error {
	if id == nil {
		id = json.RawMessage("null")
	}
	resp := protocol.Response{JSONRPC: "2.0", ID: id}
	if rerr != nil {
		resp.Error = rerr
	} else {
		raw, err := json.Marshal(result)
		if err != nil {
			c.log.Error("ipc: encode result", logkey.Err, err)
			resp.Error = internalError()
		} else {
			resp.Result = raw
		}
	}
	data, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	return c.q.push(c.ctx, outMsg{data: data})
}

// notify queues a notification to this connection only, waiting for
// room in the queue as a response does. It fails when ctx is done or the
// connection has ended.
func (c *conn) notify(ctx context.Context, method string, params any) error {
	raw, err := json.Marshal(params)
	if err != nil {
		return err
	}
	data, err := json.Marshal(protocol.Notification{JSONRPC: "2.0", Method: method, Params: raw})
	if err != nil {
		return err
	}
	return c.q.push(ctx, outMsg{data: data})
}

// requestIDKey is the context key of the id of the request a handler
// serves; requests sent as notifications have none.
type requestIDKey struct{}

// requestID returns the id of the request whose handler ctx belongs to,
// exactly as the client sent it, or nil for a notification.
func requestID(ctx context.Context) json.RawMessage {
	id, _ := ctx.Value(requestIDKey{}).(json.RawMessage)
	return id
}

// followUp is a handler result with work to do after the response is
// queued: run.subscribe sends its replay this way, so the response comes
// first.
type followUp struct {
	result any
	then   func()
}
