package acp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
)

// ProtocolVersion is the ACP protocol version the agent speaks.
const ProtocolVersion = 1

// DefaultMaxLineBytes is the longest message the agent reads (Config.
// MaxLineBytes): 8 MiB.
const DefaultMaxLineBytes = 8 << 20

// keyPrefix starts the idempotency key of each run of a session:
// keyPrefix + session ID + "/" + turn number.
const keyPrefix = "acp:"

// Runs is what the agent needs of keel's runs: the protocol's methods of
// those names (docs/protocol.md). keel acp gives it a connection to the
// daemon. Errors should wrap keel.ErrInvalid, keel.ErrNotFound and
// keel.ErrConflict where the daemon said so. Its methods are called
// concurrently.
type Runs interface {
	// Start is run.start.
	Start(ctx context.Context, req keel.StartRequest) (keel.Run, error)
	// Fork is run.fork.
	Fork(ctx context.Context, req keel.ForkRequest) (keel.Run, error)
	// Cancel is run.cancel.
	Cancel(ctx context.Context, id keel.RunID) error
	// Approve is run.approve.
	Approve(ctx context.Context, a Approval) error
	// Get is run.get: the run, its journal and its trace.
	Get(ctx context.Context, id keel.RunID) (Detail, error)
	// List is run.list.
	List(ctx context.Context, q keel.RunQuery) (keel.RunPage, error)
	// Tools is tools.list: the installed tools, whose side-effect
	// classes give the editor each call's kind.
	Tools(ctx context.Context) ([]keel.ToolSpec, error)
	// Subscribe is run.subscribe: the run's events after afterSeq, then
	// live ones, on the channel, until stop is called (run.unsubscribe)
	// or the connection ends (the channel is then closed).
	Subscribe(ctx context.Context, id keel.RunID, afterSeq int64) (events <-chan keel.Event, stop func(), err error)
}

// Detail is a run with its journal and its trace (run.get).
type Detail struct {
	Run    keel.Run
	Events []keel.Event
	Spans  []keel.Span
}

// Approval is a person's answer to an approval.requested (run.approve).
type Approval struct {
	Run        keel.RunID
	CallID     string
	ArgsSHA256 string
	Approved   bool
	Reason     string
}

// Config configures an Agent. The zero value of each field but Runs is
// safe.
type Config struct {
	// Runs reaches the daemon; required.
	Runs Runs
	// Version is the agent's version in initialize's agentInfo.
	Version string
	// MaxLineBytes is the longest message read; longer ones are refused
	// with a JSON-RPC error and skipped. 0 means DefaultMaxLineBytes.
	MaxLineBytes int
	// Logger receives what the client is not told (ignored MCP servers,
	// failed writes); nil discards it.
	Logger *slog.Logger
}

// Agent is keel as an ACP agent: sessions are keel runs. Each session's
// first prompt starts a run, each later prompt forks the session's last
// run with the prompt as the fork's message (keel.ForkRequest.Message),
// so the model reads the whole conversation and the run's journal holds
// it. It is safe for concurrent use; Serve may be called once.
type Agent struct {
	cfg Config
	log *slog.Logger
	c   *conn

	mu       sync.Mutex
	sessions map[string]*session
}

// session is one ACP session.
type session struct {
	id  string
	cwd string

	mu      sync.Mutex
	head    keel.Run // the run of the last turn; ID "" before the first prompt
	turns   int      // runs made so far
	turn    *turn    // the prompt in progress, if any
	perTurn int      // model steps a turn may take
}

// turn is one session/prompt in progress.
type turn struct {
	run       keel.RunID
	cancelled bool
	cancel    context.CancelFunc
	// background marks the follower of a run that session/load found
	// still going (no prompt waits for it); done is closed when the
	// turn is over.
	background bool
	done       chan struct{}
}

