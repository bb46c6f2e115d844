package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// RelayConfig configures Relay. URL and Token are required.
type RelayConfig struct {
	// URL is the streamable HTTP endpoint relayed to, such as
	// http://127.0.0.1:7777/mcp.
	URL string
	// Token is presented on every request (Authorization: Bearer).
	Token string
	// MaxMessageBytes bounds one message from the client; a longer line
	// is read past without being held, and answered with a JSON-RPC
	// error (ErrMessageTooLarge's). Default 4 MiB, the HTTP handler's
	// own bound.
	MaxMessageBytes int
	// HTTPClient makes the requests. Default: for a plain-HTTP URL, the
	// relay writes each message's POST on a connection of its own (one
	// per request in flight, kept open) and reads the answer on the same
	// goroutine, without net/http's client; the notification stream and
	// the session's end go through a client of its own that keeps its
	// connections to URL open.
	HTTPClient *http.Client
}

// ErrMessageTooLarge is the error of a client message longer than
// RelayConfig.MaxMessageBytes.
var ErrMessageTooLarge = errors.New("message too large")

// ErrSessionEnded is wrapped by Relay's error when the server ended the
// session or could no longer be reached (the daemon stopped).
var ErrSessionEnded = errors.New("the MCP session with the daemon ended")

// CodeMessageTooLarge is the JSON-RPC error code of a message longer than
// RelayConfig.MaxMessageBytes (JSON-RPC's invalid request).
const CodeMessageTooLarge = -32600

// Relay serves an MCP client speaking the stdio transport on in and out
// (newline-delimited JSON-RPC messages) by relaying each message as it
// is, byte for byte, to the streamable HTTP endpoint cfg.URL, and every
// message the server sends back, in a response or on the session's
// notification stream (GET), to out as one line, written with one
// Write. Nothing is decoded beyond a message's id and method, nothing
// re-encoded: `keel mcp` is this relay in front of the daemon's /mcp,
// so both transports are one server, with the same policy, elicitation
// and scopes (those of cfg.Token).
//
// Requests are relayed concurrently (an answer to an elicitation must
// reach the server while the call that asked waits); initialize and
// notifications in order. A line that is not JSON, or longer than
// MaxMessageBytes, gets a JSON-RPC error and nothing reaches the server.
//
// Relay returns nil when in ends (after the requests in flight are
// answered, ending the session), ctx's error when ctx is done, and an
// error wrapping ErrSessionEnded when the server ends the session or
// goes away.
func Relay(ctx context.Context, cfg RelayConfig, in io.Reader, out io.Writer) error {
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = 4 << 20
	}
	own := cfg.HTTPClient == nil
	if own {
		cfg.HTTPClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: time.Minute}}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r := &relay{cfg: cfg, out: out, ctx: ctx, fail: cancel}
	if u, err := url.Parse(cfg.URL); err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
		r.url = u
	}
	if own {
		// The messages go on connections of the relay's own (see
		// poster); the notification stream and the session's end
		// through the client.
		r.poster = newPoster(r.url, cfg.Token)
	}
	r.listenCtx, r.stopListen = context.WithCancel(ctx)
	// The reader stays blocked in in's Read if ctx ends first: the
	// caller owns in (a command's stdin ends with the process).
	lines := make(chan error, 1)
	go r.read(bufio.NewReaderSize(in, 64<<10), lines)
	var err error
	select {
	case err = <-lines:
	case <-ctx.Done():
	}
	r.posts.Wait()
	r.stopListen()
	r.listening.Wait()
	r.end()
	if r.poster != nil {
		r.poster.close()
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	if err == nil {
		err = ctx.Err()
	}
	return err
}

type relay struct {
	cfg RelayConfig
	url *url.URL // cfg.URL parsed, nil if it does not parse: each request says why
	// poster, when not nil, sends the client's messages (POSTs) instead
	// of cfg.HTTPClient: a plain-HTTP URL and no client given.
	poster *poster
	ctx    context.Context
	fail   context.CancelCauseFunc
	// posts are the requests in flight; listening, the session's
	// notification stream, which stopListen ends.
	posts      sync.WaitGroup
	listening  sync.WaitGroup
	listenCtx  context.Context
	stopListen context.CancelFunc

	outMu sync.Mutex
	out   io.Writer

	mu      sync.Mutex
	session string // Mcp-Session-Id, once initialize answered
	version string // the protocol version it negotiated
}

