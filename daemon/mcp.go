package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bridges/mcpserver"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/policy"
	"github.com/keel-runtime/keel/wasmtools"
)

// MCPPath is where the daemon serves MCP over streamable HTTP.
const MCPPath = "/mcp"

// mcpRoute serves the installed tools to MCP clients at MCPPath: the
// same direct call as tools.call (tools), behind the WebSocket's token,
// Origin and Host checks (a non-public route), with the scopes of each
// caller checked per MCP method. stop ends its sessions.
func mcpRoute(ctx context.Context, tools mcpserver.Tools, runs mcpserver.Runs, log *slog.Logger) (rt ipc.Route, stop func(), err error) {
	srv, err := mcpserver.New(ctx, mcpserver.Config{Tools: tools, Runs: runs, Version: Version, Logger: log.With(logkey.Component, "mcp")})
	if err != nil {
		return ipc.Route{}, nil, err
	}
	h := srv.HTTPHandler(mcpserver.HTTPConfig{Caller: func(r *http.Request) (mcpserver.Caller, bool) {
		who, ok := ipc.CallerOf(r)
		if !ok {
			return mcpserver.Caller{}, false
		}
		return mcpserver.Caller{ID: who.Via + ":" + who.Name, Scopes: who.Scopes}, true
	}})
	return ipc.Route{Pattern: MCPPath, Handler: h}, srv.Close, nil
}

// mcpTools are the tools MCP clients call: the tool runtime's direct
// call (admin), each call first decided by the policy as a tool action,
// as a run's is, but with no run's rules, workspace or labels: the user
// and managed layers (policy.json). allow runs it; deny refuses it
// (policy_denied); ask runs it only once the client's user approves this
// exact call (mcpserver.Call.Approve, MCP elicitation), refuses it
// (denied) if they decline and, if the client cannot be asked, refuses it
// with policy_denied saying so. A refused call never reaches the tool
// and is in the audit trail all the same, with the decision, and for an
// ask who answered it (keel.PolicyDecision.Approver).
type mcpTools struct {
	admin *wasmtools.Admin
	pol   mcpPolicy
	audit interface {
		ToolDenied(context.Context, keel.ToolInvocation, *keel.ToolError)
	}
}

// mcpPolicy decides MCP clients' calls as policy.explain decides a
// tool action with no run (the same policy, with the policy.Service's
// inputs), without its costs per call: the arguments are not decoded
// to check them (the tool's input check does that), their paths and
// URLs are worked out only for a policy with rules about them, and the
// explanation is written only for a decision that is recorded.
type mcpPolicy struct {
	svc *policy.Service
}

// decide returns the decision about a call of tool with args, the
// record of it (nil: no rule or setting had anything to say, the
// built-in allow) and whether a rule made it.
func (m mcpPolicy) decide(tool string, args json.RawMessage) (policy.Outcome, *keel.PolicyDecision, bool) {
	p, version := m.svc.Effective("")
	if p == nil {
		snap := m.svc.Watcher.CurrentFor("")
		p, version = snap.Policy, snap.Version
	}
	if p == nil {
		return policy.Allow, nil, false
	}
	a := policy.Action{Kind: policy.KindTool, Tool: tool, Args: args}
	a.SideEffect, _ = m.svc.SideEffects(tool)
	if m.svc.Targets != nil && p.NeedsTargets(tool) {
		t := m.svc.Targets(tool, args)
		a.Paths, a.Base, a.Resolve, a.URLs, a.Unresolvable = t.Paths, t.Base, t.Resolve, t.URLs, t.Unresolvable
	}
	d := p.Decide(&a)
	if d.Rule() == nil && d.Setting() == nil && d.Outcome == policy.Allow {
		return policy.Allow, nil, false
	}
	return d.Outcome, &keel.PolicyDecision{Outcome: d.Outcome.String(), Explanation: d.String(), Version: version, Digest: p.Digest()}, d.Rule() != nil
}

// isObject reports whether args is a JSON object, at a glance: the
// first byte; the tool's input check reads the rest.
func isObject(args json.RawMessage) bool {
	b := bytes.TrimLeft(args, " \t\r\n")
	return len(b) > 0 && b[0] == '{'
}

func (t mcpTools) ListTools(ctx context.Context) ([]capabilities.ToolInfo, error) {
	return t.admin.ListTools(ctx)
}

func (t mcpTools) SubscribeTools(fn func()) func() { return t.admin.SubscribeTools(fn) }

