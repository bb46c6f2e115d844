package keel

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"sync/atomic"
	"time"
)

// lastSpanTime is the time in the last span ID NewSpanID made.
var lastSpanTime atomic.Int64

// NewSpanID returns a new span ID that sorts after every span ID made
// before it in this process: "span_", the time now in nanoseconds (made
// to increase), and four random hex digits in case the clock was set
// back. The store keeps a run's spans in one B-tree ordered by ID, so a
// new span is appended at the run's end instead of splitting a page in
// its middle, and a span started inside another (a retrieval inside its
// tool call, whoever makes it) sorts after it. Safe for concurrent use.
func NewSpanID(now time.Time) string {
	t := now.UnixNano()
	for {
		last := lastSpanTime.Load()
		if t <= last {
			t = last + 1
		}
		if lastSpanTime.CompareAndSwap(last, t) {
			break
		}
	}
	var b [10]byte
	binary.BigEndian.PutUint64(b[:8], uint64(t))
	rand.Read(b[8:])
	return "span_" + hex.EncodeToString(b[:])
}
