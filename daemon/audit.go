package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/store"
	"github.com/keel-runtime/keel/wasmtools"
)

// auditedTools runs tools through the registry and records every call,
// from a run or direct, in the store's audit trail. It is the engine's
// Tools and the backend's tool caller, so no call path skips the audit.
type auditedTools struct {
	reg *wasmtools.Registry
	st  *store.Store
	log *slog.Logger
}

// Specs returns the tools a run may use. While the tools found at start
// are still compiling, a run is offered every tool the index lists (a
// call then waits for its tool); if the index does not know them all,
// the run waits for the load (at most a few minutes, or until ctx ends),
// so it is offered every tool.
func (a *auditedTools) Specs(ctx context.Context) []keel.ToolSpec {
	if !a.reg.Listed() {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		if err := a.reg.WaitReady(ctx); err != nil {
			a.log.Warn("tools still compiling; the run gets those loaded so far", "err", err)
		}
	}
	return a.reg.Specs()
}

// SideEffects returns a loaded tool's side-effect class for the engine
// (approvals, and whether a call may run twice). A tool whose manifest
// requests the network is external, whatever it declares: what it sends
// (a URL, a body) carries data out of the machine.
func (a *auditedTools) SideEffects(name string) (keel.SideEffect, bool) {
	se, ok := a.reg.SideEffects(name)
	if ok && a.reg.RequestsNetwork(name) {
		return keel.SideEffectExternal, true
	}
	return se, ok
}

// ReadsPrivate reports whether the tool name has a directory the user
// marked private: its output makes a run private (engine.PrivateReader).
func (a *auditedTools) ReadsPrivate(name string) bool {
	return a.reg.GrantedPrivate(name)
}

// Loading reports whether Specs would wait for tools still compiling.
func (a *auditedTools) Loading() bool { return !a.reg.Listed() }

func (a *auditedTools) Call(ctx context.Context, name string, input json.RawMessage) (json.RawMessage, error) {
	sum := sha256.Sum256(input)
	rec := keel.ToolAudit{Time: time.Now().UTC(), Tool: name, ArgsSHA256: hex.EncodeToString(sum[:])}
	t, known := a.reg.Tool(name)
	if known {
		rec.Version, rec.SHA256, rec.Grants = t.Spec.Version, t.SHA256, grantStrings(t.Grants)
	}
	if c, ok := engine.CallerFrom(ctx); ok {
		rec.RunID, rec.Step, rec.CallID = c.RunID, c.Step, c.CallID
	}
	start := time.Now()
	out, err := a.reg.Call(ctx, name, input)
	rec.Duration = time.Since(start)
	if t, ok := a.reg.Tool(name); ok && !known {
		// The call waited for the tool to compile.
		rec.Version, rec.SHA256, rec.Grants = t.Spec.Version, t.SHA256, grantStrings(t.Grants)
	}
	rec.Outcome = "ok"
	if err != nil {
		var te *keel.ToolError
		if errors.As(err, &te) {
			rec.Outcome = string(te.Code)
		} else {
			rec.Outcome = string(keel.ToolCrashed)
		}
		rec.Error = err.Error()
	}
	var aerr error
	if rec.RunID != "" {
		// Committed with the run's tool result, which the engine journals next.
		aerr = a.st.QueueToolCall(rec)
	} else {
		_, aerr = a.st.RecordToolCall(context.WithoutCancel(ctx), rec)
	}
	if aerr != nil {
		// The call happened; losing its audit line is logged, not hidden.
		a.log.Error("record tool audit", "tool", name, "run", rec.RunID, "err", aerr)
	}
	return out, err
}

// grantStrings renders grants for the audit trail: "fs:/workspace=ro",
// "net:https://example.com:443", "env:NAME".
func grantStrings(g capabilities.Grants) []string {
	var out []string
	for _, f := range g.FS {
		mode := "rw"
		if f.ReadOnly {
			mode = "ro"
		}
		if f.Private {
			mode += "+private"
		}
		out = append(out, "fs:"+f.GuestPath+"="+mode)
	}
	for _, n := range g.Network {
		out = append(out, "net:"+n)
	}
	for _, e := range g.Env {
		out = append(out, "env:"+e)
	}
	return out
}
