package ipc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// methodFunc handles one method. It returns the result to send, a
// followUp, or an error: a *protocol.Error is sent as is, anything else
// goes through rpcError.
type methodFunc func(ctx context.Context, c *conn, params json.RawMessage) (any, error)

// methods is the method table: every method the server knows, and the
// group of Services it needs (nil: always served).
var methods map[string]method

// method is a row of the method table.
type method struct {
	h methodFunc
	// serves reports whether svc has what the method needs.
	serves func(svc Services) bool
}

func init() {
	// Assigned in init because initialize lists the table's own keys.
	runs := func(s Services) bool { return s.Runs != nil }
	history := func(s Services) bool { return s.History != nil }
	follow := func(s Services) bool { return s.Runs != nil && s.History != nil }
	control := func(s Services) bool { return s.Control != nil }
	steering := func(s Services) bool { return s.Steering != nil }
	tools := func(s Services) bool { return s.Tools != nil }
	admin := func(s Services) bool { return s.Admin != nil }
	audit := func(s Services) bool { return s.Audit != nil }
	models := func(s Services) bool { return s.Models != nil }
	chat := func(s Services) bool { return s.Chat != nil }
	env := func(s Services) bool { return s.Env != nil }
	pol := func(s Services) bool { return s.Policy != nil }
	labels := func(s Services) bool { return s.Labels != nil }
	tokens := func(s Services) bool { return s.Tokens != nil }
	know := func(s Services) bool { return s.Knowledge != nil }
	methods = map[string]method{
		protocol.MethodInitialize:      {typed(handleInitialize), nil},
		protocol.MethodConsoleLogin:    {typed(handleConsoleLogin), nil},
		protocol.MethodRunStart:        {typed(handleRunStart), runs},
		protocol.MethodRunCancel:       {onRun(func(ctx context.Context, s Services, id keel.RunID) (any, error) { return s.Runs.Cancel(ctx, id) }), runs},
		protocol.MethodRunList:         {typed(handleRunList), history},
		protocol.MethodRunGet:          {handleRunGet, history},
		protocol.MethodRunSubscribe:    {typed(handleRunSubscribe), follow},
		protocol.MethodRunUnsubscribe:  {handleRunUnsubscribe, follow},
		protocol.MethodRunsSubscribe:   {typed(handleRunsSubscribe), follow},
		protocol.MethodRunsUnsubscribe: {typed(handleRunsUnsubscribe), follow},
		protocol.MethodToolsList:       {handleToolsList, tools},
		protocol.MethodToolsCall:       {typed(handleToolsCall), tools},
		protocol.MethodToolsAudit:      {typed(handleToolsAudit), audit},
		protocol.MethodToolsInspect:    {typed(handleToolsInspect), admin},
		protocol.MethodToolsInstall:    {typed(handleToolsInstall), admin},
		protocol.MethodToolsRemove:     {typed(handleToolsRemove), admin},
		protocol.MethodToolsGrant:      {typed(handleToolsGrant), admin},
		protocol.MethodToolsRevoke:     {typed(handleToolsRevoke), admin},
		protocol.MethodEnvDescribe:     {handleEnvDescribe, env},
		protocol.MethodModelsList:      {handleModelsList, models},
		protocol.MethodModelsPull:      {typed(handleModelsPull), models},
		protocol.MethodModelsChat:      {typed(handleModelsChat), chat},
		protocol.MethodRunDecide:       {typed(handleRunDecide), control},
		protocol.MethodRunPause:        {onRun(func(ctx context.Context, s Services, id keel.RunID) (any, error) { return s.Control.Pause(ctx, id) }), control},
		protocol.MethodRunResume:       {onRun(func(ctx context.Context, s Services, id keel.RunID) (any, error) { return s.Control.Unpause(ctx, id) }), control},
		protocol.MethodRunReplay: {onRun(func(ctx context.Context, s Services, id keel.RunID) (any, error) {
			return s.Control.CheckReplay(ctx, id)
		}), control},
		protocol.MethodRunApprove:  {typed(handleRunApprove), control},
		protocol.MethodRunSay:      {typed(handleRunSay), control},
		protocol.MethodRunTakeOver: {handleRunControl((RunSteering).TakeOver), steering},
		protocol.MethodRunHandBack: {handleRunControl((RunSteering).HandBack), steering},
		protocol.MethodRunTool:     {typed(handleRunTool), steering},
		protocol.MethodRunFork:     {typed(handleRunFork), steering},
		protocol.MethodPolicyShow: {typed(func(ctx context.Context, c *conn, p protocol.PolicyShowParams) (any, error) {
			return c.s.svc.Policy.ShowPolicy(ctx, p)
		}), pol},
		protocol.MethodPolicyExplain: {typed(handlePolicyExplain), pol},
		protocol.MethodRunDeclassify: {typed(handleRunDeclassify), labels},
		protocol.MethodTokenCreate:   {typed(handleTokenCreate), tokens},
		protocol.MethodTokenList:     {typed(handleTokenList), tokens},
		protocol.MethodTokenRevoke:   {typed(handleTokenRevoke), tokens},

		protocol.MethodKnowledgeAdd:      {typed(handleKnowledgeAdd), know},
		protocol.MethodKnowledgeRemember: {typed(handleKnowledgeRemember), know},
		protocol.MethodKnowledgeSearch:   {typed(handleKnowledgeSearch), know},
		protocol.MethodKnowledgeList: {typed(func(ctx context.Context, c *conn, p protocol.KnowledgeListParams) (any, error) {
			return c.s.svc.Knowledge.ListKnowledge(ctx, p)
		}), know},
		protocol.MethodKnowledgeForget:  {typed(handleKnowledgeForget), know},
		protocol.MethodKnowledgeWatch:   {typed(handleKnowledgeWatch), know},
		protocol.MethodKnowledgeUnwatch: {typed(handleKnowledgeUnwatch), know},
		protocol.MethodKnowledgeLabels:  {typed(handleKnowledgeLabels), know},
	}
}

