package keel

import (
	"strings"
	"testing"
	"time"
)

// TestNewSpanIDSorts: span IDs sort in the order they were made, across
// the clock being set back, and do not repeat.
func TestNewSpanIDSorts(t *testing.T) {
	t.Parallel()
	now := time.Now()
	var prev string
	seen := map[string]bool{}
	for i, at := range []time.Time{now, now, now.Add(-time.Hour), now.Add(time.Millisecond), now} {
		id := NewSpanID(at)
		if !strings.HasPrefix(id, "span_") || len(id) != len("span_")+20 {
			t.Fatalf("NewSpanID = %q, want span_ and 20 hex digits", id)
		}
		if id <= prev || seen[id] {
			t.Errorf("span ID %d %q does not sort after %q", i, id, prev)
		}
		prev, seen[id] = id, true
	}
}
