package mcpclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/keel-runtime/keel/bridges/mcpclient/mcpfile"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/schema"
)

// States of a server (capabilities.MCPServerDecl.State).
const (
	StateConnecting = "connecting"
	StateReady      = "ready"
	StateDown       = "down" // not connected; keel tries again (Error says why)
	StateNotGranted = "not_granted"
)

// remoteTool is one tool of a server.
type remoteTool struct {
	remote string // its name on the server
	spec   keel.ToolSpec
	input  *schema.Schema
}

// server is one configured MCP server. Its goroutine (run) owns the
// connection: it connects, lists the tools, refreshes them on
// tools/list_changed, and reconnects with backoff when the connection
// ends, until stop.
type server struct {
	m      *Manager
	name   string
	cfg    mcpfile.ServerConfig
	labels []string
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns
	first  chan struct{} // closed after the first connection attempt
	kick   chan struct{} // a tools/list_changed to act on
	stderr *tail         // a stdio server's last stderr output

	mu      sync.Mutex
	state   string
	err     string
	cs      *sdk.ClientSession
	sessCtx context.Context // cancelled when cs ends (or the server stops)
	tools   map[string]*remoteTool
	order   []string // tool names as the server listed them
	impl    *sdk.Implementation
	pid     int
}

func newServer(m *Manager, name string, cfg mcpfile.ServerConfig) *server {
	labels, _ := keel.NormalizeLabels(cfg.Labels) // checked by mcpfile.ReadFile
	s := &server{m: m, name: name, cfg: cfg, labels: labels, done: make(chan struct{}), first: make(chan struct{}),
		kick: make(chan struct{}, 1), state: StateConnecting, tools: map[string]*remoteTool{}, stderr: &tail{max: 2048}}
	s.ctx, s.cancel = context.WithCancel(m.ctx)
	return s
}

// stop ends the server's goroutine (and its process) and waits for it.
func (s *server) stop() {
	s.cancel()
	<-s.done
}

// timeout is how long a call may take.
func (s *server) timeout() time.Duration {
	if s.cfg.TimeoutSeconds > 0 {
		return time.Duration(s.cfg.TimeoutSeconds) * time.Second
	}
	return s.m.cfg.CallTimeout
}

// run is the server's goroutine.
func (s *server) run() {
	defer s.m.wg.Done()
	defer close(s.done)
	firstDone := sync.OnceFunc(func() { close(s.first) })
	defer firstDone()
	log := s.m.log.With(logkey.Server, s.name)
	if !s.cfg.Granted() {
		s.set(StateNotGranted, fmt.Sprintf("%v (command %q)", mcpfile.ErrNotGranted, s.cfg.Command))
		s.m.changed()
		log.Warn("mcp: stdio server not started: it has no native grant for its command as it is", logkey.Reason, mcpfile.ErrNotGranted)
		firstDone()
		<-s.ctx.Done()
		return
	}
	backoff := s.m.cfg.MinBackoff
	for {
		start := time.Now()
		err := s.session(firstDone)
		firstDone()
		if s.ctx.Err() != nil {
			return
		}
		if time.Since(start) > s.m.cfg.MaxBackoff {
			backoff = s.m.cfg.MinBackoff // it was up a while: not a crash loop
		}
		msg := fmt.Sprintf("%v; keel tries again in %s", err, backoff.Round(time.Millisecond))
		if t := s.stderr.String(); t != "" {
			msg += "; its stderr ended with: " + t
		}
		s.set(StateDown, msg)
		s.m.changed()
		log.Warn("mcp: server not connected", logkey.Err, err, logkey.After, backoff)
		t := time.NewTimer(backoff)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, s.m.cfg.MaxBackoff)
	}
}

// set records the server's state and why.
func (s *server) set(state, why string) {
	s.mu.Lock()
	s.state, s.err = state, why
	s.mu.Unlock()
}

