package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/keel-runtime/keel"
)

// Kind is the kind of action a decision is about.
type Kind uint8

// Action kinds.
const (
	// KindTool is a tool call: the tool, its side-effect class, its
	// arguments (and the paths and URLs among them).
	KindTool Kind = iota + 1
	// KindModel is a model call: provider, model, local or cloud, and
	// the labels of the context it would send.
	KindModel
	// KindEgress is a tool's network request: the tool and the
	// destination URL.
	KindEgress
	// KindKnowledge is a read of a knowledge scope.
	KindKnowledge
	// KindTelemetry is an export of traces or metrics to a destination.
	KindTelemetry
	numKinds = iota
)

var kindNames = [...]string{KindTool: "tool", KindModel: "model", KindEgress: "egress", KindKnowledge: "knowledge", KindTelemetry: "telemetry"}

func (k Kind) String() string {
	if k > 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", k)
}

func parseKind(s string) (Kind, bool) {
	for k, n := range kindNames {
		if n != "" && n == s {
			return Kind(k), true
		}
	}
	return 0, false
}

// Outcome is what a decision says: allow, ask (a person approves this
// exact call first) or deny. They are ordered from loose to strict; the
// zero Outcome is no verdict at all.
type Outcome uint8

// Outcomes, loosest first.
const (
	Allow Outcome = iota + 1
	Ask
	Deny
)

var outcomeNames = [...]string{0: "none", Allow: "allow", Ask: "ask", Deny: "deny"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", o)
}

func parseOutcome(s string) (Outcome, bool) {
	for o, n := range outcomeNames {
		if o > 0 && n == s {
			return Outcome(o), true
		}
	}
	return 0, false
}

// Layer is where a rule or setting comes from. Layers are ordered by
// precedence: LayerManaged is the highest.
type Layer uint8

// Layers, highest precedence first.
const (
	// LayerManaged is the system-wide file an administrator owns
	// (DefaultManagedPath).
	LayerManaged Layer = iota
	// LayerWorkspace is .keel/policy.json in the workspace a run names.
	LayerWorkspace
	// LayerUser is policy.json in the user's data directory.
	LayerUser
	// LayerRun is rules passed when a run starts, and the
	// --require-approval shorthand.
	LayerRun
	numLayers = iota
)

var layerNames = [...]string{"managed", "workspace", "user", "run"}

func (l Layer) String() string {
	if int(l) < len(layerNames) {
		return layerNames[l]
	}
	return fmt.Sprintf("Layer(%d)", l)
}

// Action is something about to happen that a policy decides. Which
// fields count depends on Kind; the others are ignored. Decide does not
// keep the Action or anything it points to.
type Action struct {
	Kind Kind

	// Tool is the tool's name (KindTool, KindEgress).
	Tool string
	// SideEffect is the tool's side-effect class (KindTool).
	SideEffect keel.SideEffect
	// Args is the call's arguments, a JSON object (KindTool); rules may
	// look at any value in it by JSON pointer. Empty counts as {}.
	Args json.RawMessage
	// Paths are the filesystem paths the call names, as written
	// (KindTool). Relative paths are relative to Base; Resolve, if set,
	// maps each to what the call would really touch.
	Paths   []string
	Base    string
	Resolve Resolver
	// URLs are the URLs the call names, as written (KindTool).
	URLs []string
	// Unresolvable says the call names paths or URLs that could not all
	// be read (KindTool; keel.CallTargets.Unresolvable): like a path or
	// URL that cannot be normalized, it satisfies the path or url
	// condition of every rule that asks or denies, and of no rule that
	// allows.
	Unresolvable bool

	// Destination is where a request or an export goes, a URL
	// (KindEgress, KindTelemetry).
	Destination string

	// Provider and Model name the model called (KindModel); Cloud says
	// whether the provider is a cloud one (the model layer knows).
	Provider string
	Model    string
	Cloud    bool

	// Scope is the knowledge scope read (KindKnowledge).
	Scope string
	// Own says the scope is the reader's own (KindKnowledge): a run's
	// workspace scope or its run scope. When no layer has a verdict, a
	// read of one's own scope is allowed and any other denied: every
	// other scope ("user", another workspace's) needs a rule that allows
	// it.
	Own bool

	// Labels are the labels the run's context holds (Context.Labels):
	// what a model call would send, what a tool's egress could carry.
	Labels LabelSet
}

// cause is why a decision came out as it did.
type cause uint8

const (
	causeBuiltin      cause = iota // nothing matched: the built-in default
	causeRule                      // a rule matched
	causeLayerDefault              // no rule of a layer matched; its default for the kind applied
	causeCloudOff                  // cloud: false
	causeNotCleared                // a label of the context is not cleared for the provider
	causeEgressLabels              // egress after labelled data entered the context
	causeNotOwnScope               // no verdict about a knowledge scope that is not the reader's own
)

