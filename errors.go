package keel

import "errors"

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
)
