package wasmtools

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
)

// A reactor tool is a module that exports _initialize, keel_alloc and
// keel_call (a Go tool built with -buildmode=c-shared and
// toolkit.Register). _initialize runs once per instance; keel_call may
// then be called many times on the same instance, so a warm call pays
// neither instantiation nor the guest runtime's start-up.
const (
	exportInitialize = "_initialize"
	exportAlloc      = "keel_alloc"
	exportCall       = "keel_call"
	exportManifest   = "keel_manifest"
)

// reactorExports are the exports a reactor needs, with their signatures.
var reactorExports = map[string]struct{ params, results []api.ValueType }{
	exportInitialize: {nil, nil},
	exportAlloc:      {[]api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}},
	exportCall:       {[]api.ValueType{api.ValueTypeI32, api.ValueTypeI32}, []api.ValueType{api.ValueTypeI64}},
}

// isReactor reports whether m exports _initialize and keel_call, and if
// so checks the reactor exports' signatures.
func isReactor(m wazero.CompiledModule) (bool, error) {
	fns := m.ExportedFunctions()
	if fns[exportInitialize] == nil || fns[exportCall] == nil {
		return false, nil
	}
	check := func(name string, params, results []api.ValueType) error {
		f := fns[name]
		if f == nil {
			return fmt.Errorf("is a reactor (exports %s and %s) but does not export %s", exportInitialize, exportCall, name)
		}
		if !bytes.Equal(f.ParamTypes(), params) || !bytes.Equal(f.ResultTypes(), results) {
			return fmt.Errorf("exports %s with the wrong signature", name)
		}
		return nil
	}
	for name, sig := range reactorExports {
		if err := check(name, sig.params, sig.results); err != nil {
			return true, err
		}
	}
	if fns[exportManifest] != nil {
		if err := check(exportManifest, nil, []api.ValueType{api.ValueTypeI64}); err != nil {
			return true, err
		}
	}
	return true, nil
}

// instance is one initialized instance of a reactor tool. It is used by
// one call at a time; the pool hands it from call to call.
type instance struct {
	mod    api.Module
	stop   api.MutableGlobal // the interrupt global
	alloc  api.Function
	call   api.Function
	mem    *memoryCap
	disk   diskUse // what it writes through read-write grants
	fs     *fsUse  // what it opens through its grants; nil: no grants
	stdout *limitedWriter
	stderr *limitedWriter
	// ctx is the context of the call using the instance, for the guest's
	// sleeps. It is set before each call, on the goroutine that makes it.
	ctx context.Context
	// in and inCap are the input buffer keel_alloc returned last.
	in, inCap uint32
	// interrupted is set once the interrupt fired on the instance, even
	// after its call had ended: it would trap at its next loop.
	interrupted bool
	// idleSince is when it last went back to the pool.
	idleSince time.Time
}

// pool is a bounded LIFO free list of idle instances of one tool. The
// most recently used instance is reused first, while its memory is warm.
//
// An instance left idle for the pool's timeout is closed, so a tool that
// is not being called stops holding memory. One timer per pool does it,
// armed only while the pool holds idle instances: an idle daemon runs no
// code for its pools.
type pool struct {
	mu      sync.Mutex
	idle    []*instance // oldest first
	max     int
	timeout time.Duration // <0: idle instances are kept until closed
	timer   onceTimer     // runs sweep
	closed  bool          // set when the tool is retired or the registry closes
	// reclaim hands released memory back to the OS (Registry.reclaim).
	reclaim func()
	// instantiations counts every instance created for calls, for tests
	// and statistics.
	instantiations atomic.Int64
}

func newPool(max int, timeout time.Duration, reclaim func()) *pool {
	if max <= 0 {
		max = 2 * runtime.GOMAXPROCS(0)
	}
	if timeout == 0 {
		timeout = DefaultIdleInstanceTimeout
	}
	return &pool{max: max, timeout: timeout, reclaim: reclaim}
}

func (p *pool) get() *instance {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.idle); n > 0 {
		inst := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		return inst
	}
	return nil
}

// put returns inst to the pool, or closes it when the pool is full or
// closed.
func (p *pool) put(ctx context.Context, inst *instance) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < p.max {
		if p.timeout > 0 {
			inst.idleSince = time.Now()
			p.arm(p.timeout)
		}
		p.idle = append(p.idle, inst)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	inst.close(ctx)
}

