package wasmtools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/tetratelabs/wazero"
)

// Unloading idle tools.
//
// A loaded tool holds its compiled module: wazero's native code (mapped
// memory) and its decoded module (Go heap), some 30 MiB for a Go tool. A
// tool not called for the registry's idle tool timeout gives it up and
// is left with what the index lists of a tool not loaded yet: its
// description, manifest, schemas and grants. Tools, Tool, grants and
// Reload see no difference. The next call loads the module again from
// the compilation cache, keyed by the file's sha256, not by what the
// file holds now (see compileAgain).
//
// A call holds the compiled module from before it starts its instance
// until it has put the instance back (acquire, unuse): an unload happens
// only when no call holds it, under the tool's lock, so code that runs
// is never closed, and a call that comes after an unload loads the
// module again. One timer per tool does it, armed only when the tool is
// loaded and idle: an idle daemon runs no code for its tools.

// DefaultIdleToolTimeout is how long a loaded tool is kept without calls;
// see Config.IdleToolTimeout.
const DefaultIdleToolTimeout = 5 * time.Minute

// reclaimDelay is how long reclaim waits to gather the releases of
// several tools and pools, which tend to come together (tools called
// together go idle together), into one debug.FreeOSMemory.
const reclaimDelay = time.Second

// loadAttempt is one loading of an unloaded tool's module; done is
// closed when it ends, err is set before.
type loadAttempt struct {
	done chan struct{}
	err  error
}

// acquire returns t's compiled module for one call, which must call unuse
// when it no longer runs code of it. If t was unloaded, acquire loads it
// again, one load for all the calls that need it, and waits for it under
// ctx only (not the call's time limit), as a call of a tool still
// loading at Open does. The caller has joined r.calls (begin). Errors:
// timeout when ctx or the registry ends first, not_found when the module
// cannot be loaded again.
func (r *Registry) acquire(ctx context.Context, t *tool) (wazero.CompiledModule, *keel.ToolError) {
	name := t.info.Spec.Name
	for {
		t.mu.Lock()
		if c := t.compiled; c != nil {
			t.refs++
			t.mu.Unlock()
			return c, nil
		}
		if t.closed {
			t.mu.Unlock()
			return nil, &keel.ToolError{Code: keel.ToolTimeout, Message: "the tool runtime is closing"}
		}
		a := t.loading
		if a == nil {
			a = &loadAttempt{done: make(chan struct{})}
			t.loading = a
			// The caller has joined r.calls, so Close cannot be past
			// its Wait: the load is waited for like a call.
			r.calls.Add(1)
			go r.loadAgain(t, a)
		}
		t.waiters++ // an unload waits for them to take it (see unloadIdle)
		t.mu.Unlock()
		select {
		case <-a.done:
		case <-ctx.Done():
			t.mu.Lock()
			if t.waiters--; t.waiters == 0 && t.refs == 0 {
				r.armUnload(t, r.toolTimeout)
			}
			t.mu.Unlock()
			return nil, &keel.ToolError{Code: keel.ToolTimeout, Message: fmt.Sprintf("tool %s was being loaded again after idling: %v", name, ctx.Err())}
		}
		t.mu.Lock()
		t.waiters--
		if c := t.compiled; a.err == nil && c != nil {
			t.refs++
			t.mu.Unlock()
			return c, nil
		}
		t.mu.Unlock()
		switch {
		case a.err == nil:
			// Unloaded or closed again at once; the loop sees which.
		case r.ctx.Err() != nil:
			return nil, &keel.ToolError{Code: keel.ToolTimeout, Message: "the tool runtime is closing"}
		default:
			return nil, &keel.ToolError{Code: keel.ToolNotFound, Message: fmt.Sprintf("tool %s could not be loaded again after idling: %v", name, a.err)}
		}
	}
}

// unuse ends a call's hold on t's compiled module (see acquire); the last
// one starts the idle timer.
func (r *Registry) unuse(t *tool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.refs--; t.refs == 0 {
		t.lastUse = time.Now()
		r.armUnload(t, r.toolTimeout)
	}
}

