package client

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/datadir"
	"github.com/keel-runtime/keel/ipc/protocol"
)

const (
	// readLimit is the largest frame the client reads; run.get of a long
	// run can be big.
	readLimit = 64 << 20
	// eventBuffer is the capacity of the Events channel.
	eventBuffer = 1024
	// progressBuffer is how many progress notifications of one call the
	// reader queues before it waits for the caller to take them.
	progressBuffer = 64
	// writeTimeout bounds writing one request.
	writeTimeout = 30 * time.Second
)

// ErrDaemonNotRunning is wrapped by DialDataDir's error when no daemon
// serves the data directory.
var ErrDaemonNotRunning = errors.New("keel daemon is not running")

// ErrClosed is wrapped by the errors of calls made on, or cut short by,
// a connection that has ended.
var ErrClosed = errors.New("connection closed")

// Client is a connection to a keel daemon. Its methods are safe for
// concurrent use.
type Client struct {
	ws     *websocket.Conn
	nextID atomic.Int64

	mu      sync.Mutex
	pending map[int64]*pendingCall
	err     error // why the connection ended; set before done is closed

	events chan keel.Event
	// toolsChanged holds at most one pending tools.changed signal.
	toolsChanged chan struct{}
	closing      chan struct{} // closed by Close
	closeOnce    sync.Once
	done         chan struct{} // closed when the reader has exited
}

// Dial connects to the daemon at url (as in daemon.json, such as
// "ws://127.0.0.1:PORT/v1/ws") with token, which it sends as a bearer
// token. ctx bounds the handshake only.
func Dial(ctx context.Context, url, token string) (*Client, error) {
	return DialTLS(ctx, url, token, nil)
}

// DialTLS is Dial with the TLS configuration of a wss:// URL (a server
// whose certificate a private CA signed: its RootCAs); nil uses the
// system's roots.
func DialTLS(ctx context.Context, url, token string, cfg *tls.Config) (*Client, error) {
	// A transport of its own, never proxied, whose idle connections (left
	// by a refused handshake) are closed before Dial returns.
	tr := &http.Transport{TLSClientConfig: cfg}
	defer tr.CloseIdleConnections()
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: tr},
		HTTPHeader:   http.Header{"Authorization": []string{"Bearer " + token}},
		Subprotocols: []string{protocol.Subprotocol},
	})
	if err != nil {
		if resp != nil {
			switch resp.StatusCode {
			case http.StatusUnauthorized:
				return nil, fmt.Errorf("keel: connect to %s: the daemon refused the token (HTTP 401)", url)
			case http.StatusForbidden:
				return nil, fmt.Errorf("keel: connect to %s: the daemon refused the connection (HTTP 403: Host or Origin not allowed)", url)
			}
		}
		return nil, fmt.Errorf("keel: connect to %s: %w", url, err)
	}
	ws.SetReadLimit(readLimit)
	c := &Client{
		ws:           ws,
		pending:      make(map[int64]*pendingCall),
		events:       make(chan keel.Event, eventBuffer),
		toolsChanged: make(chan struct{}, 1),
		closing:      make(chan struct{}),
		done:         make(chan struct{}),
	}
	go c.readLoop()
	return c, nil
}

// DialDataDir connects to the daemon serving dataDir, found through
// dataDir/daemon.json and the token file it names. If there is no
// daemon.json, or the process it names has exited, the error (which
// wraps ErrDaemonNotRunning) says how to start one.
func DialDataDir(ctx context.Context, dataDir string) (*Client, error) {
	info, err := ReadDaemonInfo(dataDir)
	infoPath := filepath.Join(dataDir, protocol.DaemonFile)
	start := "start it with: keel daemon --data-dir " + shellQuote(dataDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w (no %s); %s", ErrDaemonNotRunning, infoPath, start)
	}
	if err != nil {
		return nil, err
	}
	if info.PID > 0 && !processAlive(info.PID) {
		return nil, fmt.Errorf("%w (%s names pid %d, which has exited); %s", ErrDaemonNotRunning, infoPath, info.PID, start)
	}
	if info.Protocol != "" && info.Protocol != protocol.Version {
		return nil, fmt.Errorf("keel: the daemon speaks protocol %s, this client %s", info.Protocol, protocol.Version)
	}
	tok, err := datadir.ReadToken(dataDir, info)
	if err != nil {
		return nil, err
	}
	c, err := Dial(ctx, info.URL, tok)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w (nothing listens at %s, named by %s); %s", ErrDaemonNotRunning, info.URL, infoPath, start)
		}
		return nil, err
	}
	return c, nil
}

