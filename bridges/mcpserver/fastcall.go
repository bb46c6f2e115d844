package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keel-runtime/keel"
)

// The direct path of tools/call over HTTP.
//
// Through the SDK a call is handed from the request's goroutine to the
// session's reader, to a handler goroutine, and its response back
// through the session's stream, with the message decoded twice and a
// metadata scan on the way (bench/mcp's profile: about as much CPU as
// the tool's own work outside the sandbox, and three hand-offs, which a
// loaded machine turns into waiting). keel's tools answer with one
// result and send nothing during a call, so HTTPHandler answers a plain
// tools/call of a served tool itself, in the request's goroutine, with
// the same handler (scope check, policy, elicitation, audit, result)
// and the same response body. Anything else, and any request the SDK
// would treat differently (no session of ours, another credential, a
// protocol version it does not serve statefully, a batch, _meta, an unknown
// tool, a token without the run scope, ...), goes to the SDK as before.

// httpSession is what the direct path knows of an HTTP session.
type httpSession struct {
	ss   *sdk.ServerSession
	user string // the credential that opened it (Caller.ID)
	// sdkSeen is when a request of the session last went through the
	// SDK (unix nanoseconds): the SDK's idle timer restarts only then.
	sdkSeen atomic.Int64
}

// opened notes the HTTP session id that r, an initialize, opened, for
// the direct path, until it ends.
func (s *Server) opened(r *http.Request, id string) {
	ti := auth.TokenInfoFromContext(r.Context())
	if ti == nil {
		return
	}
	var ss *sdk.ServerSession
	for x := range s.sdk.Sessions() {
		if x.ID() == id {
			ss = x
			break
		}
	}
	if ss == nil {
		return // it already ended
	}
	hs := &httpSession{ss: ss, user: ti.UserID}
	hs.sdkSeen.Store(time.Now().UnixNano())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.sessions.Store(id, hs)
	s.watch.Add(1)
	go func() {
		defer s.watch.Done()
		ss.Wait()
		s.sessions.Delete(id)
	}()
}

// session returns the direct path's record of session id for r's
// credential, nil if it has none.
func (s *Server) session(r *http.Request, id string) *httpSession {
	v, ok := s.sessions.Load(id)
	if !ok {
		return nil
	}
	hs := v.(*httpSession)
	if ti := auth.TokenInfoFromContext(r.Context()); ti == nil || ti.UserID != hs.user {
		return nil
	}
	return hs
}

// directCall is a tools/call as the direct path reads it.
type directCall struct {
	id   json.RawMessage
	name string
	args json.RawMessage
}

// parseDirect reads body as a plain tools/call request: an object with
// exactly jsonrpc "2.0", a number or string id, method tools/call and
// params with a name and perhaps arguments, and nothing else (keys
// matched exactly, as the SDK does). ok is false for anything else.
func parseDirect(body []byte) (c directCall, ok bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil || len(m) != 4 {
		return c, false
	}
	id, params := m["id"], m["params"]
	if string(m["jsonrpc"]) != `"2.0"` || string(m["method"]) != `"tools/call"` || len(id) == 0 || len(params) == 0 {
		return c, false
	}
	if id[0] != '"' && id[0] != '-' && (id[0] < '0' || id[0] > '9') {
		return c, false
	}
	var p map[string]json.RawMessage
	if json.Unmarshal(params, &p) != nil || len(p) == 0 || len(p) > 2 {
		return c, false
	}
	name, args := p["name"], p["arguments"]
	if len(p) == 2 && args == nil {
		return c, false // _meta, or a key of a newer protocol
	}
	if json.Unmarshal(name, &c.name) != nil || c.name == "" {
		return c, false
	}
	if t := bytes.TrimSpace(args); len(t) == 0 || string(t) == "null" {
		args = json.RawMessage("{}")
	}
	c.id, c.args = id, args
	return c, true
}

