package intercept

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/keel-runtime/keel"
)

// Decision is an interceptor's answer before a call: go ahead (the zero
// Decision) or deny, and why.
type Decision struct {
	// Deny stops the call: it does not run, and its outcome is a denial
	// (a permission_denied tool error, or a DeniedError for a model).
	Deny bool
	// Reason says why, for the caller, the audit trail and the person
	// reading it. An allowing interceptor may explain itself too.
	Reason string
	// By names the interceptor that decided ("policy", say).
	By string
}

// decide is the decision of a chain: the first that denies; if none
// does, the last that gives a reason; else the zero Decision.
func decide(d *Decision, next Decision) (stop bool) {
	if next.Deny || next.Reason != "" {
		*d = next
	}
	return next.Deny
}

// ErrDenied is wrapped by the error of a call an interceptor denied.
var ErrDenied = errors.New("denied")

// DeniedError is the error of a model call an interceptor denied. It
// wraps ErrDenied.
type DeniedError struct{ Decision Decision }

func (e *DeniedError) Error() string {
	msg := "denied"
	if e.Decision.By != "" {
		msg += " by " + e.Decision.By
	}
	if e.Decision.Reason != "" {
		msg += ": " + e.Decision.Reason
	}
	return msg
}

// Unwrap returns ErrDenied.
func (e *DeniedError) Unwrap() error { return ErrDenied }

// Tool is an interceptor of tool calls. Its hooks may be called
// concurrently, for different calls.
type Tool interface {
	// BeforeTool decides whether the call may run. It runs before the
	// tool is looked up, so the call may name a tool that does not exist.
	BeforeTool(ctx context.Context, inv keel.ToolInvocation) Decision
	// AfterTool sees the call's decision and outcome. It runs for every
	// call, denied or not, once the call has ended.
	AfterTool(ctx context.Context, inv keel.ToolInvocation, d Decision, o ToolOutcome)
}

// ToolBuild names the build of a tool that ran a call.
type ToolBuild struct {
	Version string
	SHA256  string // hex digest of the module
	// Grants are what the tool was given, rendered "fs:/workspace=ro",
	// "fs:/notes=rw+private", "net:https://example.com:443", "env:NAME".
	Grants []string
	// SideEffects is the class the tool declares (its manifest's);
	// empty when it declares none. The audit trail syncs the record of a
	// direct call of a read-only tool less eagerly (store.AuditTrail).
	SideEffects keel.SideEffect
}

// ToolOutcome is how a tool call ended.
type ToolOutcome struct {
	// Build is the tool that ran; zero when none by that name was loaded
	// or the call was denied.
	Build  ToolBuild
	Output json.RawMessage // the result, when Err is nil
	// Err is the classified failure: a denial is permission_denied, an
	// error of the runner that is not a *keel.ToolError is crashed.
	Err *keel.ToolError
	// Start is when the call started (or was denied); Duration how long
	// it ran, waiting for its tool to load included (zero when denied).
	Start    time.Time
	Duration time.Duration
}

// Tools is a chain of tool interceptors, run in the package's order.
// The nil chain runs calls as they are.
type Tools []Tool

// Call runs call, which returns the call's Build, Output and Err, between
// the chain's hooks, and returns its outcome with Start and Duration
// set: call's own, or a permission_denied error carrying the reason if an
// interceptor denied it (call then does not run).
func (c Tools) Call(ctx context.Context, inv keel.ToolInvocation, call func(context.Context) ToolOutcome) ToolOutcome {
	var d Decision
	for _, t := range c {
		if decide(&d, t.BeforeTool(ctx, inv)) {
			break
		}
	}
	var o ToolOutcome
	if d.Deny {
		o = ToolOutcome{Start: time.Now(), Err: &keel.ToolError{Code: keel.ToolPermissionDenied, Message: denial(inv.Name, d)}}
	} else {
		start := time.Now()
		o = call(ctx)
		o.Start, o.Duration = start, time.Since(start)
	}
	for i := len(c) - 1; i >= 0; i-- {
		c[i].AfterTool(ctx, inv, d, o)
	}
	return o
}

func denial(name string, d Decision) string {
	msg := "the call of " + name + " was denied"
	if d.By != "" {
		msg += " by " + d.By
	}
	if d.Reason != "" {
		msg += ": " + d.Reason
	}
	return msg
}

// Model is an interceptor of model calls. Its hooks may be called
// concurrently, for different calls.
type Model interface {
	// BeforeModel decides whether the call may go to the model.
	BeforeModel(ctx context.Context, inv keel.ModelInvocation) Decision
	// AfterModel sees the call's decision and outcome. It runs for every
	// call, denied or not, once the call has ended.
	AfterModel(ctx context.Context, inv keel.ModelInvocation, d Decision, o ModelOutcome)
}

// ModelOutcome is how a model call ended.
type ModelOutcome struct {
	// Model is the model that answered (a route's choice), Provider
	// whose it is; empty when the call failed before either was known.
	Model, Provider                string
	PromptTokens, CompletionTokens int
	CostUSD                        float64
	FinishReason                   string
	// Err is the call's error as the model layer classified it (a
	// *models.Error), or a *DeniedError.
	Err error
	// Start is when the call started (or was denied); Duration how long
	// it took, retries and fallbacks included (zero when denied).
	Start    time.Time
	Duration time.Duration
}

// Models is a chain of model interceptors, run in the package's order.
// The nil chain runs calls as they are.
type Models []Model

// Call runs call between the chain's hooks and returns its outcome with
// Start and Duration set: call's own, or a *DeniedError if an
// interceptor denied it (call then does not run).
func (c Models) Call(ctx context.Context, inv keel.ModelInvocation, call func(context.Context) ModelOutcome) ModelOutcome {
	var d Decision
	for _, m := range c {
		if decide(&d, m.BeforeModel(ctx, inv)) {
			break
		}
	}
	var o ModelOutcome
	if d.Deny {
		o = ModelOutcome{Start: time.Now(), Err: &DeniedError{Decision: d}}
	} else {
		start := time.Now()
		o = call(ctx)
		o.Start, o.Duration = start, time.Since(start)
	}
	for i := len(c) - 1; i >= 0; i-- {
		c[i].AfterModel(ctx, inv, d, o)
	}
	return o
}