// session connects, lists the tools and serves the connection until it
// ends or the server stops, and returns why it ended.
func (s *server) session(connected func()) error {
	s.set(StateConnecting, "")
	s.m.log.Debug("mcp: connecting", logkey.Server, s.name)
	s.stderr.reset()
	client := sdk.NewClient(&sdk.Implementation{Name: "keel", Version: s.m.cfg.Version}, &sdk.ClientOptions{
		// No roots, sampling or elicitation: keel offers servers tools' calls only.
		Capabilities: &sdk.ClientCapabilities{},
		ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) {
			select {
			case s.kick <- struct{}{}:
			default: // a refresh is pending: it sees this change too
			}
		},
	})
	transport, cmd, err := s.transport()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(s.ctx, s.m.cfg.ConnectTimeout)
	defer cancel()
	cs, err := client.Connect(cctx, transport, nil)
	if err != nil {
		// Connect has ended the process it started, if any.
		return fmt.Errorf("connect: %w", err)
	}
	ended := make(chan struct{})
	sessCtx, sessEnd := context.WithCancel(s.ctx)
	var waitErr error
	go func() {
		waitErr = cs.Wait()
		sessEnd()
		close(ended)
	}()
	defer func() {
		cs.Close()
		<-ended
	}()
	s.m.log.Debug("mcp: initialized", logkey.Server, s.name)
	if err := s.refresh(cctx, cs); err != nil {
		return fmt.Errorf("list tools: %w", err)
	}
	pid := 0
	if cmd != nil && cmd.Process != nil {
		pid = cmd.Process.Pid
	}
	s.mu.Lock()
	s.cs, s.sessCtx, s.impl, s.pid = cs, sessCtx, cs.InitializeResult().ServerInfo, pid
	s.state, s.err = StateReady, ""
	n := len(s.order)
	s.mu.Unlock()
	defer func() {
		// Not ready from the moment the session is gone: run records
		// why (StateDown) only after this returns, and Servers must not
		// show a ready server without its session and process meanwhile.
		s.mu.Lock()
		s.cs, s.sessCtx, s.pid = nil, nil, 0
		s.state, s.err = StateConnecting, ""
		s.mu.Unlock()
	}()
	s.m.log.Info("mcp: server connected", logkey.Server, s.name, logkey.Tools, n)
	connected()
	s.m.changed()
	for {
		select {
		case <-s.ctx.Done():
			return s.ctx.Err()
		case <-ended:
			if waitErr == nil {
				waitErr = errors.New("closed")
			}
			return fmt.Errorf("the connection ended: %w", waitErr)
		case <-s.kick:
			rctx, cancel := context.WithTimeout(s.ctx, s.m.cfg.ConnectTimeout)
			err := s.refresh(rctx, cs)
			cancel()
			if err != nil {
				s.m.log.Warn("mcp: refresh the tool list after tools/list_changed", logkey.Server, s.name, logkey.Err, err)
				continue
			}
			s.m.log.Debug("mcp: tool list refreshed after tools/list_changed", logkey.Server, s.name)
			s.m.changed()
		}
	}
}

// transport is the server's transport; cmd is a stdio server's process,
// started by Connect.
func (s *server) transport() (sdk.Transport, *exec.Cmd, error) {
	if s.cfg.Transport() == mcpfile.TransportHTTP {
		hc := &http.Client{Transport: headers{h: s.cfg.Headers, next: http.DefaultTransport}}
		return &sdk.StreamableClientTransport{Endpoint: s.cfg.URL, HTTPClient: hc, MaxRetries: 2}, nil, nil
	}
	cmd := exec.Command(s.cfg.Command[0], s.cfg.Command[1:]...)
	cmd.Env = os.Environ()
	for k, v := range s.cfg.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stderr = s.stderr
	return &sdk.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, cmd, nil
}

// headers adds the configured headers to every request.
type headers struct {
	h    map[string]string
	next http.RoundTripper
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	if len(h.h) > 0 {
		r = r.Clone(r.Context())
		for k, v := range h.h {
			r.Header.Set(k, v)
		}
	}
	return h.next.RoundTrip(r)
}

// refresh lists the server's tools and makes them the ones served. A
// tool whose name cannot be a keel tool's (too long, or the same as
// another's once mapped) or whose input schema does not compile is left
// out, and logged.
func (s *server) refresh(ctx context.Context, cs *sdk.ClientSession) error {
	tools := map[string]*remoteTool{}
	var order []string
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return err
		}
		name, ok := mcpfile.ToolName(s.name, t.Name)
		if !ok || tools[name] != nil {
			s.m.log.Warn("mcp: tool left out: its name does not map to a tool name models accept ([A-Za-z0-9_-], at most 64 with the prefix), or maps to another tool's", logkey.Server, s.name, logkey.Tool, t.Name)
			continue
		}
		in, err := json.Marshal(t.InputSchema)
		if err != nil || len(in) == 0 || string(in) == "null" {
			in = json.RawMessage(`{"type":"object"}`)
		}
		sch, err := schema.Compile(name, "input_schema", in)
		if err != nil {
			s.m.log.Warn("mcp: tool left out: its input schema does not compile", logkey.Server, s.name, logkey.Tool, t.Name, logkey.Err, err)
			continue
		}
		var out json.RawMessage
		if t.OutputSchema != nil {
			out, _ = json.Marshal(t.OutputSchema)
		}
		desc := t.Description
		if desc == "" && t.Annotations != nil {
			desc = t.Annotations.Title
		}
		tools[name] = &remoteTool{remote: t.Name, input: sch,
			spec: keel.ToolSpec{Name: name, Description: desc, InputSchema: in, OutputSchema: out, SideEffects: Class(t.Annotations)}}
		order = append(order, name)
	}
	s.mu.Lock()
	s.tools, s.order = tools, order
	s.mu.Unlock()
	return nil
}