// Decision is a policy's answer about one action, with what decided it.
// It is a small value that is cheap to build and copy; String formats
// the explanation only when called.
type Decision struct {
	Outcome Outcome
	cause   cause
	rule    *Rule
	setting *Setting
	label   Label
	subject string // the provider, for causeNotCleared
	kind    Kind
}

// Rule returns the rule that decided, or nil when a setting or the
// built-in default did.
func (d Decision) Rule() *Rule { return d.rule }

// Setting returns the setting that decided (cloud, clear, a layer's
// default, egress_after_labels), or nil when a rule or the built-in
// default did.
func (d Decision) Setting() *Setting { return d.setting }

// Label returns the label that decided: the one not cleared for a
// provider, or empty.
func (d Decision) Label() Label { return d.label }

// String explains the decision: the outcome, and the rule or setting
// that decided it with its layer and file:line:col.
func (d Decision) String() string {
	if d.cause == causeRule && d.Outcome == d.rule.Outcome && d.rule.expl != "" {
		return d.rule.expl
	}
	var b strings.Builder
	b.WriteString(d.Outcome.String())
	b.WriteString(": ")
	switch d.cause {
	case causeRule:
		b.WriteString(d.rule.String())
		if d.rule.Reason != "" {
			b.WriteString(": ")
			b.WriteString(d.rule.Reason)
		}
	case causeLayerDefault:
		fmt.Fprintf(&b, "no %s rule matched; %s", d.kind, d.setting)
	case causeCloudOff:
		fmt.Fprintf(&b, "no cloud model calls (%s)", d.setting)
	case causeNotCleared:
		if d.label == Private {
			fmt.Fprintf(&b, "the context holds data labelled %s, which never leaves this machine", d.label)
			break
		}
		fmt.Fprintf(&b, "the context holds data labelled %s, not cleared for %s", d.label, d.subject)
		if d.setting != nil {
			fmt.Fprintf(&b, " (%s)", d.setting)
		}
	case causeEgressLabels:
		b.WriteString("network egress after labelled data entered the context")
		if d.setting != nil {
			fmt.Fprintf(&b, " (%s)", d.setting)
		} else {
			b.WriteString(" (the default; egress_after_labels changes it)")
		}
	case causeNotOwnScope:
		b.WriteString(`no knowledge rule matched; a run reads only its own scopes (its workspace's and its own) unless a rule allows another`)
	default:
		if d.kind == KindKnowledge {
			b.WriteString("no knowledge rule matched; a run may read its own scopes")
			break
		}
		fmt.Fprintf(&b, "no rule matched; %ss are allowed by default", d.kind)
	}
	return b.String()
}

// Setting is one setting of a layer file (cloud, clear.LABEL,
// default.KIND, egress_after_labels) and where it is. Like a *Rule, a
// *Setting is shared: read it, never modify it.
type Setting struct {
	Key   string
	Layer Layer
	File  string
	Line  int
	Col   int
}

func (s *Setting) String() string {
	return fmt.Sprintf("%s set by the %s layer at %s:%d:%d", s.Key, s.Layer, s.File, s.Line, s.Col)
}

// Errors a policy file can have; a *FileError wraps one.
var (
	// ErrSyntax: the file is not one well-formed JSON object.
	ErrSyntax = errors.New("syntax error")
	// ErrUnknownField: a field the format does not have, or one that
	// does not apply to its rule's action.
	ErrUnknownField = errors.New("unknown field")
	// ErrDuplicateField: a field given twice in one object (JSON leaves
	// it to the reader which wins; a policy must not be ambiguous).
	ErrDuplicateField = errors.New("duplicate field")
	// ErrInvalid: a value of the wrong type or out of range.
	ErrInvalid = errors.New("invalid value")
	// ErrLocked: a lower layer sets a setting the managed layer locked.
	ErrLocked = errors.New("locked by the managed layer")
	// ErrTooLarge: the file exceeds MaxFileSize.
	ErrTooLarge = errors.New("file too large")
)

// FileError is a problem in a policy file, with where it is.
type FileError struct {
	File      string
	Line, Col int
	// Field is the field at fault, when one is ("rules[3].path").
	Field string
	Err   error // one of the Err* sentinels above
	Msg   string
}

func (e *FileError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s:%d:%d: %v", e.File, e.Line, e.Col, e.Err)
	if e.Field != "" {
		fmt.Fprintf(&b, " %s", e.Field)
	}
	if e.Msg != "" {
		b.WriteString(": ")
		b.WriteString(e.Msg)
	}
	return b.String()
}

// Unwrap returns the sentinel.
func (e *FileError) Unwrap() error { return e.Err }

// Warning is a problem in a policy file that does not stop it from
// loading: a rule that can never match, or a lower layer's attempt to
// loosen a setting a higher layer made stricter (which has no effect).
type Warning struct {
	File      string
	Line, Col int
	Msg       string
}

func (w Warning) String() string { return fmt.Sprintf("%s:%d:%d: %s", w.File, w.Line, w.Col, w.Msg) }
