package mcpserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/internal/logkey"
)

// Tools is what a Server serves: keel's installed tools.
type Tools interface {
	// ListTools returns the installed tools.
	ListTools(ctx context.Context) ([]capabilities.ToolInfo, error)
	// CallTool makes call directly, as keel's tools.call does, after
	// asking the policy about it as a run's call is asked (see Call). A
	// tool failure, and a call the policy or a person refused, is a
	// *keel.ToolError.
	CallTool(ctx context.Context, call Call) (json.RawMessage, error)
	// SubscribeTools calls fn after every change of the installed tools
	// or their grants until cancel is called. fn must not block.
	SubscribeTools(fn func()) (cancel func())
}

// Call is one tools/call of an MCP client, for Tools.CallTool.
type Call struct {
	// Name is the tool; Input its arguments (a JSON object, "{}" when the
	// client sent none).
	Name  string
	Input json.RawMessage
	// Client names the client for the audit trail (ClientName).
	Client string
	// Approve, when not nil, asks the client's user whether this call,
	// with exactly Input, may run, for a policy decision of ask (d says
	// which rule asks): through MCP elicitation. It reports their answer
	// (false: declined or cancelled); an error means no answer came. Nil
	// when the client cannot be asked (it declared no elicitation
	// capability): an ask then refuses the call. Each Approve answers
	// for its own call only.
	Approve func(ctx context.Context, d keel.PolicyDecision) (bool, error)
}

// Config configures a Server. Tools is required; the zero value of every
// other field selects a safe default.
type Config struct {
	// Tools are the tools served. Required.
	Tools Tools
	// Runs, when set, are served too: the tool RunStartTool and the
	// resource template TraceTemplate (see Runs). Default: none.
	Runs Runs
	// Version is the server version given to clients. Default "dev".
	Version string
	// Logger receives the server's log: a tool that cannot be served
	// (its input schema is not an object's) at Warn, a failed refresh of
	// the tool list at Error. Default: discarded.
	Logger *slog.Logger
}

// Server is keel's MCP server: one set of tools, served to any number of
// clients over any number of transports (HTTPHandler, Run). Create it
// with New and stop it with Close; its methods are safe for concurrent
// use.
type Server struct {
	cfg  Config
	log  *slog.Logger
	sdk  *sdk.Server
	stop func() // ends the tool subscription
	kick chan struct{}
	// ctx is the server's lifetime, cancelled by Close; wg joins follow.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	close  sync.Once

	// requests holds the context of each HTTP request in flight, by the
	// key HTTPHandler gives it (requestHeader).
	requests sync.Map
	// streams follows the HTTP sessions' notification streams, which an
	// elicitation waits for up to streamWait (HTTPConfig.StreamWait, set
	// by HTTPHandler; 0: no HTTP, no wait).
	streams    streams
	streamWait atomic.Int64

	// sessions holds the initialized HTTP sessions (*httpSession) by ID,
	// for the direct path of tools/call (fastcall.go); watch joins the
	// goroutines that forget them when they end.
	sessions sync.Map
	watch    sync.WaitGroup

	mu     sync.Mutex
	served map[string][]byte // tool name → its MCP form as served
	closed bool              // Close began: no session is noted
}

// CodeForbidden is the JSON-RPC error code of an MCP request whose
// credential lacks the scope its method needs. It is not keel protocol's
// -32004, which MCP's Go SDK uses for "server is closing" (its clients
// would take the session for closed).
const CodeForbidden = -32050