// read relays each line of in until it ends, then sends the outcome
// to done. A request other than initialize is relayed concurrently
// with what follows it (an elicitation's answer must reach the server
// while the call that asked waits): read then leaves the reading to a
// new goroutine, which takes over done, and relays the request itself,
// so that the request goes out at once, without waiting for another
// goroutine to be scheduled.
func (r *relay) read(in *bufio.Reader, done chan<- error) {
	for {
		line, err := readLine(in, r.cfg.MaxMessageBytes)
		if errors.Is(err, ErrMessageTooLarge) {
			r.writeError(nil, CodeMessageTooLarge, fmt.Sprintf("%v: a message is at most %d bytes", err, r.cfg.MaxMessageBytes))
			continue
		}
		if line = bytes.TrimSpace(line); len(line) > 0 {
			if h, ok := r.send(line); !ok {
				r.posts.Add(1)
				go r.read(in, done)
				r.post(line, h)
				r.posts.Done()
				return
			}
		}
		if err == io.EOF {
			done <- nil
			return
		}
		if err != nil {
			done <- fmt.Errorf("mcpserver: read from the client: %w", err)
			return
		}
		if r.ctx.Err() != nil {
			done <- nil
			return
		}
	}
}

// readLine returns the next line of in, without its newline; a line
// longer than max is read to its end and dropped (ErrMessageTooLarge).
func readLine(in *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := in.ReadSlice('\n')
		if len(line)+len(chunk) > max+1 {
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = in.ReadSlice('\n')
			}
			if err != nil && err != io.EOF {
				return nil, err
			}
			return nil, ErrMessageTooLarge
		}
		line = append(line, chunk...)
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
	}
}

// head is what the relay reads of a message: its id and method.
type head struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
}

// send relays one message of the client, in order, unless it is a
// request other than initialize: that it leaves to its caller to relay
// concurrently with the next messages (ok false).
func (r *relay) send(msg []byte) (_ head, ok bool) {
	var h head
	if err := json.Unmarshal(msg, &h); err != nil {
		r.writeError(nil, -32700, "parse error: "+err.Error())
		return h, true
	}
	isRequest := len(h.ID) > 0 && h.Method != ""
	if !isRequest || h.Method == "initialize" {
		// In order: the session's start, notifications, and answers to
		// the server's requests, which are quick.
		r.post(msg, h)
		return h, true
	}
	return h, false
}

// post sends msg to the server and relays what comes back.
func (r *relay) post(msg []byte, h head) {
	var resp *http.Response
	var err error
	if r.poster != nil {
		r.mu.Lock()
		session, version := r.session, r.version
		r.mu.Unlock()
		resp, err = r.poster.post(r.ctx, msg, session, version)
	} else {
		req, rerr := r.newPost(msg)
		if rerr != nil {
			r.writeError(h.ID, -32603, rerr.Error())
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		r.headers(req)
		resp, err = r.cfg.HTTPClient.Do(req)
	}
	if err != nil {
		if r.ctx.Err() == nil {
			r.fail(fmt.Errorf("%w: %w", ErrSessionEnded, err))
		}
		return
	}
	defer resp.Body.Close()
	if h.Method == "initialize" && resp.StatusCode == http.StatusOK {
		r.mu.Lock()
		r.session = resp.Header.Get("Mcp-Session-Id")
		r.mu.Unlock()
	}
	switch {
	case resp.StatusCode == http.StatusAccepted:
	case resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"):
		r.relayEvents(resp.Body, h)
	case resp.StatusCode == http.StatusOK:
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			r.writeError(h.ID, -32603, "read the response: "+err.Error())
			return
		}
		r.answered(body, h)
		r.write(body)
	default:
		r.failed(resp, h)
	}
}

// newPost returns the POST of msg to the server. The URL is parsed
// once (url.Parse was 8% of the relay's CPU when done per message).
func (r *relay) newPost(msg []byte) (*http.Request, error) {
	if r.url == nil {
		return http.NewRequestWithContext(r.ctx, http.MethodPost, r.cfg.URL, bytes.NewReader(msg))
	}
	req := &http.Request{Method: http.MethodPost, URL: r.url, Host: r.url.Host, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: make(http.Header, 6), Body: io.NopCloser(bytes.NewReader(msg)), ContentLength: int64(len(msg)),
		GetBody: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(msg)), nil }}
	return req.WithContext(r.ctx), nil
}

