package mcpclient

import (
	"context"
	"encoding/json"
	"github.com/keel-runtime/keel/bridges/mcpclient/mcpfile"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

// Local is the tool runtime's own tools as the engine runs them (the
// sandbox's: wasmtools.RunTools), with every optional interface the
// engine consults.
type Local interface {
	Specs(ctx context.Context) []keel.ToolSpec
	Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error)
	SideEffects(name string) (keel.SideEffect, bool)
	ReadsPrivate(name string) bool
	RequestsNetwork(name string) bool
	Loading() bool
	CallTargets(name string, args json.RawMessage) keel.CallTargets
}

// RunTools are the tools a run may use: Local's and the MCP servers'
// (engine.Tools with SideEffecter, PrivateReader, NetworkRequester,
// Loading and CallTargeter). A name with mcpfile.ToolPrefix is an MCP server's,
// every other Local's. Safe for concurrent use.
type RunTools struct {
	Local Local
	MCP   *Manager
}

// Specs returns Local's tools, then the servers'. It waits for each
// server's first connection attempt (bounded by
// Config.ConnectTimeout), so a run started with the daemon sees them.
func (t RunTools) Specs(ctx context.Context) []keel.ToolSpec {
	specs := t.Local.Specs(ctx)
	t.MCP.WaitReady(ctx)
	return append(specs, t.MCP.Specs()...)
}

// Call calls an MCP server's tool (Manager.Call) or Local's.
func (t RunTools) Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	if _, ok := mcpfile.IsToolName(inv.Name); ok {
		return t.MCP.Call(ctx, inv)
	}
	return t.Local.Call(ctx, inv)
}

// SideEffects is an MCP tool's class from its annotations (Class), or
// Local's class. The engine runs again, after a crash, only a read-only
// or idempotent tool's call: an MCP tool not listed now (its server not
// connected yet) has no class, so it is not run again unasked.
func (t RunTools) SideEffects(name string) (keel.SideEffect, bool) {
	if _, ok := mcpfile.IsToolName(name); ok {
		return t.MCP.SideEffects(name)
	}
	return t.Local.SideEffects(name)
}

// ReadsPrivate is Local's; an MCP server's tools carry the server's
// labels instead (its "private" label makes their results private).
func (t RunTools) ReadsPrivate(name string) bool {
	if _, ok := mcpfile.IsToolName(name); ok {
		return false
	}
	return t.Local.ReadsPrivate(name)
}

// RequestsNetwork is true for every MCP server's tool: what a call sends
// leaves keel for another process (a stdio server) or another host (an
// HTTP server), so a call after labelled data entered the run is
// decided as egress too.
func (t RunTools) RequestsNetwork(name string) bool {
	if _, ok := mcpfile.IsToolName(name); ok {
		return true
	}
	return t.Local.RequestsNetwork(name)
}

// Loading reports whether Specs would wait: for Local's tools to
// compile, or for a server's first connection attempt.
func (t RunTools) Loading() bool { return t.Local.Loading() || t.MCP.Loading() }

// CallTargets are Local's; an MCP tool's arguments name no files or URLs
// keel can resolve (the server's files are not the sandbox's), so path
// and url rules match none of them: govern them with tool and args
// rules.
func (t RunTools) CallTargets(name string, args json.RawMessage) keel.CallTargets {
	if _, ok := mcpfile.IsToolName(name); ok {
		return keel.CallTargets{}
	}
	return t.Local.CallTargets(name, args)
}

// Listed is the tool runtime's own tools as the protocol serves them
// (the sandbox's: wasmtools.Admin).
type Listed interface {
	ListTools(ctx context.Context) ([]capabilities.ToolInfo, error)
	CallTool(ctx context.Context, name string, input json.RawMessage, client string) (json.RawMessage, error)
	ToolsProgress() (loaded, total int, ready bool)
	SubscribeTools(fn func()) (cancel func())
}

// ListedTools are the tools tools.list and tools.call serve: Local's and
// the MCP servers' (with their provenance). Changes of the servers' tools
// reach subscribers when the Manager's Config.OnChange is what Local's
// SubscribeTools hears (the daemon's wasmtools.Changes). Safe for
// concurrent use.
type ListedTools struct {
	Local Listed
	MCP   *Manager
	// DirectEgress, when set, decides a direct call's egress to an HTTP
	// server's URL (the policy's, as for a tool's network request).
	DirectEgress func(tool string) keel.EgressCheck
}

// ListTools lists Local's tools, then the servers'.
func (t ListedTools) ListTools(ctx context.Context) ([]capabilities.ToolInfo, error) {
	infos, err := t.Local.ListTools(ctx)
	if err != nil {
		return nil, err
	}
	return append(infos, t.MCP.Info()...), nil
}

// CallTool is a direct call (tools.call) of an MCP server's tool or of
// Local's; the audit record names client.
func (t ListedTools) CallTool(ctx context.Context, name string, input json.RawMessage, client string) (json.RawMessage, error) {
	if _, ok := mcpfile.IsToolName(name); !ok {
		return t.Local.CallTool(ctx, name, input, client)
	}
	inv := keel.ToolInvocation{Name: name, Args: input, Client: client, Touched: &keel.Touched{}}
	if t.DirectEgress != nil {
		inv.Egress = t.DirectEgress(name)
	}
	return t.MCP.Call(ctx, inv)
}

// ToolsProgress is Local's.
func (t ListedTools) ToolsProgress() (loaded, total int, ready bool) { return t.Local.ToolsProgress() }

// SubscribeTools is Local's.
func (t ListedTools) SubscribeTools(fn func()) (cancel func()) { return t.Local.SubscribeTools(fn) }