// New returns a server of cfg.Tools, listing them once before it
// returns; it then follows their changes until Close. It fails if
// cfg.Tools is nil or the first listing fails.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Tools == nil {
		return nil, errors.New("mcpserver: Config.Tools is required")
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log, kick: make(chan struct{}, 1), served: map[string][]byte{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	caps := &sdk.ServerCapabilities{Tools: &sdk.ToolCapabilities{ListChanged: true}, Logging: &sdk.LoggingCapabilities{}}
	if cfg.Runs != nil {
		caps.Resources = &sdk.ResourceCapabilities{}
	}
	s.sdk = sdk.NewServer(&sdk.Implementation{Name: "keel", Title: "keel", Version: cfg.Version}, &sdk.ServerOptions{
		Logger: log,
		// Tools, with list changes, even while none is installed, and
		// logging (logging/setLevel), which clients may expect.
		Capabilities: caps,
		Instructions: "keel's installed tools, each run in keel's WebAssembly sandbox with the grants, limits, policy and audit trail keel applies to every call.",
	})
	s.sdk.AddReceivingMiddleware(checkScopes)
	if cfg.Runs != nil {
		s.addRuns()
	}
	if err := s.refresh(ctx); err != nil {
		s.cancel()
		return nil, err
	}
	s.stop = cfg.Tools.SubscribeTools(func() {
		select {
		case s.kick <- struct{}{}:
		default: // a refresh is pending: it will see this change too
		}
	})
	s.wg.Add(1)
	go s.follow()
	return s, nil
}

// follow refreshes the served tools after each change until Close.
func (s *Server) follow() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.kick:
			if err := s.refresh(s.ctx); err != nil && s.ctx.Err() == nil {
				s.log.Error("mcp: refresh the tool list", logkey.Err, err)
			}
		}
	}
}

// Close stops following the tools, waits for a refresh in progress and
// ends every session. It does not wait for calls in flight: their
// transports end them. A second Close does nothing.
func (s *Server) Close() {
	s.close.Do(func() {
		s.stop()
		s.cancel()
		s.wg.Wait()
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		for ss := range s.sdk.Sessions() {
			ss.Close()
		}
		s.watch.Wait()
	})
}

// refresh makes the served tools those cfg.Tools lists: a tool added,
// changed or removed notifies every session (tools/list_changed).
func (s *Server) refresh(ctx context.Context) error {
	infos, err := s.cfg.Tools.ListTools(ctx)
	if err != nil {
		return fmt.Errorf("mcpserver: list tools: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := make(map[string]bool, len(infos))
	for _, info := range infos {
		if s.cfg.Runs != nil && info.Name == RunStartTool {
			s.log.Warn("mcp: tool not served: its name is the run tool's", logkey.Tool, info.Name)
			continue
		}
		t, err := Tool(info)
		if err != nil {
			s.log.Warn("mcp: tool not served", logkey.Tool, info.Name, logkey.Err, err)
			continue
		}
		seen[t.Name] = true
		b, err := json.Marshal(t)
		if err != nil {
			continue
		}
		if bytes.Equal(s.served[t.Name], b) {
			continue
		}
		s.served[t.Name] = b
		s.sdk.AddTool(t, s.handler(t.Name))
	}
	var gone []string
	for name := range s.served {
		if !seen[name] {
			gone = append(gone, name)
			delete(s.served, name)
		}
	}
	if len(gone) > 0 {
		s.sdk.RemoveTools(gone...)
	}
	return nil
}

// ErrNotObject is wrapped by Tool's error for a tool whose input schema
// is not an object's: MCP tools take JSON objects.
var ErrNotObject = errors.New("input schema is not of type object")

// Tool returns info as an MCP tool: its name, description, input schema,
// output schema (only an object's: MCP's structured results are
// objects) and the annotations of its side-effect class.
func Tool(info capabilities.ToolInfo) (*sdk.Tool, error) {
	if !objectSchema(info.InputSchema) {
		return nil, fmt.Errorf("mcpserver: tool %s: %w", info.Name, ErrNotObject)
	}
	t := &sdk.Tool{Name: info.Name, Description: info.Description, InputSchema: info.InputSchema,
		Annotations: Annotations(info.SideEffects, len(info.Grants.Network) > 0)}
	if objectSchema(info.OutputSchema) {
		t.OutputSchema = info.OutputSchema
	}
	return t, nil
}

// objectSchema reports whether schema is a JSON Schema of "type":
// "object".
func objectSchema(schema json.RawMessage) bool {
	var s struct {
		Type any `json:"type"`
	}
	return len(schema) > 0 && json.Unmarshal(schema, &s) == nil && s.Type == "object"
}

// Annotations returns the MCP hints of a side-effect class: read_only is
// read-only (and so idempotent, not destructive); idempotent_write may
// overwrite (destructive) but repeating it changes nothing more;
// non_idempotent_write is destructive and not idempotent; external acts
// on the world outside the machine (open world) and is neither
// idempotent nor harmless. An unknown class gets MCP's own defaults
// (not read-only, destructive, not idempotent, open world).
// openWorld, for the other classes, says whether the tool holds a
// network grant: it can reach beyond the sandbox's files.
func Annotations(class keel.SideEffect, network bool) *sdk.ToolAnnotations {
	yes, no := true, false
	a := &sdk.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &yes}
	world := &no
	if network {
		world = &yes
	}
	switch class {
	case keel.SideEffectReadOnly:
		a.ReadOnlyHint, a.IdempotentHint, a.DestructiveHint, a.OpenWorldHint = true, true, &no, world
	case keel.SideEffectIdempotentWrite:
		a.IdempotentHint, a.OpenWorldHint = true, world
	case keel.SideEffectNonIdempotentWrite:
		a.OpenWorldHint = world
	case keel.SideEffectExternal:
	}
	return a
}

// handler calls tool name for a client's tools/call.
func (s *Server) handler(name string) sdk.ToolHandler {
	return func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		args := req.Params.Arguments
		if len(bytes.TrimSpace(args)) == 0 || bytes.Equal(bytes.TrimSpace(args), []byte("null")) {
			args = json.RawMessage("{}")
		}
		ctx, cancel := s.withRequest(ctx, req.Extra)
		defer cancel()
		return s.callTool(ctx, name, args, req.Session)
	}
}

