package wasmtools

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
)

// memoryCap backs the linear memory of one instance and refuses to grow
// it past limit bytes, counting the instance's table entries too (see
// instrument). Unlike a runtime-wide page limit, it records the refusal,
// so a guest that dies after a failed memory.grow or table.grow is
// reported as resource_exhausted instead of crashed.
type memoryCap struct {
	limit    uint64
	exceeded atomic.Bool
	// tables and refused are the instance's tableBytesGlobal and
	// tableRefusedGlobal, set by bind; nil while it is instantiated,
	// when the initial tables were checked at load.
	tables, refused api.MutableGlobal
}

// bind connects m to mod, the instance whose memory it backs: it hands
// the limit to the table grow functions and reads what they count.
func (m *memoryCap) bind(mod api.Module) {
	m.tables = exportedGlobal(mod, tableBytesGlobal)
	m.refused = exportedGlobal(mod, tableRefusedGlobal)
	exportedGlobal(mod, memoryLimitGlobal).Set(m.limit)
}

// hit reports whether a memory or table grow was refused since the last
// reset.
func (m *memoryCap) hit() bool {
	return m.exceeded.Load() || m.refused != nil && m.refused.Get() != 0
}

// reset forgets refused grows, which a guest may have survived.
func (m *memoryCap) reset() {
	m.exceeded.Store(false)
	if m.refused != nil && m.refused.Get() != 0 {
		m.refused.Set(0)
	}
}

// exportedGlobal returns the global the rewrite exports as name.
func exportedGlobal(mod api.Module, name string) api.MutableGlobal {
	g, ok := mod.ExportedGlobal(name).(api.MutableGlobal)
	if !ok {
		// Every module is instrumented before it is compiled; this is
		// a bug, and the instance must not be trusted with a call.
		panic("wasmtools: module has no " + name + " global")
	}
	return g
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
	used := size
	if c.cap.tables != nil {
		used += c.cap.tables.Get()
	}
	if used > c.cap.limit {
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

// errStackOverflow returns the error wazero traps with when a guest's
// call stack exceeds wazero's ceiling. wazero does not export it (it is
// wasmruntime.ErrRuntimeStackOverflow, an internal package), so it is
// taken, once, from a module that recurses forever, run by the
// interpreter, whose ceiling is 2000 frames; both engines trap with the
// same value, which errors.Is then finds in any call's error.
var errStackOverflow = sync.OnceValue(func() error {
	// (module (func $f (export "f") (call $f)))
	bin := []byte("\x00asm\x01\x00\x00\x00" +
		"\x01\x04\x01\x60\x00\x00" + // type: () -> ()
		"\x03\x02\x01\x00" + // one function of it
		"\x07\x05\x01\x01f\x00\x00" + // export it as f
		"\x0a\x06\x01\x04\x00\x10\x00\x0b") // body: call 0
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	mod, err := rt.Instantiate(ctx, bin)
	if err != nil {
		panic("wasmtools: stack overflow probe: " + err.Error())
	}
	_, err = mod.ExportedFunction("f").Call(ctx)
	for err != nil && errors.Unwrap(err) != nil {
		err = errors.Unwrap(err)
	}
	if err == nil {
		panic("wasmtools: stack overflow probe: endless recursion returned")
	}
	return err
})