// answered notes the protocol version initialize's answer body holds,
// and opens the session's notification stream.
func (r *relay) answered(body []byte, h head) {
	if h.Method != "initialize" {
		return
	}
	var res struct {
		Result struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"result"`
	}
	if json.Unmarshal(body, &res) != nil || res.Result.ProtocolVersion == "" {
		return
	}
	r.mu.Lock()
	r.version = res.Result.ProtocolVersion
	open := r.session != ""
	r.mu.Unlock()
	if open {
		// Until the stream is open, the server has nowhere to send a
		// request of its own (an elicitation): the client's next
		// message waits for it.
		opened := make(chan struct{})
		r.listening.Add(1)
		go r.listen(opened)
		select {
		case <-opened:
		case <-r.listenCtx.Done():
		}
	}
}

// failed relays an HTTP error: its body if it is a JSON-RPC message,
// else a JSON-RPC error saying what the server said (for a request; a
// notification's is dropped, as it has no answer).
func (r *relay) failed(resp *http.Response, h head) {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode == http.StatusNotFound && len(h.ID) > 0 {
		defer r.fail(fmt.Errorf("%w: the daemon no longer knows the session (it restarted?)", ErrSessionEnded))
	}
	var m struct {
		JSONRPC string `json:"jsonrpc"`
	}
	if json.Unmarshal(body, &m) == nil && m.JSONRPC == "2.0" {
		r.write(bytes.TrimSpace(body))
		return
	}
	if len(h.ID) > 0 {
		code := -32603 // internal error
		if resp.StatusCode == http.StatusBadRequest {
			code = -32600 // invalid request: the daemon's transport refused it
		}
		r.writeError(h.ID, code, fmt.Sprintf("the daemon answered %s: %s", resp.Status, bytes.TrimSpace(body)))
	}
}

// listen relays the session's notification stream (GET) until the
// session or the relay ends; its end, other than the relay's, fails the
// relay: the daemon went away.
func (r *relay) listen(opened chan<- struct{}) {
	defer r.listening.Done()
	var once sync.Once
	open := func() { once.Do(func() { close(opened) }) }
	defer open()
	req, err := http.NewRequestWithContext(r.listenCtx, http.MethodGet, r.cfg.URL, nil)
	if err != nil {
		return
	}
	req.Header.Set("Accept", "text/event-stream")
	r.headers(req)
	resp, err := r.cfg.HTTPClient.Do(req)
	if err != nil {
		if r.listenCtx.Err() == nil {
			r.fail(fmt.Errorf("%w: %w", ErrSessionEnded, err))
		}
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		if resp.StatusCode != http.StatusMethodNotAllowed {
			r.fail(fmt.Errorf("%w: the notification stream was refused: %s", ErrSessionEnded, resp.Status))
		}
		return
	}
	open()
	r.relayEvents(resp.Body, head{})
	if r.listenCtx.Err() == nil {
		r.fail(fmt.Errorf("%w: the daemon closed the notification stream", ErrSessionEnded))
	}
}

// relayEvents writes the data of each server-sent event of body as a
// line; h is the request whose response body it is, if any.
func (r *relay) relayEvents(body io.Reader, h head) {
	br := bufio.NewReaderSize(body, 64<<10)
	var data []byte
	for {
		line, err := readLine(br, 4*r.cfg.MaxMessageBytes)
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0 && len(data) > 0:
			r.answered(data, h)
			r.write(data)
			data = nil
		case bytes.HasPrefix(line, []byte("data:")):
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, bytes.TrimPrefix(line[5:], []byte(" "))...)
		}
		if err != nil {
			if len(data) > 0 {
				r.write(data)
			}
			return
		}
	}
}

// headers sets the session's headers on req.
func (r *relay) headers(req *http.Request) {
	req.Header.Set("Authorization", "Bearer "+r.cfg.Token)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.session != "" {
		req.Header.Set("Mcp-Session-Id", r.session)
	}
	if r.version != "" {
		req.Header.Set("Mcp-Protocol-Version", r.version)
	}
}

// end ends the session (DELETE), if there is one.
func (r *relay) end() {
	r.mu.Lock()
	session := r.session
	r.mu.Unlock()
	if session == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, r.cfg.URL, nil)
	if err != nil {
		return
	}
	r.headers(req)
	if resp, err := r.cfg.HTTPClient.Do(req); err == nil {
		resp.Body.Close()
	}
}

// write writes msg and a newline to the client with one Write.
func (r *relay) write(msg []byte) {
	buf := make([]byte, 0, len(msg)+1)
	buf = append(append(buf, msg...), '\n')
	r.outMu.Lock()
	defer r.outMu.Unlock()
	if _, err := r.out.Write(buf); err != nil {
		r.fail(fmt.Errorf("mcpserver: write to the client: %w", err))
	}
}

// writeError writes a JSON-RPC error answering id (null if none).
func (r *relay) writeError(id json.RawMessage, code int, msg string) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, msg}})
	r.write(b)
}
