package wasmtools

import (
	"bytes"
	"errors"
	"sync/atomic"

	"github.com/tetratelabs/wazero/experimental"
)

// memoryCap backs the linear memory of one instance and refuses to grow
// it past limit bytes. Unlike a runtime-wide page limit, it records the
// refusal, so a guest that dies after a failed memory.grow is reported as
// resource_exhausted instead of crashed.
type memoryCap struct {
	limit    uint64
	exceeded atomic.Bool
}

func (m *memoryCap) Allocate(_, _ uint64) experimental.LinearMemory {
	return &cappedMemory{cap: m}
}

type cappedMemory struct {
	cap *memoryCap
	buf []byte
}

// Reallocate grows the memory to size bytes; the new bytes are zero.
// Memories only grow, so size is never below len(buf).
func (c *cappedMemory) Reallocate(size uint64) []byte {
	if size > c.cap.limit {
		c.cap.exceeded.Store(true)
		return nil
	}
	if have := uint64(len(c.buf)); size > have {
		c.buf = append(c.buf, make([]byte, size-have)...)
	}
	return c.buf[:size]
}

func (c *cappedMemory) Free() { c.buf = nil }

// errOutputLimit is what a guest's write to stdout gets past the limit.
var errOutputLimit = errors.New("output limit reached")

// limitedWriter keeps up to limit bytes. With fail set, a write past the
// limit fails and marks exceeded; otherwise the excess is dropped quietly
// (for stderr, which is only logged). A guest writes from the goroutine
// that called InstantiateModule or the exported function, and the fields
// are read after it returns, so no lock is needed.
type limitedWriter struct {
	buf      bytes.Buffer
	limit    int
	fail     bool
	exceeded bool
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	room := w.limit - w.buf.Len()
	if len(p) <= room {
		return w.buf.Write(p)
	}
	w.buf.Write(p[:max(room, 0)])
	w.exceeded = true
	if w.fail {
		return max(room, 0), errOutputLimit
	}
	return len(p), nil
}

// reset empties w for the next call of a pooled instance.
func (w *limitedWriter) reset() {
	w.buf.Reset()
	w.exceeded = false
}
