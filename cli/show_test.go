package cli

import (
	"fmt"
	"testing"

	"github.com/keel-runtime/keel"
)

// TestSpanTree: spans come out depth first under their parents, in the
// order given (start order); a span whose parent is elsewhere starts a
// tree, and a damaged trace (a cycle of parents) loses no span.
func TestSpanTree(t *testing.T) {
	sp := func(id, parent string) keel.Span { return keel.Span{ID: id, ParentID: parent} }
	for _, tt := range []struct {
		name  string
		spans []keel.Span
		want  string
	}{
		{"agent run", []keel.Span{sp("root", ""), sp("s1", "root"), sp("m1", "s1"), sp("s2", "root"), sp("t1", "s1"), sp("m2", "s2")},
			"[root/0 s1/1 m1/2 t1/2 s2/1 m2/2]"},
		{"sub-agent", []keel.Span{sp("root", "step-of-parent"), sp("s1", "root"), sp("m1", "s1")}, "[root/0 s1/1 m1/2]"},
		{"flat, before trees", []keel.Span{sp("m1", ""), sp("t1", "")}, "[m1/0 t1/0]"},
		{"cycle", []keel.Span{sp("root", ""), sp("a", "b"), sp("b", "a")}, "[root/0 a/0 b/1]"},
	} {
		var got []string
		for _, s := range spanTree(tt.spans) {
			got = append(got, fmt.Sprintf("%s/%d", s.ID, s.Depth))
		}
		if fmt.Sprint(got) != tt.want {
			t.Errorf("%s: spanTree = %v, want %s", tt.name, got, tt.want)
		}
	}
}

// TestSpanName: a model call's span named by the run's PROVIDER/MODEL
// was shown as "ollamav1/ollamav1/keel-tiny-tools".
func TestSpanName(t *testing.T) {
	for _, tt := range []struct {
		span keel.Span
		want string
	}{
		{keel.Span{Provider: "ollamav1", Name: "ollamav1/keel-tiny-tools"}, "ollamav1/keel-tiny-tools"},
		{keel.Span{Provider: "ollamav1", Name: "keel-tiny-tools"}, "ollamav1/keel-tiny-tools"},
		{keel.Span{Provider: "ollama", Name: "hf.co/org/m"}, "ollama/hf.co/org/m"},
		{keel.Span{Name: "wordcount"}, "wordcount"},
	} {
		if got := spanName(tt.span); got != tt.want {
			t.Errorf("spanName(%+v) = %q, want %q", tt.span, got, tt.want)
		}
	}
}