// ReadDaemonInfo reads dataDir/daemon.json. A missing file gives an
// error wrapping os.ErrNotExist.
func ReadDaemonInfo(dataDir string) (protocol.DaemonInfo, error) { return datadir.ReadInfo(dataDir) }

// processAlive reports whether a process with pid exists. Where that
// cannot be checked it reports true, and dialling tells.
func processAlive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false // on Windows: no such process
	}
	if runtime.GOOS == "windows" {
		p.Release()
		return true
	}
	err = p.Signal(syscall.Signal(0))
	return err == nil || errors.Is(err, syscall.EPERM)
}

// shellQuote quotes s for a POSIX shell if it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@+=,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Events returns the channel of run.event notifications of this
// connection's subscriptions, in the order the daemon sent them. It is
// closed when the connection ends; Err then says why. Drain it while
// subscribed: when its buffer (1024 events) is full the client stops
// reading, responses included, and the daemon eventually drops a client
// that does not keep up.
func (c *Client) Events() <-chan keel.Event { return c.events }

// ToolsChanged signals when the daemon reports that the installed tools
// or their grants changed (several changes may arrive as one signal);
// call ListTools to see the new state.
func (c *Client) ToolsChanged() <-chan struct{} { return c.toolsChanged }

// Err returns why the connection ended, or nil while it is open.
func (c *Client) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// Close closes the connection and waits for the reader goroutine to
// exit. It is safe to call more than once.
func (c *Client) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closing)
		err = c.ws.Close(websocket.StatusNormalClosure, "")
	})
	<-c.done
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// pendingCall is a call waiting for its response.
type pendingCall struct {
	resp chan *protocol.Response // capacity 1
	// progress, for a call that takes progress, receives the params of
	// the notifications carrying the call's id (models.pull.progress,
	// models.chat.delta, knowledge.add.progress).
	progress chan json.RawMessage
	gone     chan struct{} // closed when the caller stops waiting
}

// Call calls method with params and decodes the result into result,
// which may be nil to discard it. An error response is returned as a
// *protocol.Error. If ctx ends first, Call returns ctx's error; the
// request may still take effect.
func (c *Client) Call(ctx context.Context, method string, params, result any) error {
	return c.call(ctx, method, params, result, nil)
}

// call is Call. When progress is not nil, it is called on the calling
// goroutine, in order, with every models.pull.progress notification that
// carries this request's id, all of them before call returns.
func (c *Client) call(ctx context.Context, method string, params, result any, progress func(json.RawMessage)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	id := c.nextID.Add(1)
	req := protocol.Request{JSONRPC: "2.0", ID: json.RawMessage(strconv.FormatInt(id, 10)), Method: method}
	if params != nil {
		raw, err := json.Marshal(params)
		if err != nil {
			return fmt.Errorf("keel: %s: encode params: %w", method, err)
		}
		req.Params = raw
	}
	data, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("keel: %s: %w", method, err)
	}

	pc := &pendingCall{resp: make(chan *protocol.Response, 1), gone: make(chan struct{})}
	if progress != nil {
		pc.progress = make(chan json.RawMessage, progressBuffer)
	}
	c.mu.Lock()
	if c.pending == nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.pending[id] = pc
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		close(pc.gone)
	}()

	// Cancelling a websocket write closes the connection, so the write
	// gets a context of its own rather than the caller's.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	err = c.ws.Write(wctx, websocket.MessageText, data)
	cancel()
	if err != nil {
		return fmt.Errorf("keel: %s: send: %w", method, err)
	}

	for {
		select {
		case pr := <-pc.progress: // never ready when nil
			progress(pr)
		case resp := <-pc.resp:
			// The reader queued every notification sent before the
			// response before it passed the response on.
			for drained := false; !drained; {
				select {
				case pr := <-pc.progress:
					progress(pr)
				default:
					drained = true
				}
			}
			if resp.Error != nil {
				return resp.Error
			}
			if result == nil {
				return nil
			}
			if err := json.Unmarshal(resp.Result, result); err != nil {
				return fmt.Errorf("keel: %s: decode result: %w", method, err)
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-c.done:
			return c.err
		}
	}
}

// incoming is any frame the daemon sends.
type incoming struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *protocol.Error `json:"error"`
}

