package recall

import (
	"context"
	"encoding/json"

	"github.com/keel-runtime/keel"
)

// Next is the tools a run has besides knowledge_search (the sandbox's
// and the MCP servers': mcpclient.RunTools), with every optional
// interface the engine consults.
type Next interface {
	Specs(ctx context.Context) []keel.ToolSpec
	Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error)
	SideEffects(name string) (keel.SideEffect, bool)
	ReadsPrivate(name string) bool
	RequestsNetwork(name string) bool
	Loading() bool
	CallTargets(name string, args json.RawMessage) keel.CallTargets
}

// RunTools are the tools a run may use: Next's and knowledge_search,
// which is offered only to runs that may read a scope holding something
// (engine.Offerer). It implements engine.Tools with SideEffecter,
// PrivateReader, NetworkRequester, Loading, CallTargeter and Offerer.
// Safe for concurrent use.
type RunTools struct {
	Next      Next
	Knowledge *Tool
}

// Specs returns Next's tools, less one that knowledge_search shadows,
// then knowledge_search.
func (t RunTools) Specs(ctx context.Context) []keel.ToolSpec {
	specs := t.Next.Specs(ctx)
	out := specs[:0:0]
	for _, s := range specs {
		if s.Name != ToolName {
			out = append(out, s)
		}
	}
	return append(out, t.Knowledge.Spec())
}

// Call runs knowledge_search, or Next's tool.
func (t RunTools) Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	if inv.Name == ToolName {
		return t.Knowledge.Call(ctx, inv)
	}
	return t.Next.Call(ctx, inv)
}

// SideEffects: knowledge_search only reads.
func (t RunTools) SideEffects(name string) (keel.SideEffect, bool) {
	if name == ToolName {
		return keel.SideEffectReadOnly, true
	}
	return t.Next.SideEffects(name)
}

// ReadsPrivate is Next's; knowledge_search's output carries the labels
// of its hits instead (a private scope's make it private).
func (t RunTools) ReadsPrivate(name string) bool {
	return name != ToolName && t.Next.ReadsPrivate(name)
}

// RequestsNetwork: knowledge_search reaches no network.
func (t RunTools) RequestsNetwork(name string) bool {
	return name != ToolName && t.Next.RequestsNetwork(name)
}

// Loading is Next's.
func (t RunTools) Loading() bool { return t.Next.Loading() }

// CallTargets are Next's; knowledge_search names no files or URLs of
// the sandbox's (govern it with knowledge rules).
func (t RunTools) CallTargets(name string, args json.RawMessage) keel.CallTargets {
	if name == ToolName {
		return keel.CallTargets{}
	}
	return t.Next.CallTargets(name, args)
}

// Offers is the tool's (Tool.Offers).
func (t RunTools) Offers(ctx context.Context, run keel.Run, name string) bool {
	return t.Knowledge.Offers(ctx, run, name)
}