// New returns an Agent for cfg.
func New(cfg Config) (*Agent, error) {
	if cfg.Runs == nil {
		return nil, errors.New("acp: Config.Runs is required")
	}
	if cfg.MaxLineBytes <= 0 {
		cfg.MaxLineBytes = DefaultMaxLineBytes
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Agent{cfg: cfg, log: log, sessions: map[string]*session{}}, nil
}

// Serve speaks ACP with the client on r and w (the agent's stdin and
// stdout) until r ends (nil) or ctx is done. Runs go on in the daemon
// when it returns.
func (a *Agent) Serve(ctx context.Context, r io.Reader, w io.Writer) error {
	a.c = &conn{w: w, maxLine: a.cfg.MaxLineBytes, handle: a.handle, errorObject: errorObject, pending: map[string]chan *message{}}
	return a.c.serve(ctx, r)
}

// errorObject maps an error to the JSON-RPC error the client gets.
func errorObject(err error) *rpcError {
	var re *rpcError
	switch {
	case errors.As(err, &re):
		return re
	case errors.Is(err, keel.ErrInvalid):
		return &rpcError{Code: codeInvalidParams, Message: err.Error()}
	case errors.Is(err, keel.ErrNotFound):
		return &rpcError{Code: codeNotFound, Message: err.Error()}
	default:
		return &rpcError{Code: codeInternal, Message: err.Error()}
	}
}

// decode decodes params into p; a failure is invalid params.
func decode(params json.RawMessage, p any) error {
	if len(params) == 0 {
		params = []byte("{}")
	}
	if err := json.Unmarshal(params, p); err != nil {
		return &rpcError{Code: codeInvalidParams, Message: "invalid params: " + err.Error()}
	}
	return nil
}

func invalid(format string, args ...any) error {
	return &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf(format, args...)}
}

func (a *Agent) handle(ctx context.Context, method string, params json.RawMessage) (any, error) {
	switch method {
	case "initialize":
		var p struct {
			ProtocolVersion *int `json:"protocolVersion"`
		}
		if err := decode(params, &p); err != nil {
			return nil, err
		}
		if p.ProtocolVersion == nil {
			return nil, invalid("initialize: protocolVersion is required")
		}
		return map[string]any{
			// The client's version if we speak it, else ours: the client
			// then decides whether to go on.
			"protocolVersion": ProtocolVersion,
			"agentCapabilities": map[string]any{
				"loadSession":        true,
				"promptCapabilities": map[string]bool{"image": false, "audio": false, "embeddedContext": true},
				"mcpCapabilities":    map[string]bool{"http": false, "sse": false},
			},
			"agentInfo":   map[string]string{"name": "keel", "title": "keel", "version": a.cfg.Version},
			"authMethods": []any{},
		}, nil
	case "authenticate":
		return map[string]any{}, nil
	case "session/new":
		return a.newSession(params)
	case "session/load":
		return a.loadSession(ctx, params)
	case "session/prompt":
		return a.prompt(ctx, params)
	case "session/cancel":
		a.cancel(params)
		return nil, nil
	default:
		return nil, &rpcError{Code: codeMethodNotFound, Message: "method not found: " + method}
	}
}

// sessionParams are the params session/new and session/load share.
type sessionParams struct {
	SessionID  string            `json:"sessionId"`
	Cwd        *string           `json:"cwd"`
	McpServers []json.RawMessage `json:"mcpServers"`
}

// checkCwd checks a session's working directory, which becomes its runs'
// workspace (its .keel/policy.json is their workspace policy layer).
func checkCwd(p sessionParams) (string, error) {
	if p.Cwd == nil {
		return "", invalid("cwd is required")
	}
	cwd := *p.Cwd
	if !filepath.IsAbs(cwd) {
		return "", invalid("cwd %q is not an absolute path", cwd)
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return "", invalid("cwd %q is not a directory", cwd)
	}
	return filepath.Clean(cwd), nil
}

func (a *Agent) ignoreMCP(p sessionParams) {
	if len(p.McpServers) > 0 {
		// keel's tools are its own, installed and granted in keel: the
		// editor's MCP servers are not connected (docs/bridges.md).
		a.log.Warn("acp: the session's MCP servers are ignored; install tools in keel instead", logkey.Servers, len(p.McpServers))
	}
}