// typed makes a method of a handler that takes its params decoded:
// params that are not the method's JSON object fail with invalid params
// before the handler runs.
func typed[P any](h func(context.Context, *conn, P) (any, error)) methodFunc {
	return func(ctx context.Context, c *conn, params json.RawMessage) (any, error) {
		var p P
		if err := decodeParams(params, &p); err != nil {
			return nil, err
		}
		return h(ctx, c, p)
	}
}

// servedMethods returns the handlers of the methods whose group svc
// serves.
func servedMethods(svc Services) map[string]methodFunc {
	served := make(map[string]methodFunc, len(methods))
	for name, m := range methods {
		if m.serves == nil || m.serves(svc) {
			served[name] = m.h
		}
	}
	return served
}

// methodNames returns the names of the methods s serves, sorted.
func (s *Server) methodNames() []string {
	names := make([]string, 0, len(s.served))
	for name := range s.served {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

func handleInitialize(_ context.Context, c *conn, p protocol.InitializeParams) (any, error) {
	if p.Client != "" {
		c.log.Debug("ipc: initialize", logkey.Client, p.Client)
	}
	c.client.Store(&p.Client)
	return protocol.InitializeResult{
		Protocol: protocol.Version,
		Server:   "keel",
		Version:  c.s.cfg.Version,
		Methods:  c.s.methodNames(),
		Scopes:   c.who.scopes.names(),
	}, nil
}

func handleRunStart(ctx context.Context, c *conn, p protocol.RunStartParams) (any, error) {
	if strings.TrimSpace(p.Goal) == "" {
		return nil, paramError("goal", "must not be empty")
	}
	if p.MaxSteps < 0 {
		return nil, paramError("max_steps", "must not be negative")
	}
	labels, err := labelParams("policy.labels", p.Policy.Labels)
	if err != nil {
		return nil, err
	}
	p.Policy.Labels = labels
	run, err := c.s.svc.Runs.Start(ctx, p)
	if err != nil {
		return nil, err
	}
	// A run stored queued journals its first event later: watchers hear
	// of it now.
	c.s.watch.mark(run.ID)
	return run, nil
}

// decodeRunRef decodes and checks params naming a run.
func decodeRunRef(params json.RawMessage) (keel.RunID, error) {
	var p protocol.RunRef
	if err := decodeParams(params, &p); err != nil {
		return "", err
	}
	if p.RunID == "" {
		return "", paramError("run_id", "must not be empty")
	}
	return p.RunID, nil
}

func handleRunList(ctx context.Context, c *conn, p protocol.RunListParams) (any, error) {
	if p.Limit < 0 || p.Limit > maxListLimit {
		return nil, paramError("limit", fmt.Sprintf("must be between 0 and %d", maxListLimit))
	}
	if p.Limit == 0 {
		p.Limit = defaultListLimit
	}
	for _, st := range p.Status {
		if !slices.Contains(runStatuses, st) {
			return nil, paramError("status", fmt.Sprintf("%q is not a run status (%s)", st, joinStatuses()))
		}
	}
	res, err := c.s.svc.History.RunPage(ctx, p)
	if err != nil {
		return nil, err
	}
	res.Runs = nonNil(res.Runs)
	return res, nil
}

// runStatuses are the states run.list may filter on.
var runStatuses = []keel.RunStatus{keel.RunQueued, keel.RunRunning, keel.RunWaiting, keel.RunPaused,
	keel.RunInterrupted, keel.RunSucceeded, keel.RunFailed, keel.RunCancelled}

func joinStatuses() string {
	names := make([]string, len(runStatuses))
	for i, st := range runStatuses {
		names[i] = string(st)
	}
	return strings.Join(names, ", ")
}

func handleRunGet(ctx context.Context, c *conn, params json.RawMessage) (any, error) {
	id, err := decodeRunRef(params)
	if err != nil {
		return nil, err
	}
	run, err := c.s.svc.History.GetRun(ctx, id)
	if err != nil {
		return nil, err
	}
	events, err := c.s.svc.History.Events(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	spans, err := c.s.svc.History.Spans(ctx, id)
	if err != nil {
		return nil, err
	}
	d := protocol.RunDetail{Run: run, Events: nonNil(events), Spans: nonNil(spans)}
	if c.s.svc.Labels != nil {
		labels, err := c.s.svc.Labels.ContextLabels(ctx, id)
		if err != nil {
			return nil, err
		}
		d.Labels = nonNil(labels)
	}
	return d, nil
}

func handleRunSubscribe(ctx context.Context, c *conn, p protocol.SubscribeParams) (any, error) {
	if p.RunID == "" {
		return nil, paramError("run_id", "must not be empty")
	}
	if p.AfterSeq < 0 {
		return nil, paramError("after_seq", "must not be negative")
	}
	return c.subscribe(ctx, p)
}

func handleRunUnsubscribe(_ context.Context, c *conn, params json.RawMessage) (any, error) {
	id, err := decodeRunRef(params)
	if err != nil {
		return nil, err
	}
	c.unsubscribe(id)
	return struct{}{}, nil
}

func handleToolsList(ctx context.Context, c *conn, params json.RawMessage) (any, error) {
	if err := decodeParams(params, &struct{}{}); err != nil {
		return nil, err
	}
	tools, err := c.s.svc.Tools.ListTools(ctx)
	if err != nil {
		return nil, err
	}
	res := protocol.ToolsListResult{Tools: nonNil(tools)}
	if loaded, total, ready := c.s.svc.Tools.ToolsProgress(); !ready {
		res.Compiling = &protocol.ToolsProgress{Loaded: loaded, Total: total}
	}
	return res, nil
}

// maxClientName bounds tools.call's client.
const maxClientName = 200

func handleToolsCall(ctx context.Context, c *conn, p protocol.ToolsCallParams) (any, error) {
	if p.Name == "" {
		return nil, paramError("name", "must not be empty")
	}
	if len(p.Client) > maxClientName {
		return nil, paramError("client", fmt.Sprintf("must be at most %d bytes", maxClientName))
	}
	if len(p.Input) == 0 {
		p.Input = json.RawMessage("{}")
	}
	start := time.Now()
	out, err := c.s.svc.Tools.CallTool(ctx, p.Name, p.Input, p.Client)
	if err != nil {
		return nil, err
	}
	return protocol.ToolsCallResult{Output: out, DurationMS: time.Since(start).Milliseconds()}, nil
}

func handleToolsAudit(ctx context.Context, c *conn, p protocol.ToolsAuditParams) (any, error) {
	if p.Limit < 0 || p.Limit > 1000 {
		return nil, paramError("limit", "must be between 0 and 1000")
	}
	if p.Limit == 0 {
		p.Limit = 50
	}
	recs, err := c.s.svc.Audit.ToolCalls(ctx, p.Tool, p.Limit)
	if err != nil {
		return nil, err
	}
	return protocol.ToolsAuditResult{Records: nonNil(recs)}, nil
}

func checkToolPath(p string) error {
	if p == "" {
		return paramError("path", "must not be empty")
	}
	if !strings.HasPrefix(p, "/") {
		return paramError("path", "must be an absolute path")
	}
	if !strings.HasSuffix(p, ".wasm") {
		return paramError("path", "must name a .wasm file")
	}
	return nil
}

func handleToolsInspect(ctx context.Context, c *conn, p protocol.ToolsInspectParams) (any, error) {
	if err := checkToolPath(p.Path); err != nil {
		return nil, err
	}
	return c.s.svc.Admin.InspectTool(ctx, p.Path)
}

func handleToolsInstall(ctx context.Context, c *conn, p protocol.ToolsInstallParams) (any, error) {
	if err := checkToolPath(p.Path); err != nil {
		return nil, err
	}
	return c.s.svc.Admin.InstallTool(ctx, p)
}

func handleToolsRemove(ctx context.Context, c *conn, p protocol.ToolRef) (any, error) {
	if p.Name == "" {
		return nil, paramError("name", "must not be empty")
	}
	if err := c.s.svc.Admin.RemoveTool(ctx, p.Name); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}

func handleToolsGrant(ctx context.Context, c *conn, p protocol.ToolsGrantParams) (any, error) {
	if p.Name == "" {
		return nil, paramError("name", "must not be empty")
	}
	if p.Grants.Empty() && p.Confirm == "" {
		return nil, paramError("grants", "must grant something, or confirm pending grants")
	}
	return c.s.svc.Admin.GrantTool(ctx, p)
}

func handleToolsRevoke(ctx context.Context, c *conn, p protocol.ToolsRevokeParams) (any, error) {
	if p.Name == "" {
		return nil, paramError("name", "must not be empty")
	}
	if p.All == !p.Grants.Empty() {
		return nil, paramError("grants", "name the grants to revoke, or set all (not both)")
	}
	return c.s.svc.Admin.RevokeTool(ctx, p)
}

func handleEnvDescribe(ctx context.Context, c *conn, params json.RawMessage) (any, error) {
	if err := decodeParams(params, &struct{}{}); err != nil {
		return nil, err
	}
	env, err := c.s.svc.Env.Describe(ctx)
	if err != nil {
		return nil, err
	}
	if env.Protocol == "" {
		env.Protocol = protocol.Version
	}
	return protocol.EnvDescribeResult(env), nil
}

func handleModelsList(ctx context.Context, c *conn, params json.RawMessage) (any, error) {
	if err := decodeParams(params, &struct{}{}); err != nil {
		return nil, err
	}
	res, err := c.s.svc.Models.ListModels(ctx)
	if err != nil {
		return nil, err
	}
	res.Models, res.Providers = nonNil(res.Models), nonNil(res.Providers)
	return res, nil
}

// handleModelsPull pulls a model, sending its progress to this
// connection as models.pull.progress notifications carrying the
// request's id; they are queued before the response, so they all arrive
// before it. A models.pull sent as a notification has no id to carry,
// and pulls without progress.
func handleModelsPull(ctx context.Context, c *conn, p protocol.ModelsPullParams) (any, error) {
	if strings.TrimSpace(p.Name) == "" {
		return nil, paramError("name", "must not be empty")
	}
	id := requestID(ctx)
	progress := func(keel.PullProgress) {}
	if id != nil {
		progress = func(pr keel.PullProgress) {
			// Fails only when the connection has ended, which cancels
			// ctx and so the pull.
			_ = c.notify(ctx, protocol.NotifyModelsPullProgress, protocol.ModelsPullProgress{ID: id,
				Status: pr.Status, Digest: pr.Digest, Completed: pr.Completed, Total: pr.Total})
		}
	}
	if err := c.s.svc.Models.PullModel(ctx, p.Name, progress); err != nil {
		return nil, err
	}
	return protocol.ModelsPullResult{Name: p.Name}, nil
}

func handleModelsChat(ctx context.Context, c *conn, p protocol.ModelsChatParams) (any, error) {
	if len(p.Messages) == 0 {
		return nil, paramError("messages", "must not be empty")
	}
	if p.Repairs < 0 || p.Repairs > 5 {
		return nil, paramError("repairs", "must be between 0 and 5")
	}
	id := requestID(ctx)
	if id == nil || !p.Stream {
		return c.s.svc.Chat.Chat(ctx, p, nil)
	}
	co := &coalescer{send: func(d protocol.ChatDelta) {
		d.ID = id
		// Fails only when the connection has ended, which cancels ctx
		// and so the call.
		_ = c.notify(ctx, protocol.NotifyModelsChatDelta, d)
	}}
	res, err := c.s.svc.Chat.Chat(ctx, p, func(d keel.ChatDelta) {
		co.add(protocol.ChatDelta{Content: d.Content, Restart: d.Restart})
	})
	co.flush() // every delta goes out before the response
	return res, err
}

// deltaInterval is the most often models.chat.delta is sent for one call
// (after the first, which goes at once): a frame at 60 Hz. Each
// notification costs JSON, a WebSocket frame and wake-ups on both sides,
// CPU the local model generating the reply would otherwise have.
const deltaInterval = 16 * time.Millisecond

// coalescer joins the deltas of one streamed call that arrive within
// deltaInterval of the last one sent. It is used from the call's
// goroutine only.
type coalescer struct {
	send    func(protocol.ChatDelta)
	pending protocol.ChatDelta
	has     bool
	last    time.Time
}

func (co *coalescer) add(d protocol.ChatDelta) {
	if d.Restart {
		co.pending = protocol.ChatDelta{Restart: true} // what was held back is void too
	}
	co.pending.Content += d.Content
	co.has = true
	if now := time.Now(); now.Sub(co.last) >= deltaInterval {
		co.flush()
		co.last = now
	}
}

func (co *coalescer) flush() {
	if co.has {
		co.send(co.pending)
		co.pending, co.has = protocol.ChatDelta{}, false
	}
}

func handleRunDecide(ctx context.Context, c *conn, p protocol.RunDecideParams) (any, error) {
	switch {
	case p.RunID == "":
		return nil, paramError("run_id", "must not be empty")
	case p.CallID == "":
		return nil, paramError("call_id", "must not be empty")
	case p.Decision != keel.DecisionRetry && p.Decision != keel.DecisionSkip && p.Decision != keel.DecisionDone:
		return nil, paramError("decision", "must be retry, skip or done")
	}
	return c.s.svc.Control.Decide(ctx, p.RunID, p.CallID, p.Decision, p.Output, p.Note)
}

// handleRunControl serves run.takeover and run.handback.
func handleRunControl(f func(RunSteering, context.Context, keel.RunID, string) (keel.Run, error)) methodFunc {
	return func(ctx context.Context, c *conn, params json.RawMessage) (any, error) {
		var p protocol.RunControlParams
		if err := decodeParams(params, &p); err != nil {
			return nil, err
		}
		if p.RunID == "" {
			return nil, paramError("run_id", "must not be empty")
		}
		return f(c.s.svc.Steering, ctx, p.RunID, p.Note)
	}
}

func handleRunTool(ctx context.Context, c *conn, p protocol.RunToolParams) (any, error) {
	switch {
	case p.RunID == "":
		return nil, paramError("run_id", "must not be empty")
	case p.Name == "":
		return nil, paramError("name", "must not be empty")
	case len(p.Arguments) > 0 && !json.Valid(p.Arguments):
		return nil, paramError("arguments", "must be JSON")
	}
	return c.s.svc.Steering.RunTool(ctx, p.RunID, p.Name, p.Arguments)
}

func handleRunFork(ctx context.Context, c *conn, p protocol.RunForkParams) (any, error) {
	switch {
	case p.RunID == "":
		return nil, paramError("run_id", "must not be empty")
	case p.Step < 0:
		return nil, paramError("step", "must not be negative")
	}
	return c.s.svc.Steering.ForkRun(ctx, p)
}

func handleRunSay(ctx context.Context, c *conn, p protocol.RunSayParams) (any, error) {
	switch {
	case p.RunID == "":
		return nil, paramError("run_id", "must not be empty")
	case strings.TrimSpace(p.Message) == "":
		return nil, paramError("message", "must not be empty")
	}
	labels, err := labelParams("labels", p.Labels)
	if err != nil {
		return nil, err
	}
	return c.s.svc.Control.SayLabeled(ctx, p.RunID, p.Message, labels)
}

func handleRunApprove(ctx context.Context, c *conn, p protocol.RunApproveParams) (any, error) {
	switch {
	case p.RunID == "":
		return nil, paramError("run_id", "must not be empty")
	case p.CallID == "":
		return nil, paramError("call_id", "must not be empty")
	case len(p.ArgsSHA256) != 64:
		return nil, paramError("args_sha256", "must be the 64-hex-digit hash shown in approval.requested")
	case len(p.Arguments) > 0 && !p.Approved:
		return nil, paramError("arguments", "only an approval can edit the arguments")
	}
	return c.s.svc.Control.Approve(ctx, p.RunID, keel.ApprovalData{CallID: p.CallID, ArgsSHA256: p.ArgsSHA256, Approved: p.Approved, Reason: p.Reason, Arguments: p.Arguments})
}

// onRun is the handler of a method whose params are a RunRef.
func onRun(f func(ctx context.Context, s Services, id keel.RunID) (any, error)) methodFunc {
	return func(ctx context.Context, c *conn, params json.RawMessage) (any, error) {
		id, err := decodeRunRef(params)
		if err != nil {
			return nil, err
		}
		return f(ctx, c.s.svc, id)
	}
}

// nonNil makes a nil slice encode as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// rpcError maps a handler's error to the protocol error sent to the
// client. Unexpected errors are logged and reported without detail.
func rpcError(log *slog.Logger, method string, err error) *protocol.Error {
	if pe, ok := errors.AsType[*protocol.Error](err); ok {
		return pe
	}
	if te, ok := errors.AsType[*keel.ToolError](err); ok {
		code := protocol.CodeToolError
		switch te.Code {
		case keel.ToolInvalidInput:
			code = protocol.CodeInvalidToolInput
		case keel.ToolNotFound:
			code = protocol.CodeNotFound
		}
		data, _ := json.Marshal(te)
		return &protocol.Error{Code: code, Message: te.Error(), Data: data}
	}
	if ad, ok := errors.AsType[*keel.AlreadyDecidedError](err); ok {
		data, _ := json.Marshal(protocol.AlreadyDecided{RunID: ad.RunID, CallID: ad.CallID, Decision: ad.Decision, Seq: ad.Seq})
		return &protocol.Error{Code: protocol.CodeConflict, Message: ad.Error(), Data: data}
	}
	code := 0
	switch {
	case errors.Is(err, keel.ErrNotFound):
		code = protocol.CodeNotFound
	case errors.Is(err, keel.ErrConflict):
		code = protocol.CodeConflict
	case errors.Is(err, keel.ErrUnusableTool):
		code = protocol.CodeUnusableTool
	case errors.Is(err, keel.ErrInvalid):
		code = protocol.CodeInvalidParams
	case errors.Is(err, keel.ErrModelUnavailable):
		code = protocol.CodeModelUnavailable
	case errors.Is(err, keel.ErrUnavailable):
		code = protocol.CodeUnavailable
	}
	if code != 0 {
		return &protocol.Error{Code: code, Message: err.Error()}
	}
	log.Error("ipc: request failed", logkey.Method, method, logkey.Err, err)
	return internalError()
}

func internalError() *protocol.Error {
	return &protocol.Error{Code: protocol.CodeInternal, Message: "internal error; the daemon log has the details"}
}

func handlePolicyExplain(ctx context.Context, c *conn, p protocol.PolicyExplainParams) (any, error) {
	switch p.Kind {
	case protocol.PolicyKindTool:
		if p.Tool == "" {
			return nil, paramError("tool", "must not be empty")
		}
	case protocol.PolicyKindModel:
		if p.Provider == "" || p.Model == "" {
			return nil, paramError("model", "provider and model must not be empty")
		}
	case protocol.PolicyKindKnowledge:
		if p.Scope == "" {
			return nil, paramError("scope", "must not be empty")
		}
	default:
		return nil, paramError("kind", `must be "tool", "model" or "knowledge"`)
	}
	return c.s.svc.Policy.ExplainPolicy(ctx, p)
}