// readLoop reads frames until the connection ends, routing responses to
// their callers and events to the Events channel.
func (c *Client) readLoop() {
	var cause error
	defer func() {
		c.mu.Lock()
		c.err = cause
		c.pending = nil
		c.mu.Unlock()
		close(c.events)
		close(c.done)
	}()
	for {
		_, data, err := c.ws.Read(context.Background())
		if err != nil {
			cause = closeCause(err, c.isClosing())
			c.ws.CloseNow()
			return
		}
		var m incoming
		if err := json.Unmarshal(data, &m); err != nil {
			continue // not JSON-RPC; nothing to route it to
		}
		if m.Method != "" {
			if m.Method == protocol.NotifyToolsChanged {
				select {
				case c.toolsChanged <- struct{}{}:
				default: // one pending signal says it all
				}
				continue
			}
			if m.Method == protocol.NotifyModelsPullProgress || m.Method == protocol.NotifyModelsChatDelta || m.Method == protocol.NotifyKnowledgeAddProgress {
				if !c.routeProgress(m.Params) {
					cause = fmt.Errorf("keel: %w", ErrClosed)
					c.ws.CloseNow()
					return
				}
				continue
			}
			if m.Method != protocol.NotifyRunEvent {
				continue // clients ignore notifications they do not know
			}
			var ev keel.Event
			if err := json.Unmarshal(m.Params, &ev); err != nil {
				continue
			}
			select {
			case c.events <- ev:
			case <-c.closing:
				cause = fmt.Errorf("keel: %w", ErrClosed)
				c.ws.CloseNow()
				return
			}
			continue
		}
		id, err := strconv.ParseInt(string(m.ID), 10, 64)
		if err != nil {
			continue // a response to no request of ours (id null)
		}
		c.mu.Lock()
		pc := c.pending[id]
		c.mu.Unlock()
		if pc != nil {
			pc.resp <- &protocol.Response{JSONRPC: "2.0", ID: m.ID, Result: m.Result, Error: m.Error}
		}
	}
}

// routeProgress passes a per-call notification (models.pull.progress,
// models.chat.delta, knowledge.add.progress) to the call whose id it
// carries, waiting while that call's buffer is full. A
// notification for no call of ours is dropped. It reports false when the
// client is closing.
func (c *Client) routeProgress(params json.RawMessage) bool {
	var pr struct {
		ID json.RawMessage `json:"id"`
	}
	if err := json.Unmarshal(params, &pr); err != nil {
		return true
	}
	id, err := strconv.ParseInt(string(pr.ID), 10, 64)
	if err != nil {
		return true
	}
	c.mu.Lock()
	pc := c.pending[id]
	c.mu.Unlock()
	if pc == nil || pc.progress == nil {
		return true
	}
	select {
	case pc.progress <- params:
	case <-pc.gone:
	case <-c.closing:
		return false
	}
	return true
}

func (c *Client) isClosing() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

// closeCause turns the reader's error into the error calls report.
func closeCause(err error, closedByUs bool) error {
	if closedByUs {
		return fmt.Errorf("keel: %w", ErrClosed)
	}
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		if ce.Reason != "" {
			return fmt.Errorf("keel: the daemon closed the connection (status %d: %s): %w", ce.Code, ce.Reason, ErrClosed)
		}
		return fmt.Errorf("keel: the daemon closed the connection (status %d): %w", ce.Code, ErrClosed)
	}
	return fmt.Errorf("keel: connection lost (%v): %w", err, ErrClosed)
}

// The methods below are shorthands for Do with the common calls; Do
// calls any method, these included.

// Initialize tells the daemon who is calling and returns what it serves.
func (c *Client) Initialize(ctx context.Context, p protocol.InitializeParams) (protocol.InitializeResult, error) {
	return Do(ctx, c, Initialize, p)
}

// StartRun starts a run.
func (c *Client) StartRun(ctx context.Context, p protocol.RunStartParams) (keel.Run, error) {
	return Do(ctx, c, RunStart, p)
}

// CancelRun asks a run to stop and returns its state.
func (c *Client) CancelRun(ctx context.Context, id keel.RunID) (keel.Run, error) {
	return Do(ctx, c, RunCancel, protocol.RunRef{RunID: id})
}

// ListRuns returns up to limit runs, newest first; limit 0 means the
// daemon's default (50).
func (c *Client) ListRuns(ctx context.Context, limit int) ([]keel.Run, error) {
	r, err := Do(ctx, c, RunList, protocol.RunListParams{Limit: limit})
	return r.Runs, err
}

// GrantTool adds grants to an installed tool.
func (c *Client) GrantTool(ctx context.Context, p protocol.ToolsGrantParams) (protocol.ToolInfo, error) {
	return Do(ctx, c, ToolsGrant, p)
}