func (a *Agent) newSession(params json.RawMessage) (any, error) {
	var p sessionParams
	if err := decode(params, &p); err != nil {
		return nil, err
	}
	cwd, err := checkCwd(p)
	if err != nil {
		return nil, err
	}
	a.ignoreMCP(p)
	var b [12]byte
	rand.Read(b[:])
	s := &session{id: "acp_" + hex.EncodeToString(b[:]), cwd: cwd}
	a.mu.Lock()
	a.sessions[s.id] = s
	a.mu.Unlock()
	return map[string]any{"sessionId": s.id}, nil
}

// loadSession finds the session's last run (the newest run whose
// idempotency key names the session), sends its history as session/update
// notifications, then answers: the session goes on from there.
func (a *Agent) loadSession(ctx context.Context, params json.RawMessage) (any, error) {
	var p sessionParams
	if err := decode(params, &p); err != nil {
		return nil, err
	}
	if p.SessionID == "" {
		return nil, invalid("sessionId is required")
	}
	cwd, err := checkCwd(p)
	if err != nil {
		return nil, err
	}
	a.ignoreMCP(p)
	a.mu.Lock()
	known := a.sessions[p.SessionID]
	a.mu.Unlock()
	if known != nil {
		known.mu.Lock()
		empty := known.head.ID == ""
		known.mu.Unlock()
		if empty {
			return map[string]any{}, nil // nothing said yet: no history
		}
	}
	head, turns, err := a.findHead(ctx, p.SessionID)
	if err != nil {
		return nil, err
	}
	d, err := a.cfg.Runs.Get(ctx, head.ID)
	if err != nil {
		return nil, err
	}
	evs := d.Events
	s := &session{id: p.SessionID, cwd: cwd, head: d.Run, turns: turns}
	r := newRenderer(a.c, s.id, true)
	r.kinds = a.toolKinds(ctx)
	for _, ev := range evs {
		r.event(ev)
	}
	if !d.Run.Status.Terminal() {
		// The run goes on (the daemon resumed it after a restart, or it
		// waits for a person): it is followed as a turn of its own, and
		// the editor is asked about what it waits for.
		tctx, cancel := context.WithCancel(ctx)
		t := &turn{cancel: cancel, background: true, done: make(chan struct{})}
		s.turn = t
		pending := r.pendingApprovals()
		go func() {
			defer close(t.done)
			defer cancel()
			if _, err := a.follow(tctx, s, t, d.Run.ID, d.Run.LastSeq, pending); err != nil {
				a.log.Warn("acp: follow the loaded session's run", logkey.Run, d.Run.ID, logkey.Err, err)
			}
			s.mu.Lock()
			if s.turn == t {
				s.turn = nil
			}
			s.mu.Unlock()
		}()
	}
	a.mu.Lock()
	a.sessions[s.id] = s
	a.mu.Unlock()
	return map[string]any{}, nil
}

// findHead returns the session's last run and its turn number, listing
// runs newest first until one carries the session's key.
func (a *Agent) findHead(ctx context.Context, id string) (keel.Run, int, error) {
	a.mu.Lock()
	s := a.sessions[id]
	a.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		head, turns := s.head, s.turns
		s.mu.Unlock()
		if head.ID != "" {
			return head, turns, nil
		}
	}
	prefix := keyPrefix + id + "/"
	q := keel.RunQuery{Limit: 200}
	for {
		page, err := a.cfg.Runs.List(ctx, q)
		if err != nil {
			return keel.Run{}, 0, err
		}
		for _, r := range page.Runs {
			if n, ok := strings.CutPrefix(r.IdempotencyKey, prefix); ok {
				turns, err := strconv.Atoi(n)
				if err == nil {
					return r, turns, nil
				}
			}
		}
		if page.NextCursor == "" {
			return keel.Run{}, 0, &rpcError{Code: codeNotFound, Message: fmt.Sprintf("session %q not found: no keel run belongs to it", id)}
		}
		q.Cursor = page.NextCursor
	}
}

