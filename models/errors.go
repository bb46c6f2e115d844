package models

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// Errors callers branch on. A provider's errors wrap one of them, usually
// through an *Error that says more.
var (
	// ErrUnavailable: the provider could not be reached, is overloaded or
	// failed; a retry later may succeed.
	ErrUnavailable = errors.New("model provider unavailable")
	// ErrModelNotFound: the provider does not serve the named model.
	ErrModelNotFound = errors.New("model not found")
	// ErrInvalidRequest: the provider refused the request as malformed.
	ErrInvalidRequest = errors.New("invalid model request")
	// ErrContextTooLong: the prompt does not fit the model's context.
	ErrContextTooLong = errors.New("prompt too long for the model's context")
	// ErrBudgetExceeded: the call would spend more tokens or money than
	// its run or the day has left.
	ErrBudgetExceeded = errors.New("model budget exceeded")
	// ErrPolicy: policy forbids sending this request to any model that
	// could serve it (for example private content and a cloud-only route).
	ErrPolicy = errors.New("model call refused by policy")
	// ErrInvalidOutput: the reply did not satisfy the requested JSON
	// Schema, even after the bounded repair attempts.
	ErrInvalidOutput = errors.New("model output does not match the schema")
)

// Kind classifies a failed model call. It decides what the model layer
// does next: retry the same model (Retryable), try the next model of the
// route (Fallback), or give up.
type Kind string

// Kinds of failure.
const (
	KindRateLimited    Kind = "rate_limited"     // 429: retry after RetryAfter
	KindOverloaded     Kind = "overloaded"       // 5xx, 503, 529: retry with backoff
	KindCrashed        Kind = "model_crashed"    // the server's model process died serving the call
	KindNetwork        Kind = "network"          // unreachable, reset, stream cut
	KindTimeout        Kind = "timeout"          // no first token or no end in time
	KindContextTooLong Kind = "context_too_long" // the prompt does not fit
	KindAuth           Kind = "auth"             // missing or refused credentials
	KindInvalidRequest Kind = "invalid_request"  // the provider refused the request
	KindNotFound       Kind = "model_not_found"  // no such model
	KindCancelled      Kind = "cancelled"        // the caller cancelled
	KindBudget         Kind = "budget_exceeded"  // a budget has not enough left
	KindPolicy         Kind = "policy_denied"    // policy forbids the call
	KindInvalidOutput  Kind = "invalid_output"   // schema still broken after repairs
	KindUnknown        Kind = "unknown"
)

// Retryable reports whether the same call may succeed if sent again.
// KindCrashed is not: the same request usually crashes the model process
// again (a grammar it cannot handle, a prompt that hits a bug), and each
// crash costs a model reload.
func (k Kind) Retryable() bool {
	switch k {
	case KindRateLimited, KindOverloaded, KindNetwork, KindTimeout:
		return true
	}
	return false
}

// Fallback reports whether another model of the route may serve a call
// that failed with k: everything but the caller's own cancellation, a
// malformed request, and an exhausted budget or policy (which the next
// model would meet too; the router checks those per model itself).
func (k Kind) Fallback() bool {
	switch k {
	case KindCancelled, KindInvalidRequest, KindInvalidOutput:
		return false
	}
	return true
}

// Error is a classified model-call failure. Msg says what happened and
// what to do about it, for a human and for a model.
type Error struct {
	Kind       Kind
	Provider   string
	Model      string
	Status     int           // HTTP status, when there was one
	RetryAfter time.Duration // the provider's Retry-After, when given
	Msg        string
	Err        error // the cause, when there is one
}

func (e *Error) Error() string {
	s := string(e.Kind)
	switch {
	case e.Provider != "" && e.Model != "":
		s = fmt.Sprintf("%s %s: %s", e.Provider, e.Model, s)
	case e.Provider != "" || e.Model != "":
		s = e.Provider + e.Model + ": " + s
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	if e.Err != nil {
		s += " (" + e.Err.Error() + ")"
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// Is maps kinds onto the sentinel errors, so errors.Is(err,
// ErrUnavailable) holds for every transient failure.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrUnavailable:
		switch e.Kind {
		case KindRateLimited, KindOverloaded, KindCrashed, KindNetwork, KindTimeout, KindAuth, KindUnknown:
			return true
		}
	case ErrModelNotFound:
		return e.Kind == KindNotFound
	case ErrInvalidRequest:
		return e.Kind == KindInvalidRequest
	case ErrContextTooLong:
		return e.Kind == KindContextTooLong
	case ErrBudgetExceeded:
		return e.Kind == KindBudget
	case ErrPolicy:
		return e.Kind == KindPolicy
	case ErrInvalidOutput:
		return e.Kind == KindInvalidOutput
	}
	return false
}

// KindOf classifies err: the Kind of an *Error in its chain, else by the
// sentinels, context errors and network errors it wraps.
func KindOf(err error) Kind {
	if err == nil {
		return ""
	}
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Kind
	}
	switch {
	case errors.Is(err, context.Canceled):
		return KindCancelled
	case errors.Is(err, context.DeadlineExceeded):
		return KindTimeout
	case errors.Is(err, ErrModelNotFound):
		return KindNotFound
	case errors.Is(err, ErrInvalidRequest):
		return KindInvalidRequest
	case errors.Is(err, ErrContextTooLong):
		return KindContextTooLong
	case errors.Is(err, ErrBudgetExceeded):
		return KindBudget
	case errors.Is(err, ErrPolicy):
		return KindPolicy
	case errors.Is(err, ErrInvalidOutput):
		return KindInvalidOutput
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return KindNetwork
	}
	if errors.Is(err, ErrUnavailable) {
		return KindNetwork
	}
	return KindUnknown
}

// RetryAfterOf returns the Retry-After an *Error in err's chain carries.
func RetryAfterOf(err error) time.Duration {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.RetryAfter
	}
	return 0
}

// StatusKind classifies an HTTP status code of a model API.
func StatusKind(status int) Kind {
	switch {
	case status == 429:
		return KindRateLimited
	case status == 401 || status == 403:
		return KindAuth
	case status == 404:
		return KindNotFound
	case status == 408:
		return KindTimeout
	case status == 413:
		return KindContextTooLong
	case status >= 500:
		return KindOverloaded
	case status >= 400:
		return KindInvalidRequest
	}
	return KindUnknown
}
