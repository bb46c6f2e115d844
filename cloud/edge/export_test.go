package edge

import "github.com/keel-runtime/keel"

// CutOutbox makes e's outbox stop for good at the first event at
// returns true for: that event and every later one are never stored, as
// if the process had died between journaling them and storing them.
func CutOutbox(e *Edge, at func(keel.Event) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cut = at
}