// sessionOf returns the session id names.
func (a *Agent) sessionOf(id string) (*session, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.sessions[id]
	if s == nil {
		return nil, &rpcError{Code: codeNotFound, Message: fmt.Sprintf("session %q not found (session/new or session/load first)", id)}
	}
	return s, nil
}

// contentBlock is an ACP ContentBlock as a prompt carries it.
type contentBlock struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	URI      string `json:"uri"`
	Name     string `json:"name"`
	Resource *struct {
		URI  string `json:"uri"`
		Text string `json:"text"`
	} `json:"resource"`
}

// promptText is what the run is told: the prompt's text, its resource
// links named, and embedded text resources quoted.
func promptText(blocks []contentBlock) (string, error) {
	var b strings.Builder
	for i, c := range blocks {
		if i > 0 {
			b.WriteString("\n")
		}
		switch c.Type {
		case "text":
			b.WriteString(c.Text)
		case "resource_link":
			fmt.Fprintf(&b, "[%s](%s)", c.Name, c.URI)
		case "resource":
			if c.Resource == nil {
				return "", invalid("prompt[%d]: a resource block without resource", i)
			}
			fmt.Fprintf(&b, "Contents of %s:\n%s", c.Resource.URI, c.Resource.Text)
		default:
			return "", invalid("prompt[%d]: %q content is not supported (see promptCapabilities)", i, c.Type)
		}
	}
	if strings.TrimSpace(b.String()) == "" {
		return "", invalid("the prompt is empty")
	}
	return b.String(), nil
}

