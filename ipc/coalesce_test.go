package ipc

import (
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestCoalescer: the first delta goes at once, later ones arriving within
// deltaInterval are joined, flush sends what is held, and a restart voids
// what was held back with what was sent.
func TestCoalescer(t *testing.T) {
	var sent []protocol.ChatDelta
	co := &coalescer{send: func(d protocol.ChatDelta) { sent = append(sent, d) }}
	co.add(protocol.ChatDelta{Content: "a"})
	if len(sent) != 1 || sent[0].Content != "a" {
		t.Fatalf("first delta not sent at once: %+v", sent)
	}
	for _, s := range []string{"b", "c", "d"} {
		co.add(protocol.ChatDelta{Content: s})
	}
	if len(sent) != 1 {
		t.Errorf("deltas within the interval were sent one by one: %+v", sent)
	}
	co.add(protocol.ChatDelta{Content: "X", Restart: true})
	co.add(protocol.ChatDelta{Content: "Y"})
	co.flush()
	co.flush() // nothing held: no empty delta
	if len(sent) != 2 || sent[1].Content != "XY" || !sent[1].Restart {
		t.Errorf("after restart and flush: %+v, want one delta XY with restart", sent)
	}
	time.Sleep(deltaInterval)
	co.add(protocol.ChatDelta{Content: "z"})
	var b strings.Builder
	for _, d := range sent {
		if d.Restart {
			b.Reset()
		}
		b.WriteString(d.Content)
	}
	if b.String() != "XYz" {
		t.Errorf("replayed deltas = %q, want XYz", b.String())
	}
}
