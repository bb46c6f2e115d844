package waterfall

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/keel-runtime/keel"
)

// Node is one span of a Tree, placed.
type Node struct {
	Span keel.Span `json:"span"`
	// Depth is the number of ancestors shown above the span: 0 for a root.
	Depth int `json:"depth"`
	// Offset is when the span started, from the trace's start; never
	// negative.
	Offset time.Duration `json:"offset_ns"`
	// Duration is the span's; for a running span (Open), from its start
	// to the now Build was given. Never negative.
	Duration time.Duration `json:"duration_ns"`
	// Open is set for a span still running: its end is not recorded, and
	// its bar is drawn up to now.
	Open bool `json:"open,omitempty"`
	// Critical is set for the spans on the critical path: from the root
	// that ends last, repeatedly the child that ends last.
	Critical bool `json:"critical,omitempty"`
	// Children are the spans under this one, in start order.
	Children []*Node `json:"children,omitempty"`
}

// End is when the span ended (or, open, now), from the trace's start.
func (n *Node) End() time.Duration { return n.Offset + n.Duration }

// Tree is a trace laid out for a waterfall. Its JSON form is Start,
// Duration and the Roots with their Children, recursively.
type Tree struct {
	// Start is the earliest start of a span in the trace; zero when the
	// trace has no span.
	Start time.Time `json:"start"`
	// Duration runs from Start to the latest end of a span.
	Duration time.Duration `json:"duration_ns"`
	// Roots are the spans with no parent in the trace, in start order.
	Roots []*Node `json:"roots"`
	nodes []*Node // depth first, each node's children in start order after it
}

// Nodes returns every node of the tree, depth first: each node followed
// by its children, in start order. The slice is the Tree's: do not
// modify it.
func (t *Tree) Nodes() []*Node { return t.nodes }

// Critical returns the critical path, root first.
func (t *Tree) Critical() []*Node {
	var path []*Node
	for _, n := range t.nodes {
		if n.Critical {
			path = append(path, n)
		}
	}
	return path
}

// Build lays out spans, a trace or several grafted together (a
// sub-agent's root span names its parent run's step span as parent),
// as a Tree. now is the end of the spans still running (status
// keel.SpanRunning). Spans are taken in any order; a span whose parent
// is not among them, is itself, or is in a cycle of parents becomes a
// root, so none is lost. When two spans share an ID, children hang
// under the first. Build does not modify spans.
func Build(spans []keel.Span, now time.Time) *Tree {
	t := &Tree{}
	if len(spans) == 0 {
		return t
	}
	nodes := make([]Node, len(spans)) // one allocation for all of them
	byID := make(map[string]int, len(spans))
	t.Start = spans[0].Start
	for i, s := range spans {
		if s.Start.Before(t.Start) {
			t.Start = s.Start
		}
		if _, dup := byID[s.ID]; !dup {
			byID[s.ID] = i
		}
	}
	for i := range spans {
		s := &spans[i]
		n := &nodes[i]
		n.Span = *s
		n.Offset = s.Start.Sub(t.Start)
		n.Duration = max(s.Duration, 0)
		if s.Status == keel.SpanRunning {
			n.Open = true
			n.Duration = max(n.Duration, now.Sub(s.Start))
		}
		t.Duration = max(t.Duration, n.End())
	}

	// kids[i]: the indexes of span i's children; then each list, and the
	// roots, in start order (input order among equal starts).
	kids := make([][]int, len(spans))
	var roots []int
	for i, s := range spans {
		p, ok := byID[s.ParentID]
		if s.ParentID == "" || !ok || p == i {
			roots = append(roots, i)
			continue
		}
		kids[p] = append(kids[p], i)
	}
	byStart := func(a, b int) int {
		if c := spans[a].Start.Compare(spans[b].Start); c != 0 {
			return c
		}
		return a - b
	}
	slices.SortFunc(roots, byStart)
	for _, k := range kids {
		if len(k) > 1 {
			slices.SortFunc(k, byStart)
		}
	}

	// Depth first, without recursion: a trace may be very deep.
	t.nodes = make([]*Node, 0, len(spans))
	seen := make([]bool, len(spans))
	type item struct {
		i      int
		parent *Node
		depth  int
	}
	var stack []item
	walk := func(root int) {
		stack = append(stack[:0], item{root, nil, 0})
		for len(stack) > 0 {
			it := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if seen[it.i] {
				continue
			}
			seen[it.i] = true
			n := &nodes[it.i]
			n.Depth = it.depth
			if it.parent == nil {
				t.Roots = append(t.Roots, n)
			} else {
				it.parent.Children = append(it.parent.Children, n)
			}
			t.nodes = append(t.nodes, n)
			for j := len(kids[it.i]) - 1; j >= 0; j-- {
				stack = append(stack, item{kids[it.i][j], n, it.depth + 1})
			}
		}
	}
	for _, r := range roots {
		walk(r)
	}
	for i := range spans {
		walk(i) // in a cycle of parents: shown from where it is first met
	}
	markCritical(t.Roots)
	return t
}

// markCritical marks the critical path: among nodes, the one that ends
// last (of equal ends, the later in start order), then among its
// children, and so on down to a leaf.
func markCritical(nodes []*Node) {
	for len(nodes) > 0 {
		last := nodes[0]
		for _, n := range nodes[1:] {
			if n.End() >= last.End() {
				last = n
			}
		}
		last.Critical = true
		nodes = last.Children
	}
}

// SubRun returns the sub-agent run that a plan or DAG run's step span
// names in its attributes ({"run": ID, "attempt": N}), whose trace goes
// under that span; false for any other span.
func SubRun(s keel.Span) (keel.RunID, bool) {
	if s.Kind != keel.SpanStep || len(s.Attrs) == 0 {
		return "", false
	}
	var a struct {
		Run keel.RunID `json:"run"`
	}
	if json.Unmarshal(s.Attrs, &a) != nil || a.Run == "" {
		return "", false
	}
	return a.Run, true
}
