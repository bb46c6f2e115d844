package engine

import (
	"context"

	"github.com/keel-runtime/keel"
)

// Caller identifies the run step on whose behalf a tool is called. The
// engine puts it in the context of every Tools.Call so a tool runner can
// audit who called it without widening the Tools interface.
type Caller struct {
	RunID  keel.RunID
	Step   int
	CallID string
}

type callerKey struct{}

// WithCaller returns ctx carrying c.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the Caller in ctx, if any; a direct call (no run) has none.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}