// canElicit reports whether the client of ss declared MCP elicitation
// in a form it can answer: form mode (or no mode, the older form).
func canElicit(ss *sdk.ServerSession) bool {
	if ss == nil {
		return false
	}
	p := ss.InitializeParams()
	if p == nil || p.Capabilities == nil || p.Capabilities.Elicitation == nil {
		return false
	}
	e := p.Capabilities.Elicitation
	return e.Form != nil || e.URL == nil
}

// approve asks the user of ss, through MCP elicitation (form mode, an
// empty form: accept or decline), whether tool may run with args, which
// the question shows in full with their SHA-256, as the audit trail
// keeps it. Over HTTP it first waits for the session's notification
// stream, which carries the question (see HTTPConfig.StreamWait).
func (s *Server) approve(ctx context.Context, ss *sdk.ServerSession, tool string, args json.RawMessage, d keel.PolicyDecision) (bool, error) {
	if wait := time.Duration(s.streamWait.Load()); wait > 0 && ss.ID() != "" {
		if err := s.streams.wait(ctx, ss.ID(), wait); err != nil {
			return false, fmt.Errorf("mcpserver: elicitation: %w", err)
		}
	}
	sum := sha256.Sum256(args)
	msg := fmt.Sprintf("keel's policy asks before this tool call runs.\n\nTool: %s\nArguments: %s\n(SHA-256 %x)\n\nWhy: %s\n\nAccept runs this call, with exactly these arguments, once.",
		tool, args, sum, d.Explanation)
	res, err := ss.Elicit(ctx, &sdk.ElicitParams{Mode: "form", Message: msg,
		RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}},
		Meta:            sdk.Meta{"keel/tool": tool, "keel/args_sha256": hex.EncodeToString(sum[:])}})
	if err != nil {
		return false, fmt.Errorf("mcpserver: elicitation: %w", err)
	}
	return res.Action == "accept", nil
}

// requestHeader carries, from HTTPHandler to a method's handler, the
// key of the HTTP request's context in Server.requests.
const requestHeader = "Keel-Mcp-Request"

