package wasmtools

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
)

// RunTools is the registry as the engine runs it (engine.Tools, with
// its optional SideEffecter, PrivateReader and Loading): calls go through
// the registry's interceptors (the audit trail first), as every call
// does. Safe for concurrent use.
type RunTools struct {
	reg *Registry
	log *slog.Logger
}

// RunTools returns the registry as the engine runs it.
func (r *Registry) RunTools() RunTools { return RunTools{reg: r, log: r.log} }

// Specs returns the tools a run may use. While the tools found at start
// are still compiling, a run is offered every tool the index lists (a
// call then waits for its tool); if the index does not know them all,
// the run waits for the load (at most a few minutes, or until ctx ends),
// so it is offered every tool.
func (a RunTools) Specs(ctx context.Context) []keel.ToolSpec {
	if !a.reg.Listed() {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		if err := a.reg.WaitReady(ctx); err != nil {
			a.log.Warn("tools still compiling; the run gets those loaded so far", logkey.Err, err)
		}
	}
	return a.reg.Specs()
}

// SideEffects returns a loaded tool's side-effect class for the engine
// (approvals, and whether a call may run twice). A tool whose manifest
// requests the network is external, whatever it declares: what it sends
// (a URL, a body) carries data out of the machine.
func (a RunTools) SideEffects(name string) (keel.SideEffect, bool) {
	se, ok := a.reg.SideEffects(name)
	if ok && a.reg.RequestsNetwork(name) {
		return keel.SideEffectExternal, true
	}
	return se, ok
}

// ReadsPrivate reports whether the tool name has a directory the user
// marked private: its output makes a run private (engine.PrivateReader).
func (a RunTools) ReadsPrivate(name string) bool {
	return a.reg.GrantedPrivate(name)
}

// RequestsNetwork reports whether the tool name's manifest requests the
// network (engine.NetworkRequester): a call of it after labelled data
// entered a run's context is also decided as egress.
func (a RunTools) RequestsNetwork(name string) bool { return a.reg.RequestsNetwork(name) }

// Loading reports whether Specs would wait for tools still compiling.
func (a RunTools) Loading() bool { return !a.reg.Listed() }

// Call runs the tool inv names (Registry.Call).
func (a RunTools) Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	return a.reg.Call(ctx, inv)
}
