package keel

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// Data labels on the wire. A label names a kind of data that must not go
// everywhere: "private", "secret", "pii", or a name of the user's own
// (see package policy, policy.Label). A set of labels travels as a
// sorted list of names without duplicates; nil or empty is no label.
// Labels follow data through a run: what a tool call read, a person's
// message, a run's inputs carry them into the run's context, and
// everything derived from the context (a model's answer, a summary)
// carries the context's labels.

// LabelPrivate is the built-in label of data that never leaves the
// machine (RunPolicy.Private, a grant marked private).
const LabelPrivate = "private"

// MaxLabelLen is the longest label name, in bytes.
const MaxLabelLen = 64

// ErrLabel is wrapped by the error of a malformed label name.
var ErrLabel = errors.New("malformed label")

type labelError string

func (e labelError) Error() string {
	return fmt.Sprintf("%q is not a label: want a lower-case letter, then letters, digits, - or _ (at most %d)", string(e), MaxLabelLen)
}

func (labelError) Unwrap() error { return ErrLabel }

// CheckLabel reports whether s is a label name: a lower-case letter,
// then lower-case letters, digits, '-' or '_', at most MaxLabelLen bytes.
// It is the one grammar of labels (package policy, the grants, the
// protocol's edge all use it); the error wraps ErrLabel.
func CheckLabel(s string) error {
	ok := len(s) > 0 && len(s) <= MaxLabelLen && s[0] >= 'a' && s[0] <= 'z'
	for i := 1; ok && i < len(s); i++ {
		c := s[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_'
	}
	if !ok {
		return labelError(s)
	}
	return nil
}

// NormalizeLabels checks every label of ls (CheckLabel) and returns them
// sorted without duplicates; nil when ls is empty. ls is not modified.
func NormalizeLabels(ls []string) ([]string, error) {
	if len(ls) == 0 {
		return nil, nil
	}
	for _, l := range ls {
		if err := CheckLabel(l); err != nil {
			return nil, err
		}
	}
	out := slices.Clone(ls)
	slices.Sort(out)
	return slices.Compact(out), nil
}

// UnionLabels returns the labels of a and b, sorted without duplicates;
// nil when both are empty. Neither is modified.
func UnionLabels(a, b []string) []string {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := make([]string, 0, len(a)+len(b))
	out = append(append(out, a...), b...)
	slices.Sort(out)
	return slices.Compact(out)
}

// MaxTouchedPaths bounds Touched.Paths: a call that opens more files
// records the first ones and sets Truncated.
const MaxTouchedPaths = 256

// Touched is what one tool call reached, as the tool host saw it: the
// host files it opened (resolved paths, beneath its grants) and the
// network hosts it sent requests to. The engine labels the call's
// result from it (the policy's path sources) and shows it on the call's
// span and event.
type Touched struct {
	// Paths are the host paths of the files and directories the call
	// opened, deduplicated, in first-open order, at most MaxTouchedPaths.
	Paths []string `json:"paths,omitempty"`
	// Truncated: the call opened more than MaxTouchedPaths paths; the
	// engine then labels the result as if it had read every path its
	// grants reach.
	Truncated bool `json:"truncated,omitempty"`
	// Hosts are the host:port of every network request the call made,
	// allowed or refused, deduplicated, in order.
	Hosts []string `json:"hosts,omitempty"`
	// Labels are the labels the host itself gives the call's output: of
	// each filesystem grant the call opened a file beneath
	// (capabilities.FSGrant.Labels) and of the tool's manifest
	// declaration. Sorted, no duplicates.
	Labels []string `json:"labels,omitempty"`
	// Refused are the requests the call's egress check refused with an
	// *EgressRefusal (the policy's decision), in order.
	Refused []EgressRefusal `json:"refused,omitempty"`
}

// EgressRefusal is why the policy refused a tool's network request: its
// decision about the destination (deny, or ask for a call no person
// approved). An EgressCheck returns it (or an error wrapping it) to
// refuse a request; the tool host records it (Touched.Refused) and the
// call fails with policy_denied.
type EgressRefusal struct {
	Tool        string         `json:"tool"`
	Destination string         `json:"destination"`
	Decision    PolicyDecision `json:"decision"`
}

func (e *EgressRefusal) Error() string {
	return fmt.Sprintf("the policy refused %s's request to %s (policy version %d): %s", e.Tool, e.Destination, e.Decision.Version, e.Decision.Explanation)
}

// As lets errors.As see the refusal as the *ToolError the call fails
// with: policy_denied, with the refusal as its message.
func (e *EgressRefusal) As(target any) bool {
	if t, ok := target.(**ToolError); ok {
		*t = &ToolError{Code: ToolPolicyDenied, Message: e.Error()}
		return true
	}
	return false
}

// EgressCheck is asked by the tool host before each network request a
// call makes, with the request's destination URL; a non-nil error
// refuses the request (the tool sees a network error naming the
// reason). It is called on the call's goroutine and must honour ctx.
type EgressCheck func(ctx context.Context, dest string) error

// DeclassifyRequest is the params of run.declassify: a person clears a
// label from what a run's context holds now, saying why. Data that
// enters later with the same label brings it back.
type DeclassifyRequest struct {
	RunID RunID `json:"run_id"`
	// Label is the label cleared; it must be one the context holds.
	Label string `json:"label"`
	// Reason says why; it must not be empty.
	Reason string `json:"reason"`
	// By names who decided; empty means the client's identity (its
	// initialize name), else "user".
	By string `json:"by,omitempty"`
}

// DeclassifyData is the payload of EventDeclassified: who cleared which
// label of the run's context and why (the event's time says when).
type DeclassifyData struct {
	Label  string `json:"label"`
	By     string `json:"by"`
	Reason string `json:"reason"`
	// Labels are what the context holds after it.
	Labels []string `json:"labels,omitempty"`
}

// PolicyChangeData is the payload of EventPolicyChanged: the policy in
// force changed while the run was live (a policy file was edited), or a
// policy file stopped loading and the last good policy stays in force
// (Error says why, with file and line).
type PolicyChangeData struct {
	Version uint64 `json:"version"`
	Digest  string `json:"digest"`
	Error   string `json:"error,omitempty"`
}