func (t mcpTools) CallTool(ctx context.Context, c mcpserver.Call) (json.RawMessage, error) {
	inv := keel.ToolInvocation{Name: c.Name, Args: c.Input, Client: c.Client}
	if !isObject(c.Input) {
		// The tool's input check says what is wrong with them.
		return t.admin.Call(ctx, inv)
	}
	outcome, pd, _ := t.pol.decide(c.Name, c.Input)
	inv.Policy = pd
	refuse := func(te *keel.ToolError) (json.RawMessage, error) {
		t.audit.ToolDenied(context.WithoutCancel(ctx), inv, te)
		return nil, te
	}
	switch outcome {
	case policy.Allow:
	case policy.Ask:
		if c.Approve == nil {
			return refuse(&keel.ToolError{Code: keel.ToolPolicyDenied, Message: fmt.Sprintf(
				"the policy asks before %s runs (%s), and this MCP client cannot be asked: it declared no elicitation capability; allow the call in policy.json, or use a client that supports elicitation", c.Name, pd.Explanation)})
		}
		ok, err := c.Approve(ctx, *pd)
		pd.Approver = c.Client
		switch {
		case err != nil:
			return refuse(&keel.ToolError{Code: keel.ToolPolicyDenied, Message: fmt.Sprintf("the policy asks before %s runs (%s), and the MCP client gave no answer: %v", c.Name, pd.Explanation, err)})
		case !ok:
			return refuse(&keel.ToolError{Code: keel.ToolDenied, Message: fmt.Sprintf("%s declined the call of %s", c.Client, c.Name)})
		}
	default:
		return refuse(&keel.ToolError{Code: keel.ToolPolicyDenied, Message: fmt.Sprintf("the policy denied the call of %s: %s", c.Name, pd.Explanation)})
	}
	return t.admin.Call(ctx, inv)
}

// mcpRuns are the runs MCP clients may start and whose traces they may
// read: off unless the policy allows them. Starting one is decided as a
// call of the tool mcpserver.RunStartTool with the goal and model as
// arguments, reading a trace as a call of mcpserver.RunTraceTool with
// {"run_id"}: each needs a rule that allows it (the built-in allow of
// a policy with nothing to say does not), and an ask of a start is put
// to the client's user (elicitation) as a tool call's is.
type mcpRuns struct {
	start  func(context.Context, keel.StartRequest) (keel.Run, error)
	getRun func(context.Context, keel.RunID) (keel.Run, error)
	spans  func(context.Context, keel.RunID) ([]keel.Span, error)
	pol    mcpPolicy
}

// allowed decides tool with args: nil if a rule allows it (or a person
// approved an ask, through approve when not nil), else the refusal.
func (r mcpRuns) allowed(ctx context.Context, tool string, args json.RawMessage, client string, approve func(context.Context, keel.PolicyDecision) (bool, error)) error {
	outcome, pd, ruled := r.pol.decide(tool, args)
	off := fmt.Sprintf(`runs over MCP are off unless the policy allows them: add {"action":"tool","tool":%q,"decision":"allow"} to the rules of policy.json`, tool)
	switch {
	case outcome == policy.Allow && ruled:
		return nil
	case outcome == policy.Allow:
		return &keel.ToolError{Code: keel.ToolPolicyDenied, Message: off}
	case outcome == policy.Ask && approve != nil:
		ok, err := approve(ctx, *pd)
		if err != nil {
			return &keel.ToolError{Code: keel.ToolPolicyDenied, Message: fmt.Sprintf("the policy asks before %s (%s), and the MCP client gave no answer: %v", tool, pd.Explanation, err)}
		}
		if !ok {
			return &keel.ToolError{Code: keel.ToolDenied, Message: fmt.Sprintf("%s declined %s", client, tool)}
		}
		return nil
	}
	return &keel.ToolError{Code: keel.ToolPolicyDenied, Message: fmt.Sprintf("the policy refuses %s (%s); %s", tool, pd.Explanation, off)}
}

func (r mcpRuns) StartRun(ctx context.Context, c mcpserver.Call, req keel.StartRequest) (keel.RunID, error) {
	if err := r.allowed(ctx, mcpserver.RunStartTool, c.Input, c.Client, c.Approve); err != nil {
		return "", err
	}
	run, err := r.start(ctx, req)
	if err != nil {
		if errors.Is(err, keel.ErrInvalid) {
			return "", &keel.ToolError{Code: keel.ToolInvalidInput, Message: err.Error()}
		}
		// Such as no model to serve it: the client's to read.
		return "", &keel.ToolError{Code: keel.ToolFailed, Message: "the run did not start: " + err.Error()}
	}
	return run.ID, nil
}

func (r mcpRuns) RunSpans(ctx context.Context, id keel.RunID, client string) ([]keel.Span, error) {
	args, _ := json.Marshal(map[string]keel.RunID{"run_id": id})
	if err := r.allowed(ctx, mcpserver.RunTraceTool, args, client, nil); err != nil {
		return nil, err
	}
	if _, err := r.getRun(ctx, id); err != nil {
		return nil, err
	}
	return r.spans(ctx, id)
}
