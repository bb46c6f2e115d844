package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
)

// Label names a kind of data that must not go everywhere. Three are
// built in; a policy may name others of its own (lower-case letters,
// digits, '-' and '_', starting with a letter, at most 64 bytes).
type Label string

// Built-in labels.
const (
	// Private is data its owner does not want to leave the machine.
	Private Label = "private"
	// Secret is credentials and keys.
	Secret Label = "secret"
	// PII is personal data about someone.
	PII Label = "pii"
)

// ErrLabel is wrapped by the error of a malformed label name (it is
// keel.ErrLabel).
var ErrLabel = keel.ErrLabel

// ParseLabel checks that s is a well-formed label name (keel.CheckLabel).
func ParseLabel(s string) (Label, error) {
	if err := keel.CheckLabel(s); err != nil {
		return "", err
	}
	return Label(s), nil
}

// LabelSet is an immutable set of labels. The zero LabelSet is empty.
// Operations return new sets and never modify their operands, so a set
// may be shared between goroutines.
type LabelSet struct {
	s []Label // sorted, no duplicates
}

// Labels returns the set of the given labels.
func Labels(ls ...Label) LabelSet {
	if len(ls) == 0 {
		return LabelSet{}
	}
	s := slices.Clone(ls)
	slices.Sort(s)
	return LabelSet{slices.Compact(s)}
}

// Len is the number of labels in the set.
func (a LabelSet) Len() int { return len(a.s) }

// Has reports whether l is in the set.
func (a LabelSet) Has(l Label) bool {
	_, ok := slices.BinarySearch(a.s, l)
	return ok
}

// Slice returns the labels in sorted order, in a new slice.
func (a LabelSet) Slice() []Label { return slices.Clone(a.s) }

// Union is the set of labels in a or b: what data derived from both
// carries. It allocates only when the result is neither a nor b.
func (a LabelSet) Union(b LabelSet) LabelSet {
	if a.containsAll(b) {
		return a
	}
	if b.containsAll(a) {
		return b
	}
	out := make([]Label, 0, len(a.s)+len(b.s))
	i, j := 0, 0
	for i < len(a.s) && j < len(b.s) {
		switch {
		case a.s[i] < b.s[j]:
			out = append(out, a.s[i])
			i++
		case a.s[i] > b.s[j]:
			out = append(out, b.s[j])
			j++
		default:
			out = append(out, a.s[i])
			i, j = i+1, j+1
		}
	}
	out = append(out, a.s[i:]...)
	return LabelSet{append(out, b.s[j:]...)}
}

// Without is the set of labels of a other than l.
func (a LabelSet) Without(l Label) LabelSet {
	i, ok := slices.BinarySearch(a.s, l)
	if !ok {
		return a
	}
	out := make([]Label, 0, len(a.s)-1)
	return LabelSet{append(append(out, a.s[:i]...), a.s[i+1:]...)}
}

func (a LabelSet) containsAll(b LabelSet) bool {
	if len(b.s) > len(a.s) {
		return false
	}
	for _, l := range b.s {
		if !a.Has(l) {
			return false
		}
	}
	return true
}

// Equal reports whether a and b hold the same labels.
func (a LabelSet) Equal(b LabelSet) bool { return slices.Equal(a.s, b.s) }

// String renders the set as "{pii,private}".
func (a LabelSet) String() string {
	var b strings.Builder
	b.WriteByte('{')
	for i, l := range a.s {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(string(l))
	}
	b.WriteByte('}')
	return b.String()
}

// SourceKind is where labelled data enters a run.
type SourceKind string

// Sources of data.
const (
	// SourcePath is a file: its path (a filesystem grant's root, a
	// workspace path) decides its labels.
	SourcePath SourceKind = "path"
	// SourceScope is a knowledge scope.
	SourceScope SourceKind = "scope"
	// SourceTool is a tool's output, labelled by its manifest and by the
	// policy.
	SourceTool SourceKind = "tool"
	// SourceHuman is a message a person wrote into the run.
	SourceHuman SourceKind = "human"
	// SourceInput is a run's inputs (run.start parameters).
	SourceInput SourceKind = "input"
)

// Source names one place data comes from: a path, a scope or a tool
// name; Name is empty for SourceHuman and SourceInput.
type Source struct {
	Kind SourceKind
	Name string
}

// Declassification is a person's explicit decision to clear a label on
// a run: who, why, and when.
type Declassification struct {
	Label  Label
	By     string // who decided (a user name, or a client's identity)
	Reason string
	At     time.Time
}

// ErrDeclassification is wrapped by the error of a declassification
// that does not say which label, who or why.
var ErrDeclassification = errors.New("incomplete declassification")

// Context is the labels a run's context holds: the union of the labels
// of every piece of data that entered it, less the labels a person
// cleared. Every later message derives from the whole context, so the
// labels stay with it (summaries included) until declassified. The zero
// Context holds nothing. A Context is a value: Add and Declassify return
// a new one.
type Context struct {
	labels LabelSet
	log    []Declassification
}

// Labels is what the context holds now.
func (c Context) Labels() LabelSet { return c.labels }

// Add returns the context after data carrying ls entered it.
func (c Context) Add(ls LabelSet) Context {
	c.labels = c.labels.Union(ls)
	return c
}

// Declassify returns the context with d.Label cleared from what it holds
// now, and d recorded. Data that enters later with the same label
// brings it back: a declassification covers what the person saw. It
// fails with ErrDeclassification if d names no label, no one or no
// reason.
func (c Context) Declassify(d Declassification) (Context, error) {
	if d.Label == "" || strings.TrimSpace(d.By) == "" || strings.TrimSpace(d.Reason) == "" {
		return c, fmt.Errorf("%w: a declassification needs a label, who and why", ErrDeclassification)
	}
	c.labels = c.labels.Without(d.Label)
	c.log = append(slices.Clip(c.log), d)
	return c, nil
}

// Declassifications is the record of every declassification, oldest
// first, in a new slice.
func (c Context) Declassifications() []Declassification { return slices.Clone(c.log) }

// PathLabels returns every label the policy's path sources give, joined
// over every layer: the labels of data read from paths one cannot list
// (a call that opened more files than were recorded).
func (p *Policy) PathLabels() LabelSet {
	var out LabelSet
	for _, s := range p.sources {
		if s.kind == SourcePath {
			out = out.Union(s.labels)
		}
	}
	return out
}