// loadAgain loads the module of the unloaded tool t and records the
// outcome in a. It runs on its own goroutine, counted in r.calls, under
// the registry's lifetime rather than a caller's, so a caller that stops
// waiting does not fail the others.
func (r *Registry) loadAgain(t *tool, a *loadAttempt) {
	defer r.calls.Done()
	start := time.Now()
	c, err := r.compileAgain(r.ctx, t)
	t.mu.Lock()
	t.loading = nil
	a.err = err
	if err == nil {
		if t.closed {
			_ = c.Close(context.Background())
		} else {
			t.compiled = c
			t.loads++
			t.lastUse = time.Now()
			r.armUnload(t, r.toolTimeout)
		}
	}
	t.mu.Unlock()
	close(a.done)
	if err != nil {
		r.log.Error("wasmtools: tool could not be loaded again after idling", logkey.Tool, t.info.Spec.Name, logkey.Err, err)
		return
	}
	r.log.Debug("wasmtools: tool loaded again", logkey.Tool, t.info.Spec.Name, logkey.Duration, time.Since(start))
	// Loading from the cache leaves garbage: the module's bytes and the
	// compiled code as read from the file (both copied into what wazero
	// keeps). Hand it back too.
	r.reclaim()
}

// compileAgain compiles t's module again: its instrumented form comes
// from the cache under the sha256 t was loaded with (else from the file,
// if it still has that sha256), and wazero finds the compiled code in
// its own cache. The module is the one load checked, so it is not
// checked again.
func (r *Registry) compileAgain(ctx context.Context, t *tool) (wazero.CompiledModule, error) {
	var sum [32]byte
	if _, err := hex.Decode(sum[:], []byte(t.info.SHA256)); err != nil {
		return nil, fmt.Errorf("bad sha256 %q: %w", t.info.SHA256, err)
	}
	key := fmt.Sprintf("%x-v%s.wasm", sum, instrumentVersion)
	bin, err := r.cached("instrumented", key, func() ([]byte, error) {
		orig, _, err := readTool(t.info.Path)
		if err != nil {
			return nil, err
		}
		if sha256.Sum256(orig) != sum {
			return nil, fmt.Errorf("%s changed since it was loaded, and the cache no longer holds the module it had", t.info.Path)
		}
		return instrument(orig)
	})
	if err != nil {
		return nil, err
	}
	return r.rt.CompileModule(r.compileContext(ctx), bin)
}

// armUnload starts t's idle timer to fire after d unless it is armed or
// unloading is off (d <= 0). t.mu is held.
func (r *Registry) armUnload(t *tool, d time.Duration) {
	if d <= 0 || t.closed {
		return
	}
	t.timer.arm(d, func() { r.unloadIdle(t) })
}

// unloadIdle is t's idle timer: it unloads t if it is loaded and has had
// no call for the timeout, and otherwise re-arms the timer for the rest
// of it. A tool in use is left alone; its last call re-arms the timer.
func (r *Registry) unloadIdle(t *tool) {
	t.mu.Lock()
	t.timer.fired()
	if t.closed || t.compiled == nil || t.refs > 0 || t.waiters > 0 {
		t.mu.Unlock()
		return
	}
	if idle := time.Since(t.lastUse); idle < r.toolTimeout {
		r.armUnload(t, r.toolTimeout-idle)
		t.mu.Unlock()
		return
	}
	// No call holds the module and none can take it while t.mu is held:
	// its idle instances are the only ones.
	if t.pool != nil {
		t.pool.drain(context.Background())
	}
	_ = t.compiled.Close(context.Background())
	t.compiled = nil
	t.unloads++
	t.mu.Unlock()
	r.log.Debug("wasmtools: idle tool unloaded", logkey.Tool, t.info.Spec.Name)
	r.reclaim()
	if r.cfg.testHookUnload != nil {
		r.cfg.testHookUnload(t.info.Spec.Name)
	}
}

// reclaim hands the memory just released back to the OS, once for all
// the releases within reclaimDelay. The Go runtime would return it only
// slowly: without this, the daemon's idle RSS did not drop at all
// (bench/footprint). It costs a collection.
func (r *Registry) reclaim() {
	r.reclaimMu.Lock()
	defer r.reclaimMu.Unlock()
	if r.reclaimStopped {
		return
	}
	r.reclaimTimer.arm(reclaimDelay, func() {
		r.reclaimMu.Lock()
		r.reclaimTimer.fired()
		r.reclaimMu.Unlock()
		debug.FreeOSMemory()
	})
}

// stopReclaim stops reclaim's timer for good; Close calls it.
func (r *Registry) stopReclaim() {
	r.reclaimMu.Lock()
	defer r.reclaimMu.Unlock()
	r.reclaimStopped = true
	r.reclaimTimer.stop()
}

// residency reports whether t's module is loaded and how often it was
// loaded again and unloaded, for tests.
func (t *tool) residency() (loaded bool, loads, unloads int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.compiled != nil, t.loads, t.unloads
}