// Class is keel's side-effect class of an MCP tool from its annotations,
// which the server declares (hints, not guarantees): readOnlyHint is
// read_only; idempotentHint idempotent_write; a tool that says it is
// neither (destructiveHint or openWorldHint given) non_idempotent_write,
// or external when it says it reaches an open world; and a tool that
// says nothing (no annotations, or none of the hints) is external, a
// non-idempotent effect outside the machine: after a crash the engine
// asks a person before running it again.
func Class(a *sdk.ToolAnnotations) keel.SideEffect {
	switch {
	case a == nil || !a.ReadOnlyHint && !a.IdempotentHint && a.DestructiveHint == nil && a.OpenWorldHint == nil:
		return keel.SideEffectExternal
	case a.ReadOnlyHint:
		return keel.SideEffectReadOnly
	case a.IdempotentHint:
		return keel.SideEffectIdempotentWrite
	case a.OpenWorldHint != nil && *a.OpenWorldHint:
		return keel.SideEffectExternal
	}
	return keel.SideEffectNonIdempotentWrite
}

// tool returns the tool named name (a keel name), nil if none.
func (s *server) tool(name string) *remoteTool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tools[name]
}

// toolList returns the tools in the server's order.
func (s *server) toolList() []*remoteTool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*remoteTool, 0, len(s.order))
	for _, n := range s.order {
		out = append(out, s.tools[n])
	}
	return out
}

// where is the server as the audit trail's grant names it: "mcp:NAME URL"
// or "mcp:NAME stdio:COMMAND".
func (s *server) where() string {
	if s.cfg.Transport() == mcpfile.TransportHTTP {
		return "mcp:" + s.name + " " + s.cfg.URL
	}
	return "mcp:" + s.name + " stdio:" + strings.Join(s.cfg.Command, " ")
}

// build names the server for the audit trail: its version as it reports
// it, and where it is.
func (s *server) build() intercept.ToolBuild {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := intercept.ToolBuild{Grants: []string{s.where()}}
	if s.impl != nil {
		b.Version = s.impl.Name + " " + s.impl.Version
	}
	return b
}

// decl declares the server for env.describe.
func (s *server) decl() capabilities.MCPServerDecl {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := capabilities.MCPServerDecl{Name: s.name, Transport: s.cfg.Transport(), URL: s.cfg.URL, Command: s.cfg.Command,
		Labels: s.labels, State: s.state, Error: s.err, PID: s.pid, Tools: []string{}}
	d.NativeGranted = d.Transport == mcpfile.TransportStdio && s.cfg.Granted()
	if s.impl != nil {
		d.Server = strings.TrimSpace(s.impl.Name + " " + s.impl.Version)
	}
	d.Tools = append(d.Tools, s.order...)
	return d
}