// withRequest returns ctx, also cancelled when the HTTP request that
// carried extra's message ends (its client went away), and its cancel.
func (s *Server) withRequest(ctx context.Context, extra *sdk.RequestExtra) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	if extra == nil || extra.Header == nil {
		return ctx, cancel
	}
	rc, ok := s.requests.Load(extra.Header.Get(requestHeader))
	if !ok {
		return ctx, cancel
	}
	stop := context.AfterFunc(rc.(context.Context), cancel)
	return ctx, func() { stop(); cancel() }
}

// ClientName is the audit trail's name of an MCP client: "mcp:" and the
// name it gave in initialize's clientInfo ("mcp" if none), at most 200
// bytes.
func ClientName(ss *sdk.ServerSession) string {
	name := "mcp"
	if ss != nil {
		if p := ss.InitializeParams(); p != nil && p.ClientInfo != nil && p.ClientInfo.Name != "" {
			name += ":" + p.ClientInfo.Name
		}
	}
	if len(name) > 200 {
		name = strings.ToValidUTF8(name[:200], "")
	}
	return name
}

// Result is a tool's output as an MCP result: the JSON as text, and as
// structuredContent when it is an object.
func Result(out json.RawMessage) *sdk.CallToolResult {
	r := &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: string(out)}}}
	if t := bytes.TrimSpace(out); len(t) > 0 && t[0] == '{' {
		r.StructuredContent = json.RawMessage(t)
	}
	return r
}

// ErrorMetaKey is the _meta key of an error result's keel tool error.
const ErrorMetaKey = "keel/error"

// ErrorResult is a keel tool error as an MCP result: isError, the error
// as text ("invalid_input: /text: ...") and, in _meta under ErrorMetaKey,
// as {"code", "message", "path"}. It has no structuredContent: clients
// (the TypeScript SDK's) check any structuredContent of a result, error
// or not, against the tool's outputSchema.
func ErrorResult(te *keel.ToolError) *sdk.CallToolResult {
	return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: te.Error()}},
		Meta: sdk.Meta{ErrorMetaKey: te}}
}

// scopeOf is the keel scope an MCP method needs over HTTP: run for
// tools/call, none for the handshake, pings and notifications, read for
// every other.
func scopeOf(method string) string {
	switch {
	case method == "tools/call":
		return keel.ScopeRun
	case method == "initialize" || method == "ping" || len(method) > 14 && method[:14] == "notifications/":
		return ""
	}
	return keel.ScopeRead
}

// checkScopes refuses a request whose credential (the TokenInfo of an
// HTTP request) lacks the scope its method needs. A request with no
// TokenInfo (stdio: the daemon checks the scopes of `keel mcp`'s own
// calls) passes.
func checkScopes(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		need := scopeOf(method)
		if extra := req.GetExtra(); need != "" && extra != nil && extra.TokenInfo != nil && !slices.Contains(extra.TokenInfo.Scopes, need) {
			return nil, &jsonrpc.Error{Code: CodeForbidden, Message: fmt.Sprintf("forbidden: %s needs a token with the %q scope (keel token create --scope %s)", method, need, need)}
		}
		return next(ctx, method, req)
	}
}

// Run serves the server on t (such as &sdk.StdioTransport{}) until the
// client disconnects or ctx is done.
func (s *Server) Run(ctx context.Context, t sdk.Transport) error {
	return s.sdk.Run(ctx, t)
}

// Caller is who an HTTP request authenticated as, for HTTPConfig.Caller.
type Caller struct {
	// ID names the credential (such as "client_token:editor"): a session
	// is bound to the credential that opened it.
	ID string
	// Scopes are the keel scopes it holds.
	Scopes []string
}

