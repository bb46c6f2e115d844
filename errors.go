package keel

import (
	"errors"
	"fmt"
)

// Sentinel errors shared across layers. Lower layers wrap them; the
// protocol boundary maps each to one documented error code.
var (
	// ErrNotFound: the named run, tool or model does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the request conflicts with the current state, such as
	// cancelling a run that already ended.
	ErrConflict = errors.New("conflict")
	// ErrInvalid: the caller's input is malformed or out of range.
	ErrInvalid = errors.New("invalid input")
	// ErrUnavailable: the runtime cannot serve the request now, for
	// example because it is shutting down.
	ErrUnavailable = errors.New("unavailable")
	// ErrModelUnavailable: no model can serve the request: the provider
	// is unreachable or does not have the model.
	ErrModelUnavailable = errors.New("model unavailable")
	// ErrUnusableTool: a tool file cannot be run as a keel tool: it is not
	// valid WebAssembly, uses a feature keel cannot bound (tail calls,
	// threads, exception handling, several memories), breaks the tool
	// convention (imports, exports, name) or has a bad manifest. The file
	// is at fault, not the request that named it, so it is not ErrInvalid.
	ErrUnusableTool = errors.New("unusable tool")
)

// AlreadyDecidedError is the error of a decision (run.decide) or an
// approval (run.approve) about a wait that another one already answered:
// exactly one answer per wait is journaled, and this one was not. It
// wraps ErrConflict.
type AlreadyDecidedError struct {
	RunID  RunID
	CallID string
	// Decision is the answer that was journaled: a Decision* value
	// (retry, skip, done), or "approved" or "denied".
	Decision string
	// Seq is the journal event that recorded it.
	Seq int64
}

func (e *AlreadyDecidedError) Error() string {
	return fmt.Sprintf("run %s, call %s: already decided: %s by event %d; this decision was not recorded", e.RunID, e.CallID, e.Decision, e.Seq)
}

// Unwrap returns ErrConflict.
func (e *AlreadyDecidedError) Unwrap() error { return ErrConflict }