// call calls t on the server for inv (see Manager.Call).
func (s *server) call(ctx context.Context, t *remoteTool, inv keel.ToolInvocation) (json.RawMessage, *keel.ToolError) {
	args := inv.Args
	if len(bytes.TrimSpace(args)) == 0 || string(bytes.TrimSpace(args)) == "null" {
		args = json.RawMessage("{}")
	}
	if v, err := t.input.Validate(args); err != nil {
		return nil, &keel.ToolError{Code: keel.ToolInvalidInput, Message: fmt.Sprintf("input is not valid JSON: %v", err)}
	} else if v != nil {
		return nil, &keel.ToolError{Code: keel.ToolInvalidInput, Path: v.Pointer, Message: v.Message}
	}
	if inv.Touched != nil {
		inv.Touched.Labels = s.labels
	}
	if s.cfg.Transport() == mcpfile.TransportHTTP {
		if inv.Touched != nil {
			if u, err := url.Parse(s.cfg.URL); err == nil {
				inv.Touched.Hosts = []string{hostPort(u)}
			}
		}
		if inv.Egress != nil {
			if err := inv.Egress(ctx, s.cfg.URL); err != nil {
				var r *keel.EgressRefusal
				if errors.As(err, &r) && inv.Touched != nil {
					inv.Touched.Refused = append(inv.Touched.Refused, *r)
				}
				var te *keel.ToolError
				if errors.As(err, &te) {
					return nil, te
				}
				return nil, &keel.ToolError{Code: keel.ToolPolicyDenied, Message: err.Error()}
			}
		}
	}
	s.mu.Lock()
	cs, sessCtx, state, why := s.cs, s.sessCtx, s.state, s.err
	s.mu.Unlock()
	if cs == nil {
		if why == "" {
			why = state
		}
		return nil, &keel.ToolError{Code: keel.ToolCrashed, Message: fmt.Sprintf("MCP server %s is not connected (%s); the call was not sent", s.name, why)}
	}
	timeout := s.timeout()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// The connection's end (or the server's stop) ends the call at once.
	stop := context.AfterFunc(sessCtx, cancel)
	defer stop()
	res, err := cs.CallTool(cctx, &sdk.CallToolParams{Name: t.remote, Arguments: args})
	ended := sessCtx.Err() != nil
	if err != nil {
		var je *jsonrpc.Error
		switch {
		case ended:
			return nil, &keel.ToolError{Code: keel.ToolCrashed, Message: fmt.Sprintf("the connection to MCP server %s ended during the call; it may or may not have taken effect", s.name)}
		case ctx.Err() != nil:
			return nil, &keel.ToolError{Code: keel.ToolTimeout, Message: fmt.Sprintf("the caller stopped waiting for MCP server %s: %v", s.name, context.Cause(ctx))}
		case cctx.Err() != nil:
			return nil, &keel.ToolError{Code: keel.ToolTimeout, Message: fmt.Sprintf("MCP server %s did not answer within %s", s.name, timeout)}
		case errors.As(err, &je) && localCodes[je.Code]:
			// The SDK's own: the transport failed (below).
		case errors.As(err, &je) && je.Code == jsonrpc.CodeInvalidParams:
			return nil, &keel.ToolError{Code: keel.ToolInvalidInput, Message: fmt.Sprintf("MCP server %s refused the arguments: %s", s.name, je.Message)}
		case errors.As(err, &je):
			return nil, &keel.ToolError{Code: keel.ToolFailed, Message: fmt.Sprintf("MCP server %s: %s (JSON-RPC error %d)", s.name, je.Message, je.Code)}
		}
		// The transport failed: the connection is not to be trusted. Its
		// close ends the session, and the server's goroutine reconnects.
		cs.Close()
		return nil, &keel.ToolError{Code: keel.ToolCrashed, Message: fmt.Sprintf("the connection to MCP server %s failed during the call (%v); it may or may not have taken effect", s.name, err)}
	}
	return result(s.name, res, s.m.cfg.MaxOutputBytes)
}

// localCodes are the JSON-RPC codes the Go SDK gives errors of its own
// side of the connection: client closing (-32003), server closing
// (-32004), rejected by the transport (-32005: the request did not get
// through, the HTTP connection failed). They are no answer of the server.
var localCodes = map[int64]bool{-32003: true, -32004: true, -32005: true}

// result is an MCP result as a keel tool's: its structuredContent when
// it has one, else {"text": ...} when all its content is text, else
// {"content": [...]}, the content blocks as MCP gives them. An error
// result is a tool_error with its text.
func result(server string, res *sdk.CallToolResult, maxBytes int) (json.RawMessage, *keel.ToolError) {
	var text []string
	allText := true
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			text = append(text, tc.Text)
		} else {
			allText = false
		}
	}
	if res.IsError {
		msg := strings.Join(text, "\n")
		if msg == "" {
			msg = "the tool failed and said nothing more"
		}
		return nil, &keel.ToolError{Code: keel.ToolFailed, Message: fmt.Sprintf("MCP server %s: %s", server, msg)}
	}
	var out []byte
	var err error
	switch {
	case res.StructuredContent != nil:
		out, err = json.Marshal(res.StructuredContent)
	case allText:
		out, err = json.Marshal(map[string]string{"text": strings.Join(text, "\n")})
	default:
		content := res.Content
		if content == nil {
			content = []sdk.Content{}
		}
		out, err = json.Marshal(map[string]any{"content": content})
	}
	if err != nil {
		return nil, &keel.ToolError{Code: keel.ToolFailed, Message: fmt.Sprintf("MCP server %s: the result does not encode: %v", server, err)}
	}
	if len(out) > maxBytes {
		return nil, &keel.ToolError{Code: keel.ToolResourceExhausted, Message: fmt.Sprintf("MCP server %s: the result is %d bytes, over the limit of %d", server, len(out), maxBytes)}
	}
	return out, nil
}

// hostPort is u's host:port, with the scheme's default port.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return strings.ToLower(u.Hostname()) + ":" + port
}

// tail keeps the last max bytes written to it (a stdio server's stderr,
// for the error of a server that exits). Safe for concurrent use.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.ToValidUTF8(strings.TrimSpace(string(t.b)), "")
}

func (t *tail) reset() {
	t.mu.Lock()
	t.b = nil
	t.mu.Unlock()
}