// ToolAudit returns up to limit tool-call audit records, newest first;
// tool, when not empty, keeps only that tool's calls.
func (c *Client) ToolAudit(ctx context.Context, tool string, limit int) ([]keel.ToolAudit, error) {
	r, err := Do(ctx, c, ToolsAudit, protocol.ToolsAuditParams{Tool: tool, Limit: limit})
	return r.Records, err
}

// GetRun returns a run with its events and spans.
func (c *Client) GetRun(ctx context.Context, id keel.RunID) (protocol.RunDetail, error) {
	return Do(ctx, c, RunGet, protocol.RunRef{RunID: id})
}

// Subscribe asks for the events of run id with Seq > afterSeq, then its
// live ones, on Events. To resume after a reconnect, pass the last Seq
// received.
func (c *Client) Subscribe(ctx context.Context, id keel.RunID, afterSeq int64) (protocol.SubscribeResult, error) {
	return Do(ctx, c, RunSubscribe, protocol.SubscribeParams{RunID: id, AfterSeq: afterSeq})
}

// Unsubscribe stops the events of run id. Events already sent may still
// arrive on Events.
func (c *Client) Unsubscribe(ctx context.Context, id keel.RunID) error {
	_, err := Do(ctx, c, RunUnsubscribe, protocol.RunRef{RunID: id})
	return err
}

// ToolsList returns the installed tools and, while the daemon is still
// compiling the tools it found at start, its progress.
func (c *Client) ToolsList(ctx context.Context) (protocol.ToolsListResult, error) {
	return Do(ctx, c, ToolsList, None{})
}

// ListTools returns the installed tools.
func (c *Client) ListTools(ctx context.Context) ([]protocol.ToolInfo, error) {
	r, err := c.ToolsList(ctx)
	return r.Tools, err
}

// CallTool runs a tool directly, without a model. A tool failure is a
// *protocol.Error whose Data is the keel.ToolError.
func (c *Client) CallTool(ctx context.Context, name string, input json.RawMessage) (protocol.ToolsCallResult, error) {
	return Do(ctx, c, ToolsCall, protocol.ToolsCallParams{Name: name, Input: input})
}

// ListModels returns the models of every model provider the daemon has,
// and whether each provider answered.
func (c *Client) ListModels(ctx context.Context) (protocol.ModelsListResult, error) {
	return Do(ctx, c, ModelsList, None{})
}

// PullModel asks the daemon to download the model name and returns once
// the pull has ended. progress, when not nil, is called on the calling
// goroutine with each progress report of this pull, in order, all of
// them before PullModel returns. It should return promptly: while the
// reports it has not taken fill a buffer (64), the client stops reading,
// responses included, so it must not wait for another call. If ctx ends
// first, PullModel returns ctx's error and the pull goes on until the
// connection closes: close the client to cancel it.
func (c *Client) PullModel(ctx context.Context, name string, progress func(protocol.ModelsPullProgress)) (protocol.ModelsPullResult, error) {
	return DoStream(ctx, c, ModelsPull, protocol.ModelsPullParams{Name: name}, progress)
}

// Chat asks the daemon's model layer for one reply (models.chat). With
// onDelta set the reply streams: onDelta is called on the caller's
// goroutine with each fragment, in order, before Chat returns.
func (c *Client) Chat(ctx context.Context, p protocol.ModelsChatParams, onDelta func(protocol.ChatDelta)) (protocol.ModelsChatResult, error) {
	if onDelta != nil {
		p.Stream = true
	}
	return DoStream(ctx, c, ModelsChat, p, onDelta)
}

// SayToRun gives a run a person's message (run.say).
func (c *Client) SayToRun(ctx context.Context, id keel.RunID, message string) (keel.Run, error) {
	return Do(ctx, c, RunSay, protocol.RunSayParams{RunID: id, Message: message})
}

// ApproveRun answers a run's approval request (run.approve).
func (c *Client) ApproveRun(ctx context.Context, p protocol.RunApproveParams) (keel.Run, error) {
	return Do(ctx, c, RunApprove, p)
}

// Decide answers a run waiting on a tool call whose outcome is unknown
// (run.decide): retry it, skip it, or mark it done with output.
func (c *Client) Decide(ctx context.Context, p protocol.RunDecideParams) (keel.Run, error) {
	return Do(ctx, c, RunDecide, p)
}

// Describe returns what the daemon's environment declares: model
// providers, tools and their grants, network stance.
func (c *Client) Describe(ctx context.Context) (protocol.EnvDescribeResult, error) {
	return Do(ctx, c, EnvDescribe, None{})
}