// arm starts the timer to fire after d unless it is already armed. p.mu
// is held.
func (p *pool) arm(d time.Duration) { p.timer.arm(d, p.sweep) }

// testHookSweep, set by tests before the pool's first put, runs after
// each sweep.
var testHookSweep func(*pool)

// sweep closes the instances idle for the timeout or longer and re-arms
// the timer for the oldest one left, if any.
func (p *pool) sweep() {
	p.mu.Lock()
	p.timer.fired()
	var old []*instance
	if !p.closed {
		now := time.Now()
		n := 0
		for n < len(p.idle) && now.Sub(p.idle[n].idleSince) >= p.timeout {
			n++
		}
		old = slices.Clone(p.idle[:n])
		clear(p.idle[:n])
		p.idle = append(p.idle[:0], p.idle[n:]...)
		if len(p.idle) > 0 {
			p.arm(p.timeout - now.Sub(p.idle[0].idleSince))
		}
	}
	p.mu.Unlock()
	for _, inst := range old {
		inst.close(context.Background())
	}
	if len(old) > 0 {
		// The instances' memory is garbage now, but the Go runtime would
		// hand it back to the OS only slowly.
		p.reclaim()
	}
	if testHookSweep != nil {
		testHookSweep(p)
	}
}

// drain closes the idle instances, leaving the pool open; the tool's
// unload calls it when no call holds an instance.
func (p *pool) drain(ctx context.Context) {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, inst := range idle {
		inst.close(ctx)
	}
}

// close closes the idle instances; instances put back later are closed
// too.
func (p *pool) close(ctx context.Context) {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.timer.stop()
	p.mu.Unlock()
	for _, inst := range idle {
		inst.close(ctx)
	}
}

func (inst *instance) close(ctx context.Context) {
	_ = inst.mod.Close(context.WithoutCancel(ctx))
}

// PoolStats describes the instance pool of one reactor tool.
type PoolStats struct {
	// Idle is the number of idle instances ready for a call.
	Idle int
	// IdleMemoryBytes is the linear memory of those instances (WebAssembly
	// pages × 64 KiB). Compiled code is shared and not counted.
	IdleMemoryBytes uint64
	// Instantiations counts the instances created for calls so far,
	// pooled or not.
	Instantiations int64
}

// PoolStats reports on the instance pool of the named tool. It returns
// false if no tool has that name or the tool is a command module, which
// gets a fresh instance for every call and has no pool.
func (r *Registry) PoolStats(name string) (PoolStats, bool) {
	t, ok := r.set.Load().tools[name]
	if !ok || t.pool == nil {
		return PoolStats{}, false
	}
	p := t.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PoolStats{Idle: len(p.idle), Instantiations: p.instantiations.Load()}
	for _, inst := range p.idle {
		s.IdleMemoryBytes += uint64(inst.mod.Memory().Size())
	}
	return s, true
}

// instantiate starts an instance of a reactor tool with configuration mc
// (the tool's grants, or nothing for its manifest) and runs its start
// function, if any, then _initialize, both under ctx's deadline.
// On failure it returns the outcome to classify and no instance.
func (r *Registry) instantiate(ctx context.Context, compiled wazero.CompiledModule, mc wazero.ModuleConfig, lim limits) (*instance, outcome) {
	inst := &instance{
		mem:    &memoryCap{limit: lim.memoryBytes()},
		stdout: &limitedWriter{limit: lim.output, fail: true},
		stderr: &limitedWriter{limit: stderrLimit},
		ctx:    ctx,
	}
	mc = mc.WithStartFunctions(). // _initialize runs below, under the interrupt
					WithStdin(bytes.NewReader(nil)).
					WithStdout(inst.stdout).
					WithStderr(inst.stderr).
					WithNanosleep(func(ns int64) { sleep(inst.ctx, ns) })
	mod, err := r.rt.InstantiateModule(experimental.WithMemoryAllocator(ctx, inst.mem), compiled, mc)
	if err != nil {
		if mod != nil {
			_ = mod.Close(context.WithoutCancel(ctx))
		}
		return nil, inst.outcome(nil, err, false)
	}
	inst.mod = mod
	inst.mem.bind(mod)
	inst.alloc = mod.ExportedFunction(exportAlloc)
	inst.call = mod.ExportedFunction(exportCall)
	inst.stop = interruptOf(mod)
	disarm := armInterrupt(ctx, inst.stop)
	if err = callStart(ctx, mod); err == nil {
		_, err = mod.ExportedFunction(exportInitialize).Call(ctx)
	}
	if !disarm() && err == nil {
		// The context ended just as _initialize returned.
		err = context.Cause(ctx)
	}
	if err != nil {
		o := inst.outcome(nil, err, false)
		inst.close(ctx)
		return nil, o
	}
	return inst, outcome{}
}

