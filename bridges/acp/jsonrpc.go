package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
)

// JSON-RPC 2.0 error codes, and ACP's own.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
	codeMethodNotFound = -32601
	codeInvalidParams  = -32602
	codeInternal       = -32603
	// codeNotFound is ACP's "resource not found" (an unknown session).
	codeNotFound = -32002
)

// rpcError is a JSON-RPC error object.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

func (e *rpcError) Error() string { return fmt.Sprintf("%s (JSON-RPC %d)", e.Message, e.Code) }

// message is any JSON-RPC 2.0 message as read: a request, a notification
// or a response.
type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  *string         `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

// outgoing is a message as written.
type outgoing struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  any             `json:"params,omitempty"`
	Result  any             `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

// nullID is the id of an error answering a message whose id could not be
// read.
var nullID = json.RawMessage("null")

// handler answers one request (id set) or notification: a result, or an
// error that conn maps to a JSON-RPC error (see errorObject).
type handler func(ctx context.Context, method string, params json.RawMessage) (any, error)

// conn is a JSON-RPC 2.0 connection over newline-delimited JSON: one
// message a line, in both directions. Requests are handled concurrently,
// each on its own goroutine; notifications in the order they arrive, on
// the reading goroutine (their handlers must return promptly). Writes are
// serialized. It is safe for concurrent use.
type conn struct {
	w       io.Writer
	maxLine int
	handle  handler
	// errorObject maps a handler's error to the JSON-RPC error sent.
	errorObject func(error) *rpcError

	writeMu sync.Mutex
	nextID  atomic.Int64
	mu      sync.Mutex
	pending map[string]chan *message // by the id of a request we sent
	closed  bool
}

// errConnClosed is the error of a request whose connection ended before
// its response came.
var errConnClosed = errors.New("acp: the client's connection ended")

// serve reads messages from r until it ends (EOF: nil) or ctx is done,
// and waits for the requests in flight before it returns. ctx is the
// context of every handler; it is cancelled when serve returns.
func (c *conn) serve(ctx context.Context, r io.Reader) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		c.mu.Lock()
		c.closed = true
		for id, ch := range c.pending {
			close(ch)
			delete(c.pending, id)
		}
		c.mu.Unlock()
		wg.Wait()
	}()
	br := bufio.NewReaderSize(r, 64<<10)
	for ctx.Err() == nil {
		line, err := readLine(br, c.maxLine)
		switch {
		case errors.Is(err, errLineTooLong):
			c.write(outgoing{ID: nullID, Error: &rpcError{Code: codeInvalidRequest,
				Message: fmt.Sprintf("message over %d bytes refused", c.maxLine)}})
			continue
		case err != nil && len(line) == 0:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if len(bytes.TrimSpace(line)) > 0 {
			c.dispatch(ctx, line, &wg)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
	return nil
}

// errLineTooLong is readLine's error for a line over its limit, which it
// has skipped.
var errLineTooLong = errors.New("line too long")

// readLine returns the next line without its newline. A line over max
// bytes is read to its end and dropped: errLineTooLong. At the end of
// input it returns the last line, if any, with io.EOF.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	tooLong := false
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(chunk) > max+1 { // +1: the newline
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if tooLong {
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			return nil, errLineTooLong
		}
		return bytes.TrimRight(line, "\r\n"), err
	}
}

// dispatch handles one line.
func (c *conn) dispatch(ctx context.Context, line []byte, wg *sync.WaitGroup) {
	var msg message
	if err := json.Unmarshal(line, &msg); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) || !json.Valid(line) {
			c.write(outgoing{ID: nullID, Error: &rpcError{Code: codeParseError, Message: "parse error: " + err.Error()}})
			return
		}
		// Valid JSON, but not an object (a batch, a number) or with
		// members of the wrong type.
		c.write(outgoing{ID: nullID, Error: &rpcError{Code: codeInvalidRequest, Message: "invalid request: not a JSON-RPC 2.0 message object (batches are not supported)"}})
		return
	}
	id := msg.ID
	if len(id) > 0 && !validID(id) {
		c.write(outgoing{ID: nullID, Error: &rpcError{Code: codeInvalidRequest, Message: "invalid request: id must be a string, a number or null"}})
		return
	}
	if msg.JSONRPC != "2.0" {
		c.write(outgoing{ID: orNull(id), Error: &rpcError{Code: codeInvalidRequest, Message: `invalid request: jsonrpc must be "2.0"`}})
		return
	}
	if msg.Method == nil {
		if len(id) > 0 && (msg.Result != nil || msg.Error != nil) {
			c.response(&msg)
			return
		}
		c.write(outgoing{ID: orNull(id), Error: &rpcError{Code: codeInvalidRequest, Message: "invalid request: no method"}})
		return
	}
	method := *msg.Method
	if len(id) == 0 {
		// A notification: no answer, not even an error.
		_, _ = c.handle(ctx, method, msg.Params)
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		res, err := c.handle(ctx, method, msg.Params)
		if err != nil {
			c.write(outgoing{ID: id, Error: c.errorObject(err)})
			return
		}
		c.write(outgoing{ID: id, Result: res})
	}()
}

// validID reports whether id is a string, a number or null.
func validID(id json.RawMessage) bool {
	switch id[0] {
	case '"':
		var s string
		return json.Unmarshal(id, &s) == nil
	case 'n':
		return string(id) == "null"
	default:
		_, err := strconv.ParseFloat(string(id), 64)
		return err == nil
	}
}

func orNull(id json.RawMessage) json.RawMessage {
	if len(id) == 0 {
		return nullID
	}
	return id
}

// response delivers the response to a request this side sent.
func (c *conn) response(msg *message) {
	c.mu.Lock()
	ch, ok := c.pending[string(msg.ID)]
	delete(c.pending, string(msg.ID))
	c.mu.Unlock()
	if ok {
		ch <- msg
	}
}

// call sends a request to the client and waits for its response, which
// it decodes into result. It fails with the client's *rpcError, with
// errConnClosed when the connection ends first, or with ctx's error.
func (c *conn) call(ctx context.Context, method string, params, result any) error {
	id := strconv.FormatInt(c.nextID.Add(1), 10)
	ch := make(chan *message, 1)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errConnClosed
	}
	c.pending[id] = ch
	c.mu.Unlock()
	if err := c.write(outgoing{ID: json.RawMessage(id), Method: method, Params: params}); err != nil {
		return err
	}
	select {
	case msg, ok := <-ch:
		if !ok {
			return errConnClosed
		}
		if msg.Error != nil {
			return msg.Error
		}
		return json.Unmarshal(msg.Result, result)
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return ctx.Err()
	}
}

// notify sends a notification to the client.
func (c *conn) notify(method string, params any) error {
	return c.write(outgoing{Method: method, Params: params})
}

// write sends one message as one line.
func (c *conn) write(m outgoing) error {
	m.JSONRPC = "2.0"
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("acp: encode %s: %w", m.Method, err)
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	_, err = c.w.Write(append(b, '\n'))
	return err
}
