package daemon

import (
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
	"github.com/keel-runtime/keel/wasmtools"
)

// MCPPath is where the daemon serves MCP over streamable HTTP.
const MCPPath = "/mcp"

// mcpRoute serves the installed tools to MCP clients at MCPPath: the
// same direct call as tools.call (tools), behind the WebSocket's token,
// Origin and Host checks (a non-public route), with the scopes of each
// caller checked per MCP method. stop ends its sessions.
func mcpRoute(ctx context.Context, tools mcpserver.Tools, log *slog.Logger) (rt ipc.Route, stop func(), err error) {
	if tools == nil {
		return ipc.Route{}, nil, errors.New("mcp: no tools")
	}
	srv, err := mcpserver.New(ctx, mcpserver.Config{Tools: tools, Version: Version, Logger: log.With(logkey.Component, "mcp")})
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
	admin  *wasmtools.Admin
	decide func(context.Context, keel.PolicyExplainParams) (keel.PolicyExplainResult, error)
	audit  interface {
		ToolDenied(context.Context, keel.ToolInvocation, *keel.ToolError)
	}
}

func (t mcpTools) ListTools(ctx context.Context) ([]capabilities.ToolInfo, error) {
	return t.admin.ListTools(ctx)
}

func (t mcpTools) SubscribeTools(fn func()) func() { return t.admin.SubscribeTools(fn) }

func (t mcpTools) CallTool(ctx context.Context, c mcpserver.Call) (json.RawMessage, error) {
	inv := keel.ToolInvocation{Name: c.Name, Args: c.Input, Client: c.Client}
	d, err := t.decide(ctx, keel.PolicyExplainParams{Kind: keel.PolicyKindTool, Tool: c.Name, Args: c.Input})
	switch {
	case errors.Is(err, keel.ErrInvalid):
		// Arguments that are not an object: the tool's input check
		// says what is wrong with them.
		return t.admin.Call(ctx, inv)
	case err != nil:
		return nil, err
	}
	if d.Rule != nil || d.Setting != nil || d.Decision != "allow" {
		inv.Policy = &keel.PolicyDecision{Outcome: d.Decision, Explanation: d.Explanation, Version: d.Version, Digest: d.Digest}
	}
	refuse := func(te *keel.ToolError) (json.RawMessage, error) {
		t.audit.ToolDenied(context.WithoutCancel(ctx), inv, te)
		return nil, te
	}
	switch d.Decision {
	case "allow":
	case "ask":
		if c.Approve == nil {
			return refuse(&keel.ToolError{Code: keel.ToolPolicyDenied, Message: fmt.Sprintf(
				"the policy asks before %s runs (%s), and this MCP client cannot be asked: it declared no elicitation capability; allow the call in policy.json, or use a client that supports elicitation", c.Name, d.Explanation)})
		}
		ok, err := c.Approve(ctx, *inv.Policy)
		inv.Policy.Approver = c.Client
		switch {
		case err != nil:
			return refuse(&keel.ToolError{Code: keel.ToolPolicyDenied, Message: fmt.Sprintf("the policy asks before %s runs (%s), and the MCP client gave no answer: %v", c.Name, d.Explanation, err)})
		case !ok:
			return refuse(&keel.ToolError{Code: keel.ToolDenied, Message: fmt.Sprintf("%s declined the call of %s", c.Client, c.Name)})
		}
	default:
		return refuse(&keel.ToolError{Code: keel.ToolPolicyDenied, Message: fmt.Sprintf("the policy denied the call of %s: %s", c.Name, d.Explanation)})
	}
	return t.admin.Call(ctx, inv)
}
