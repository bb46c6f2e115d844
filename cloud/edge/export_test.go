package edge

import (
	"github.com/keel-runtime/keel"
	"github.com/nats-io/nats.go"
)

// CutOutbox makes e's outbox stop for good at the first event at
// returns true for: that event and every later one are never stored, as
// if the process had died between journaling them and storing them.
func CutOutbox(e *Edge, at func(keel.Event) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cut = at
}

// Conn returns e's connection to its own leaf server.
func Conn(e *Edge) *nats.Conn { return e.nc }