// outcome is what the instance's last call left behind.
func (inst *instance) outcome(result []byte, err error, tooBig bool) outcome {
	return outcome{
		stdout:         result,
		stderr:         bytes.Clone(inst.stderr.buf.Bytes()),
		err:            err,
		memoryExceeded: inst.mem.hit(),
		outputExceeded: inst.stdout.exceeded || tooBig,
	}
}

// invoke runs one call on inst: input into a keel_alloc buffer, then
// keel_call, whose result object is returned as the outcome's stdout.
// What the guest writes to stdout itself counts toward the output limit
// but is otherwise dropped.
func (r *Registry) invoke(ctx context.Context, inst *instance, input []byte) outcome {
	inst.ctx = ctx
	disarm := armInterrupt(ctx, inst.stop)
	defer func() { inst.interrupted = inst.interrupted || !disarm() }()
	inst.stdout.reset()
	inst.stderr.reset()
	inst.mem.reset() // a refused grow the guest survived is history
	if uint32(len(input)) > inst.inCap || inst.inCap == 0 {
		res, err := inst.alloc.Call(ctx, uint64(len(input)))
		if err != nil {
			return inst.outcome(nil, err, false)
		}
		inst.in, inst.inCap = uint32(res[0]), uint32(len(input))
	}
	if !inst.mod.Memory().Write(inst.in, input) {
		inst.inCap = 0
		return inst.outcome(nil, errors.New("keel_alloc returned a buffer outside the tool's memory"), false)
	}
	res, err := inst.call.Call(ctx, uint64(inst.in), uint64(len(input)))
	if err != nil {
		return inst.outcome(nil, err, false)
	}
	ptr, n := uint32(res[0]>>32), uint32(res[0])
	if int64(n) > int64(inst.stdout.limit) {
		return inst.outcome(nil, nil, true)
	}
	b, ok := inst.mod.Memory().Read(ptr, n)
	if !ok {
		return inst.outcome(nil, errors.New("keel_call returned a result outside the tool's memory"), false)
	}
	return inst.outcome(bytes.Clone(b), nil, false)
}

// reactorManifest starts an instance with nothing granted, under lim,
// and reads what keel_manifest returns.
func (r *Registry) reactorManifest(ctx context.Context, name string, compiled wazero.CompiledModule, lim limits) ([]byte, error) {
	if compiled.ExportedFunctions()[exportManifest] == nil {
		return nil, fmt.Errorf("reactor exports no %s and has no sidecar %s.manifest.json", exportManifest, name)
	}
	ctx, cancel := context.WithTimeout(ctx, lim.timeout)
	defer cancel()
	late := fmt.Sprintf("did not finish within %s", lim.timeout)
	inst, o := r.instantiate(ctx, compiled, baseModuleConfig().WithArgs(name), lim)
	if inst == nil {
		return nil, fmt.Errorf("start reactor for its manifest: %s", r.failure(ctx, o, late, lim).Message)
	}
	defer inst.close(ctx)
	disarm := armInterrupt(ctx, inst.stop)
	res, err := inst.mod.ExportedFunction(exportManifest).Call(ctx)
	disarm()
	if err != nil {
		return nil, fmt.Errorf("%s: %s", exportManifest, r.failure(ctx, inst.outcome(nil, err, false), late, lim).Message)
	}
	ptr, n := uint32(res[0]>>32), uint32(res[0])
	if n == 0 {
		return nil, fmt.Errorf("%s returned nothing (did the tool call toolkit.Register from init?)", exportManifest)
	}
	if n > maxManifestBytes {
		return nil, fmt.Errorf("manifest is larger than %d bytes", maxManifestBytes)
	}
	b, ok := inst.mod.Memory().Read(ptr, n)
	if !ok {
		return nil, fmt.Errorf("%s returned a manifest outside the tool's memory", exportManifest)
	}
	return bytes.Clone(b), nil
}
