package wasmtools

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-runtime/keel/capabilities"

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
// Memories only grow, so size is never below len(buf), and the bytes
// past len(buf) were never written: they are still the zeros make gave.
// Capacity at least doubles (up to the limit) when size passes it, so a
// memory grown a few pages at a time, as a Go guest's heap is, is copied
// a handful of times, not once per quarter more (append's step for
// large slices: copying and clearing 64 MiB grown in pages cost a core
// some hundred milliseconds).
func (c *cappedMemory) Reallocate(size uint64) []byte {
	used := size
	if c.cap.tables != nil {
		used += c.cap.tables.Get()
	}
	if used > c.cap.limit {
		c.cap.exceeded.Store(true)
		return nil
	}
	if size > uint64(cap(c.buf)) {
		room := max(size, min(2*uint64(cap(c.buf)), c.cap.limit))
		buf := make([]byte, size, room)
		copy(buf, c.buf)
		c.buf = buf
	}
	c.buf = c.buf[:max(size, uint64(len(c.buf)))]
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

// limits are one tool's per-call limits: the registry's defaults
// (Config.CallTimeout, MemoryLimitMiB, MaxOutputBytes, WriteQuotaBytes),
// as its manifest and grants change them (see resolveLimits).
type limits struct {
	timeout    time.Duration
	memoryMiB  int
	output     int
	writeQuota int64 // <0: no quota
}

func (l limits) memoryBytes() uint64 { return uint64(l.memoryMiB) << 20 }

// defaultLimits are the limits of a tool whose manifest asks for none,
// and of asking a module for its manifest.
func (r *Registry) defaultLimits() limits {
	return limits{timeout: r.cfg.CallTimeout, memoryMiB: r.cfg.MemoryLimitMiB, output: r.cfg.MaxOutputBytes, writeQuota: r.cfg.WriteQuotaBytes}
}

// resolveLimits returns the limits of a tool whose manifest requests req
// and whose grants allow granted: each limit the manifest sets at or
// under the default is taken as asked; one above it is taken if granted
// at least as much, and otherwise raise names it, and calls are denied
// (permission_denied) until it is granted. A limit the manifest does not
// set stays at the default whatever is granted.
func (r *Registry) resolveLimits(req, granted capabilities.Limits) (_ limits, raise string) {
	l := r.defaultLimits()
	var missing []string
	// pick returns the limit to use of default def and request want;
	// def < 0 is no limit.
	pick := func(def, want, allowed int64, what, spec string) int64 {
		switch {
		case want == 0:
			return def
		case def >= 0 && want > def && want > allowed:
			missing = append(missing, fmt.Sprintf("%s (the default is %s; grant limit:%s)", what, spec, strings.SplitN(what, " ", 2)[0]))
		}
		return want
	}
	l.timeout = time.Duration(pick(l.timeout.Milliseconds(), req.TimeoutMS, granted.TimeoutMS,
		fmt.Sprintf("timeout of %s", time.Duration(req.TimeoutMS)*time.Millisecond), l.timeout.String())) * time.Millisecond
	l.memoryMiB = int(pick(int64(l.memoryMiB), req.MemoryMiB, granted.MemoryMiB,
		fmt.Sprintf("memory of %d MiB", req.MemoryMiB), fmt.Sprintf("%d MiB", l.memoryMiB)))
	l.output = int(pick(int64(l.output), req.OutputBytes, granted.OutputBytes,
		fmt.Sprintf("output of %d bytes", req.OutputBytes), fmt.Sprintf("%d bytes", l.output)))
	l.writeQuota = pick(l.writeQuota, req.WriteQuotaBytes, granted.WriteQuotaBytes,
		fmt.Sprintf("write_quota of %d bytes", req.WriteQuotaBytes), fmt.Sprintf("%d bytes", l.writeQuota))
	if len(missing) > 0 {
		raise = "a higher limit: " + strings.Join(missing, ", ")
	}
	return l, raise
}