// direct answers r itself if it is a tools/call the direct path takes,
// and reports whether it did. When it did not, r's body is as it was.
func (s *Server) direct(w http.ResponseWriter, r *http.Request, id string, maxBytes int64, timeout time.Duration) bool {
	hs := s.session(r, id)
	if hs == nil || hs.ss.InitializeParams() == nil || !legacyVersion(r.Header.Get("Mcp-Protocol-Version")) ||
		r.Header.Get("Last-Event-ID") != "" || r.Header.Get("Mcp-Method") != "" || r.Header.Get("Mcp-Name") != "" ||
		!strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") || !accepts(r.Header.Values("Accept")) {
		return false
	}
	// Once a tenth of the idle timeout passed since the SDK last saw the
	// session, a call goes through it, which restarts its idle timer: a
	// session in use does not time out.
	if time.Since(time.Unix(0, hs.sdkSeen.Load())) > timeout/10 {
		return false
	}
	if ti := auth.TokenInfoFromContext(r.Context()); ti == nil || !slices.Contains(ti.Scopes, keel.ScopeRun) {
		return false // the SDK's scope check refuses it
	}
	body, err := readBody(r, maxBytes)
	if err != nil {
		r.Body = readCloser{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
		return false
	}
	c, ok := parseDirect(body)
	s.mu.Lock()
	served := ok && s.served[c.name] != nil
	s.mu.Unlock()
	if !served {
		r.Body = readCloser{bytes.NewReader(body), r.Body}
		return false
	}

	res, err := s.callTool(r.Context(), c.name, c.args, hs.ss)
	var out []byte
	if err == nil {
		out, err = json.Marshal(res)
	}
	msg := struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  json.RawMessage `json:"result,omitempty"`
		Error   *wireError      `json:"error,omitempty"`
	}{JSONRPC: "2.0", ID: c.id, Result: out}
	if err != nil {
		msg.Result, msg.Error = nil, &wireError{Code: -32603, Message: err.Error()}
	}
	b, _ := json.Marshal(msg)
	w.Header().Set("Cache-Control", "no-cache, no-transform")
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
	return true
}

// readBody reads r's body, at most maxBytes: in one read of its length
// when it has one. On an error (errTooLarge for a longer body) it
// returns what it read.
func readBody(r *http.Request, maxBytes int64) ([]byte, error) {
	if n := r.ContentLength; n >= 0 && n <= maxBytes {
		body := make([]byte, n)
		k, err := io.ReadFull(r.Body, body)
		return body[:k], err
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBytes+1))
	if err == nil && int64(len(body)) > maxBytes {
		err = errTooLarge
	}
	return body, err
}

var errTooLarge = errors.New("request body too large")

// wireError is a JSON-RPC error object.
type wireError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// callTool runs the handler of tool name for a client of session ss:
// the call, or the MCP form of the tool error that refused it.
func (s *Server) callTool(ctx context.Context, name string, args json.RawMessage, ss *sdk.ServerSession) (*sdk.CallToolResult, error) {
	out, err := s.cfg.Tools.CallTool(ctx, s.callOf(ss, name, args))
	if err != nil {
		var te *keel.ToolError
		if errors.As(err, &te) {
			return ErrorResult(te), nil
		}
		if errors.Is(err, keel.ErrNotFound) {
			return ErrorResult(&keel.ToolError{Code: keel.ToolNotFound, Message: fmt.Sprintf("no tool named %q is installed", name)}), nil
		}
		return nil, err
	}
	return Result(out), nil
}

// legacyVersion reports whether v, a request's Mcp-Protocol-Version,
// names a protocol version a stateful session speaks (the SDK serves
// 2026-07-28 and later only statelessly), or none (2025-03-26 and
// earlier send none).
func legacyVersion(v string) bool {
	return v == "" || v < "2026-07-28" && slices.Contains(sdk.SupportedProtocolVersions(), v)
}

// accepts reports whether an Accept header takes both JSON and an event
// stream, as streamable HTTP asks of a POST, named explicitly.
func accepts(values []string) bool {
	var json, stream bool
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			mt, _, _ := strings.Cut(part, ";")
			switch strings.TrimSpace(mt) {
			case "application/json":
				json = true
			case "text/event-stream":
				stream = true
			}
		}
	}
	return json && stream
}

// readCloser reads from r and closes c.
type readCloser struct {
	io.Reader
	c io.Closer
}

func (rc readCloser) Close() error { return rc.c.Close() }