// prompt runs one turn: a run (the first) or a fork of the session's
// last run with the prompt as its message, streamed to the client until
// it ends.
func (a *Agent) prompt(ctx context.Context, params json.RawMessage) (any, error) {
	var p struct {
		SessionID string         `json:"sessionId"`
		Prompt    []contentBlock `json:"prompt"`
	}
	if err := decode(params, &p); err != nil {
		return nil, err
	}
	s, err := a.sessionOf(p.SessionID)
	if err != nil {
		return nil, err
	}
	text, err := promptText(p.Prompt)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t := &turn{cancel: cancel, done: make(chan struct{})}
	defer close(t.done)
	var head keel.Run
	var n int
	for {
		s.mu.Lock()
		cur := s.turn
		if cur == nil {
			s.turn = t
			head, n = s.head, s.turns+1
			s.mu.Unlock()
			break
		}
		s.mu.Unlock()
		if !cur.background {
			return nil, &rpcError{Code: codeInvalidRequest, Message: "a prompt of this session is still in progress"}
		}
		// The run a session/load found still going: this prompt is the
		// next turn once it ends.
		select {
		case <-cur.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	defer func() {
		s.mu.Lock()
		s.turn = nil
		s.mu.Unlock()
	}()

	key := keyPrefix + s.id + "/" + strconv.Itoa(n)
	var run keel.Run
	if head.ID == "" {
		run, err = a.cfg.Runs.Start(ctx, keel.StartRequest{Goal: text, Workspace: s.cwd, IdempotencyKey: key})
		if err == nil {
			s.perTurn = run.MaxSteps
		}
	} else {
		run, err = a.fork(ctx, s, head, text, key)
	}
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.head, s.turns = run, n
	s.mu.Unlock()
	// The turn's events: a fork's from after its copied steps.
	reason, err := a.follow(ctx, s, t, run.ID, run.LastSeq, nil)
	if err != nil {
		return nil, err
	}
	return map[string]string{"stopReason": reason}, nil
}

// follow streams the events of the session's run id after afterSeq to
// the client until the run ends, asking the client about each approval
// the policy waits for (and about those in pending, asked before this
// started), and returns the turn's stopReason. A run that failed is an
// error saying why.
func (a *Agent) follow(ctx context.Context, s *session, t *turn, id keel.RunID, afterSeq int64, pending []keel.ApprovalRequestData) (string, error) {
	s.mu.Lock()
	t.run = id
	cancelled := t.cancelled
	s.mu.Unlock()
	if cancelled {
		a.cancelRun(id)
	}
	evs, stop, err := a.cfg.Runs.Subscribe(ctx, id, afterSeq)
	if err != nil {
		return "", err
	}
	defer stop()
	r := newRenderer(a.c, s.id, false)
	r.kinds = a.toolKinds(ctx)
	r.ask = func(ap keel.ApprovalRequestData) { go a.askPermission(ctx, s, id, ap, r.kinds) }
	for _, ap := range pending {
		r.ask(ap)
	}
	for {
		select {
		case ev, ok := <-evs:
			if !ok {
				return "", errors.New("the connection to the keel daemon ended")
			}
			r.event(ev)
			if end, reason := r.ended(); end {
				s.mu.Lock()
				s.head.Status = r.status
				cancelled := t.cancelled
				s.mu.Unlock()
				if cancelled {
					return "cancelled", nil
				}
				if reason == "" {
					return "", fmt.Errorf("the run %s failed: %s", id, r.failure)
				}
				if reason == "end_turn" && r.status == keel.RunSucceeded {
					reason = a.finish(ctx, id, r.runStep)
				}
				return reason, nil
			}
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// toolKinds returns the ACP kind of each installed tool's calls, from its
// side-effect class; nil when the tools cannot be listed (every call is
// then of kind other).
func (a *Agent) toolKinds(ctx context.Context) map[string]string {
	specs, err := a.cfg.Runs.Tools(ctx)
	if err != nil {
		a.log.Warn("acp: list tools", logkey.Err, err)
		return nil
	}
	kinds := make(map[string]string, len(specs))
	for _, sp := range specs {
		kinds[sp.Name] = toolKind(sp.SideEffects)
	}
	return kinds
}

// toolKind is the ACP ToolKind of a call of a tool with side-effect
// class se: reads are read, writes edit, calls that reach outside the
// machine fetch.
func toolKind(se keel.SideEffect) string {
	switch se {
	case keel.SideEffectReadOnly:
		return "read"
	case keel.SideEffectIdempotentWrite, keel.SideEffectNonIdempotentWrite:
		return "edit"
	case keel.SideEffectExternal:
		return "fetch"
	}
	return "other"
}

// finish is the stopReason of a turn whose run answered at step: the
// answer's finish reason, from the model call's span, says whether the
// model was cut off (max_tokens) or its provider refused (refusal).
func (a *Agent) finish(ctx context.Context, id keel.RunID, step int) string {
	d, err := a.cfg.Runs.Get(ctx, id)
	if err != nil {
		return "end_turn"
	}
	why := ""
	for _, sp := range d.Spans {
		if sp.Kind == keel.SpanModelCall && sp.Step == step {
			why = sp.FinishReason // the last call of the step answered
		}
	}
	return stopReason(why)
}

// stopReason maps a model's finish reason (Ollama's and OpenAI's words)
// to ACP's stopReason of a turn that ended with the model's answer.
func stopReason(finish string) string {
	switch finish {
	case "length":
		return "max_tokens"
	case "content_filter", "refusal":
		return "refusal"
	}
	return "end_turn"
}

// fork makes the next turn's run: a fork of the session's last run from
// its last complete step, with the prompt as its message.
func (a *Agent) fork(ctx context.Context, s *session, head keel.Run, text, key string) (keel.Run, error) {
	d, err := a.cfg.Runs.Get(ctx, head.ID)
	if err != nil {
		return keel.Run{}, err
	}
	hr, evs := d.Run, d.Events
	if !hr.Status.Terminal() {
		return keel.Run{}, &rpcError{Code: codeInvalidRequest, Message: fmt.Sprintf("the session's run %s is %s: wait for it or cancel it first", hr.ID, hr.Status)}
	}
	step := completeStep(evs)
	per := s.perTurn
	if per <= 0 {
		per = turnSteps(hr, evs)
	}
	return a.cfg.Runs.Fork(ctx, keel.ForkRequest{RunID: head.ID, Step: step, Message: text, MaxSteps: step + per, IdempotencyKey: key})
}

// completeStep returns the last model step of a journal whose tool calls
// all have results: a turn cancelled during a call does not run it again
// in the next.
func completeStep(evs []keel.Event) int {
	last, open := 0, map[string]bool{}
	done := 0
	for _, ev := range evs {
		switch ev.Type {
		case keel.EventModelResult:
			var d keel.ModelResultData
			if json.Unmarshal(ev.Data, &d) != nil {
				continue
			}
			if len(open) == 0 {
				done = last
			}
			last, open = d.Step, map[string]bool{}
			for _, c := range d.ToolCalls {
				open[c.ID] = true
			}
		case keel.EventToolResult:
			var d keel.ToolResultData
			if json.Unmarshal(ev.Data, &d) == nil {
				delete(open, d.CallID)
			}
		}
	}
	if len(open) == 0 {
		return last
	}
	return done
}

// turnSteps is the steps a turn may take, as the session's run run had:
// its step bound, less the steps it forked with.
func turnSteps(run keel.Run, evs []keel.Event) int {
	var d keel.RunForkedData
	if len(evs) > 0 && evs[0].Type == keel.EventRunForked && json.Unmarshal(evs[0].Data, &d) == nil {
		return max(run.MaxSteps-d.Step, 1)
	}
	return max(run.MaxSteps, 1)
}

// cancel handles session/cancel: the turn's run is cancelled, and the
// prompt answers cancelled.
func (a *Agent) cancel(params json.RawMessage) {
	var p struct {
		SessionID string `json:"sessionId"`
	}
	if decode(params, &p) != nil {
		return
	}
	a.mu.Lock()
	s := a.sessions[p.SessionID]
	a.mu.Unlock()
	if s == nil {
		return
	}
	s.mu.Lock()
	t := s.turn
	var id keel.RunID
	if t != nil && !t.cancelled {
		t.cancelled, id = true, t.run
	}
	s.mu.Unlock()
	if id != "" {
		a.cancelRun(id)
	}
}

// cancelRun cancels a run without holding up the reader; a run that has
// ended meanwhile is no error.
func (a *Agent) cancelRun(id keel.RunID) {
	go func() {
		if err := a.cfg.Runs.Cancel(context.Background(), id); err != nil && !errors.Is(err, keel.ErrConflict) {
			a.log.Warn("acp: cancel run", logkey.Run, id, logkey.Err, err)
		}
	}()
}

// askPermission asks the client about a call the policy holds for a
// person (session/request_permission) and gives keel its answer: bound to
// the call's exact arguments by their hash.
func (a *Agent) askPermission(ctx context.Context, s *session, run keel.RunID, ap keel.ApprovalRequestData, kinds map[string]string) {
	params := map[string]any{
		"sessionId": s.id,
		"toolCall":  toolCallFields(ap.Call, "pending", kinds),
		"options": []map[string]string{
			{"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
			{"optionId": "reject_once", "name": "Reject", "kind": "reject_once"},
		},
	}
	var res struct {
		Outcome struct {
			Outcome  string `json:"outcome"`
			OptionID string `json:"optionId"`
		} `json:"outcome"`
	}
	if err := a.c.call(ctx, "session/request_permission", params, &res); err != nil {
		a.log.Info("acp: permission request", logkey.Run, run, logkey.Call, ap.Call.ID, logkey.Err, err)
		return
	}
	if res.Outcome.Outcome != "selected" {
		return // cancelled: the prompt is being cancelled
	}
	approved := res.Outcome.OptionID == "allow_once"
	reason := ""
	if !approved {
		reason = "rejected in the editor"
	}
	if err := a.cfg.Runs.Approve(ctx, Approval{Run: run, CallID: ap.Call.ID, ArgsSHA256: ap.ArgsSHA256, Approved: approved, Reason: reason}); err != nil {
		a.log.Warn("acp: approve", logkey.Run, run, logkey.Call, ap.Call.ID, logkey.Err, err)
	}
}