// HTTPConfig configures Server.HTTPHandler. Caller is required.
type HTTPConfig struct {
	// Caller returns who a request authenticated as; false refuses it
	// (401). The handler is meant to be behind the daemon's own checks
	// of the token, Origin and Host (ipc.Route); Caller reads their
	// outcome.
	Caller func(*http.Request) (Caller, bool)
	// SessionTimeout closes a session that has had no request for this
	// long (one whose last requests were tools/call answered directly,
	// after 9/10 of it to all of it: see fastcall.go). Default 1 h.
	SessionTimeout time.Duration
	// MaxRequestBytes bounds a request's body; a larger one is refused
	// (413). Default 4 MiB.
	MaxRequestBytes int64
	// StreamWait bounds how long an elicitation waits for its session's
	// notification stream (the client's GET), which carries it: clients
	// open the stream after initialize without waiting for it, so a
	// call made at once can ask first. A client that has none open by
	// then is not asked (the call is refused, ErrNoStream). Default 10 s.
	StreamWait time.Duration
}

// HTTPHandler returns the streamable HTTP transport of s (MCP
// 2025-06-18 and later): POST for requests, GET for the stream of
// notifications such as tools/list_changed, DELETE to end a session.
// Each request is checked by cfg.Caller; the scope each method needs is
// checked against what it returns (see package doc). A plain tools/call
// of a served tool in a session is answered by the handler itself,
// without the SDK's session machinery, with the same checks and the
// same answer (fastcall.go); every other request goes to the SDK.
func (s *Server) HTTPHandler(cfg HTTPConfig) http.Handler {
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = time.Hour
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = 4 << 20
	}
	if cfg.StreamWait <= 0 {
		cfg.StreamWait = 10 * time.Second
	}
	s.streamWait.Store(int64(cfg.StreamWait))
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s.sdk }, &sdk.StreamableHTTPOptions{
		Logger: s.log, SessionTimeout: cfg.SessionTimeout, MaxRequestBodyBytes: cfg.MaxRequestBytes,
		// A client that goes away ends its call (protocol 2026-07-28 on;
		// older clients send notifications/cancelled).
		PropagateRequestCancellation: true,
		// A response is one JSON body, not a server-sent event stream:
		// keel sends nothing during a call, and the stream's framing and
		// flushes cost about 2 ms a call here (bench/mcp). Notifications
		// (tools/list_changed) still reach a client on its GET stream.
		JSONResponse: true,
	})
	// A call ends when its request's connection drops, as with the
	// newest protocol: the SDK ties a handler to its HTTP request only
	// there (PropagateRequestCancellation), so an older client that went
	// away would leave its call waiting (such as for an elicitation's
	// answer) until the session timed out.
	tied := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		session := r.Header.Get("Mcp-Session-Id")
		if r.Method == http.MethodPost && session != "" {
			if s.direct(w, r, session, cfg.MaxRequestBytes, cfg.SessionTimeout) {
				return
			}
			if hs := s.session(r, session); hs != nil {
				hs.sdkSeen.Store(time.Now().UnixNano())
			}
		}
		if r.Method == http.MethodDelete && s.session(r, session) != nil {
			s.sessions.Delete(session) // before the SDK ends it
		}
		if r.Method == http.MethodPost {
			id := rand.Text()
			r.Header.Set(requestHeader, id) // replaces any the client sent
			s.requests.Store(id, r.Context())
			defer s.requests.Delete(id)
		}
		if id := session; r.Method == http.MethodGet && id != "" {
			// The SDK flushes a notification stream's headers while it
			// holds the stream, before it lets a message through: once
			// flushed, an elicitation sent reaches the client.
			sw := &streamWriter{ResponseWriter: w, ready: func() { s.streams.opened(id) }}
			defer func() {
				if sw.done {
					s.streams.closed(id)
				}
			}()
			w = sw
		}
		h.ServeHTTP(w, r)
		if r.Method == http.MethodPost && session == "" {
			if id := w.Header().Get("Mcp-Session-Id"); id != "" {
				s.opened(r, id)
			}
		}
	})
	verify := func(_ context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		who, ok := cfg.Caller(r)
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{Scopes: who.Scopes, UserID: who.ID}, nil
	}
	return auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(tied)
}
