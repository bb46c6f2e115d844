package policy

import (
	"slices"
	"strings"
)

// Locks lists the settings the managed layer locked, each with where
// its lock is (Key is the locked key: "cloud", "clear.private",
// "default", ...), sorted by key, in a new slice. A lower layer cannot
// set a locked setting to another value (Compile refuses it).
func (p *Policy) Locks() []*Setting {
	out := make([]*Setting, 0, len(p.locks))
	for _, s := range p.locks {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *Setting) int { return strings.Compare(a.Key, b.Key) })
	return out
}
