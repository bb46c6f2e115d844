package wasmtools

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/schema"
	"github.com/tetratelabs/wazero"
	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// Defaults for the zero fields of Config.
const (
	DefaultCallTimeout    = 10 * time.Second
	DefaultMemoryLimitMiB = 256
	DefaultMaxOutputBytes = 1 << 20
	// DefaultIdleInstanceTimeout is how long an idle pooled instance is
	// kept; see Config.IdleInstanceTimeout.
	DefaultIdleInstanceTimeout = 30 * time.Second
)

// maxMemoryLimitMiB is the most a 32-bit WebAssembly memory can address.
const maxMemoryLimitMiB = capabilities.MaxMemoryMiB

// stderrLimit bounds what is kept of a tool's stderr for the log.
const stderrLimit = 4 << 10

// Config configures a Registry. Only Dir is required; every other zero
// field takes the default it documents. A Config is read once by Open.
type Config struct {
	// Dir holds the tools: NAME.wasm, with an optional NAME.manifest.json
	// beside it. Required.
	Dir string
	// CacheDir is wazero's compilation cache directory, created if
	// missing. "" keeps compiled code in memory only, so every Open
	// compiles again.
	CacheDir string
	// Grants holds what each tool may touch, by tool name, whatever its
	// module: a fixed configuration for a program that ships its tools. A
	// tool that is not in the map gets nothing: no directories, no
	// environment.
	Grants map[string]capabilities.Grants
	// GrantsFor, when set, is asked for a tool's grants at every load and
	// Reload instead of Grants, with the tool's name and its
	// Tool.GrantDigest (the .wasm file's digest, covering the sidecar
	// manifest when there is one), so grants can be bound to one module
	// and manifest (a file or sidecar replaced by another gets what
	// GrantsFor says of the new digest) and can change while the daemon
	// runs: a tool whose grants changed is reloaded by the next Reload. It
	// must be safe for concurrent use.
	GrantsFor func(name, grantDigest string) capabilities.Grants
	// AllowPrivateNetwork lets tools reach loopback, private and
	// link-local addresses when granted. Default false: the daemon, Ollama
	// and the rest of the local network are out of reach whatever a tool
	// is granted.
	AllowPrivateNetwork bool
	// Background makes Open return at once and compile the tools in the
	// background (compiling a Go module takes seconds); Ready reports when
	// they are loaded and Progress how far it got. Each tool is listed
	// and callable as soon as it has loaded; Call of a tool still queued
	// loads it at once and waits for it alone. Default false: Open
	// returns with every tool loaded.
	Background bool
	// OnChange, when set, is called after every Reload that changed the
	// tools or their grants (including those Watch makes) and, with
	// Background, as each tool of the first load becomes callable and
	// when that load ends, so that clients need not poll Progress. It
	// must not block or call back into the Registry.
	OnChange func()
	// CallTimeout bounds a whole call, from instantiation (and the
	// module's start function) to the last byte of output, and asking a
	// module for its manifest at a load or Inspect. Default 10s.
	CallTimeout time.Duration
	// MemoryLimitMiB caps each instance's linear memory and tables
	// together (8 bytes per table entry). Default 256, at most 4096.
	MemoryLimitMiB int
	// MaxOutputBytes caps what a tool may write to stdout in one call.
	// Default 1 MiB.
	MaxOutputBytes int
	// WriteQuotaBytes caps what one call may write through each
	// read-write grant: the bytes it writes (overwritten bytes too), plus
	// what it adds to a file without writing it (truncating it longer,
	// fd_allocate, writing past its end). The write that would pass the
	// quota is refused and the call fails with resource_exhausted, even
	// if the tool carries on. Default 1 GiB; negative: no quota.
	WriteQuotaBytes int64
	// MinFreeDiskBytes is the free space, on the host filesystem holding
	// a read-write grant, that a tool's write must leave; a write that
	// would leave less is refused and the call fails with
	// resource_exhausted. Default 1 GiB; negative: no floor. Where free
	// space cannot be read (platforms without statfs), only the quota
	// applies.
	MinFreeDiskBytes int64
	// MaxIdleInstances bounds the idle, initialized instances kept per
	// reactor tool for warm calls. Default 2 × GOMAXPROCS.
	MaxIdleInstances int
	// IdleInstanceTimeout is how long an idle pooled instance is kept
	// before it is closed and its memory released; the next call after
	// that pays a new instance. Default 30s; negative keeps idle
	// instances until the tool is retired or the registry closed.
	IdleInstanceTimeout time.Duration
	// IdleToolTimeout is how long a loaded tool is kept without calls
	// before its compiled module (tens of MiB for a Go tool) is released;
	// the tool stays listed, granted and callable, and the next call
	// loads the module again from CacheDir first (about 0.2 s for a Go
	// tool). Default 5 minutes; negative keeps every tool loaded. Without
	// a CacheDir tools are never unloaded, since loading one again would
	// mean compiling it again.
	IdleToolTimeout time.Duration
	// Compiler, when set with a CacheDir, compiles each tool in a child
	// process rather than in this one (see compiler.go): the compile's
	// memory (hundreds of MiB for a Go module) is never held here, and a
	// compiler crash ends only the child. A tool so compiled starts
	// unloaded: its first call loads it from the cache. Default nil:
	// tools compile in this process.
	Compiler *Compiler
	// Logger receives load problems and call outcomes. Default discards.
	Logger *slog.Logger
	// Interceptors see every call before and after it runs, in the order
	// package intercept defines; one may deny a call. Nil: none. They run
	// on the caller's goroutine and must be safe for concurrent calls.
	Interceptors intercept.Tools

	// testHookChild, set by tests, runs before each compile child starts.
	testHookChild func(name string)
	// testHookUnload, set by tests, runs after each unload of an idle
	// tool (see unloadIdle).
	testHookUnload func(name string)
	// testHookCall, set by tests, runs in each Call once the call is in
	// flight (counted, its module held), before the guest runs.
	testHookCall func(name string)
	// testHookInstance, set by tests, runs in each call of a reactor
	// tool once the call holds its instance, before the guest runs.
	testHookInstance func(name string)
	// testCache, set by tests with a CacheDir, is the compilation cache
	// (on that directory) that the registry uses instead of its own and
	// leaves open at Close: tests share one, so that a module compiled
	// or read from disk for one registry serves the next.
	testCache wazero.CompilationCache
}

// Tool is one loaded tool.
type Tool struct {
	Spec     keel.ToolSpec
	Requests capabilities.Grants // what the manifest asked for
	Grants   capabilities.Grants // what it was given
	// Labels are the labels its manifest declares its output carries
	// (sorted); every call's keel.Touched.Labels holds them.
	Labels []string
	SHA256 string // hex digest of the .wasm file
	// GrantDigest is what grants are bound to (Config.GrantsFor): SHA256
	// when the tool has no sidecar manifest, else a digest over SHA256
	// and the sidecar's bytes (see GrantDigest).
	GrantDigest string
	Path        string // the .wasm file
	// Compiling is set for a tool listed, while the tools found at Open
	// load in the background, from what the last start recorded of its
	// unchanged file (see index.go): a call waits for it to load.
	Compiling bool
}

// Registry holds the tools of one directory, compiled and ready to call.
// Its methods are safe for concurrent use.
type Registry struct {
	cfg   Config
	log   *slog.Logger
	rt    wazero.Runtime
	cache wazero.CompilationCache // nil without a CacheDir
	// ownCache is set when cache is the registry's own, closed by Close.
	ownCache bool
	wasi     map[string]bool // function names WASI offers
	// set is the current tool set; Reload swaps it atomically so calls
	// never see a half-updated registry.
	set atomic.Pointer[toolSet]
	// ready is closed when the first load is done; total and loaded
	// count the tool files of that load, for progress.
	ready         chan struct{}
	total, loaded atomic.Int32
	// first is the queue of that first load while it runs in the
	// background (Config.Background); see lookup. listedAll is set when
	// the index listed every tool of it.
	first     atomic.Pointer[loadQueue]
	listedAll bool
	// loadLock serializes loads (the first, in the background, and
	// Reload), held by sending to it (see lockLoad); retired holds
	// replaced tools, released at
	// Close because calls begun before a swap may still use them.
	loadLock chan struct{}
	retired  []*tool

	// ctx is the registry's lifetime: Close cancels it, which stops the
	// calls in flight.
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	closed bool
	calls  sync.WaitGroup

	// toolTimeout is Config.IdleToolTimeout resolved: 0 when tools are
	// never unloaded (see unload.go).
	toolTimeout time.Duration
	// reclaim's timer, which gathers the releases of idle memory into
	// one debug.FreeOSMemory.
	reclaimMu      sync.Mutex
	reclaimTimer   onceTimer
	reclaimStopped bool
	// childSlot holds the one compile child allowed at a time.
	childSlot chan struct{}
	// workers is how many functions a compile works on at once; 0: one
	// per core. A compile child sets it (Compiler.Workers).
	workers int
}

// toolSet is an immutable snapshot of the loaded tools.
type toolSet struct {
	tools map[string]*tool
	names []string // sorted
}

// tool is a loaded tool, or one listed from the index while it loads
// (pending). Only its compiled module and what tracks its use (under mu)
// change after it is loaded: an idle tool gives the module up until its
// next call (see unload.go).
type tool struct {
	info Tool
	// pending marks a tool listed from the index and not loaded yet: it
	// has a description and nothing else.
	pending bool
	// stamp and manifest are what the index records of the tool.
	stamp    fileStamp
	manifest []byte

	// mu guards compiled and the fields after it up to loads. compiled
	// is nil while the tool is unloaded (and for a pending tool); calls
	// take it through acquire.
	mu       sync.Mutex
	compiled wazero.CompiledModule
	refs     int          // calls holding compiled
	waiters  int          // calls waiting for it to be loaded again
	loading  *loadAttempt // non-nil while it is loaded again
	lastUse  time.Time    // when refs last fell to 0
	timer    onceTimer    // the idle timer: runs unloadIdle
	closed   bool         // set by close: no timer, no loading again
	// loads and unloads count the loads after an unload and the unloads.
	loads, unloads int

	input  *schema.Schema
	output *schema.Schema // nil: no output schema
	// targets are the arguments its input schema marks as paths and
	// URLs (targets.go).
	targets argTargets
	// module holds argv, clocks, randomness and the granted environment;
	// each instance adds the mounts (instanceConfig), each call its own
	// stdio.
	module wazero.ModuleConfig
	mounts []mount
	roots  []*os.Root
	// granted is what the configuration granted when it was loaded.
	granted capabilities.Grants
	// sidecar is the sidecar manifest it was loaded with; nil if none.
	sidecar []byte
	// missing names a request the grants do not cover; calls fail with
	// permission_denied while it is set.
	missing string
	// pool holds idle instances of a reactor tool; nil for a command
	// module, which runs in a fresh instance for every call.
	pool *pool
	// fresh is set when the manifest asks for isolation "fresh": a
	// reactor then gets a new instance for every call too.
	fresh bool
	// limits are its calls' limits (see resolveLimits).
	limits limits
}

// Open loads every NAME.wasm in cfg.Dir: it compiles the module, reads
// its manifest (the sidecar NAME.manifest.json if present, else what the
// module prints for --manifest), validates it and prepares the mounts
// its grants allow. A file that fails any step is logged and skipped; the
// others still load. Open fails only when the configuration is unusable
// or cfg.Dir cannot be read.
func Open(ctx context.Context, cfg Config) (*Registry, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("wasmtools: Config.Dir is required: %w", keel.ErrInvalid)
	}
	entries, err := os.ReadDir(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("wasmtools: read tool directory: %w", err)
	}
	r, err := newRegistry(ctx, cfg)
	if err != nil {
		return nil, err
	}
	cfg, log := r.cfg, r.log
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.ready = make(chan struct{})
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".wasm") && !e.IsDir() {
			r.total.Add(1)
		}
	}

	if cfg.Background {
		// Serve an empty set at once; the loader holds loadLock so a
		// Reload waits for it, and Close waits for it through loadLock
		// too.
		// Each tool is published as soon as it has loaded, and a call
		// of a tool still queued loads it at once (see lookup). Until
		// then the index lists what it knows of each (see index.go).
		set, q := r.plan(r.ctx, entries, nil)
		listed := &toolSet{tools: map[string]*tool{}}
		for _, name := range q.todo {
			if t, ok := r.listed(name); ok {
				listed.tools[name] = t
			}
		}
		listed.names = slices.Sorted(maps.Keys(listed.tools))
		r.listedAll = len(listed.names) == len(q.todo)
		r.set.Store(listed)
		q.publish = r.publish
		r.first.Store(q)
		r.loadLock <- struct{}{}
		go func() {
			defer r.unlockLoad()
			defer close(r.ready)
			start := time.Now()
			set, err := r.loadAll(set, q)
			if err != nil {
				log.Info("wasmtools: loading tools stopped: the registry is closing", logkey.Err, err)
				return
			}
			r.set.Store(set)
			log.Info("wasmtools: all tools loaded", logkey.Tools, len(set.names), logkey.Duration, time.Since(start))
			if cfg.OnChange != nil {
				cfg.OnChange() // the first load ended (Ready)
			}
		}()
		return r, nil
	}
	set, err := r.loadDir(ctx, entries, nil)
	if err != nil {
		_ = r.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	r.set.Store(set)
	close(r.ready)
	for name := range cfg.Grants {
		if _, ok := set.tools[name]; !ok {
			log.Warn("wasmtools: grant for a tool that is not loaded", logkey.Tool, name)
		}
	}
	return r, nil
}

// newRegistry applies cfg's defaults and builds the runtime every module
// is compiled and run in: the compilation cache, WASI and the keel host
// module. Open and the compile child (compiler.go) both build theirs
// here, so that what the child compiles is found in the cache under the
// same key by the daemon. It starts nothing.
func newRegistry(ctx context.Context, cfg Config) (*Registry, error) {
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.MemoryLimitMiB <= 0 {
		cfg.MemoryLimitMiB = DefaultMemoryLimitMiB
	}
	cfg.MemoryLimitMiB = min(cfg.MemoryLimitMiB, maxMemoryLimitMiB)
	if cfg.MaxOutputBytes <= 0 {
		cfg.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if cfg.WriteQuotaBytes == 0 {
		cfg.WriteQuotaBytes = DefaultWriteQuotaBytes
	}
	if cfg.MinFreeDiskBytes == 0 {
		cfg.MinFreeDiskBytes = DefaultMinFreeDiskBytes
	}
	if cfg.IdleToolTimeout == 0 {
		cfg.IdleToolTimeout = DefaultIdleToolTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Registry{cfg: cfg, log: log, childSlot: make(chan struct{}, 1), loadLock: make(chan struct{}, 1)}
	// Memory is capped per instance by memoryCap, not by
	// WithMemoryLimitPages, so that exhaustion can be told from a crash.
	// Deadlines stop guest code through the interrupt global every module
	// gets before it is compiled (see instrument), not through wazero's
	// WithCloseOnContextDone, which costs guest code twice as much.
	rc := wazero.NewRuntimeConfig()
	switch {
	case cfg.CacheDir != "" && cfg.testCache != nil:
		r.cache = cfg.testCache
		rc = rc.WithCompilationCache(r.cache)
	case cfg.CacheDir != "":
		cache, err := wazero.NewCompilationCacheWithDir(cfg.CacheDir)
		if err != nil {
			log.Warn("wasmtools: compilation cache unusable; compiling in memory only", logkey.Dir, cfg.CacheDir, logkey.Err, err)
		} else {
			r.cache, r.ownCache = cache, true
			rc = rc.WithCompilationCache(cache)
		}
	}
	if r.cache != nil && cfg.IdleToolTimeout > 0 {
		r.toolTimeout = cfg.IdleToolTimeout
	}
	r.rt = wazero.NewRuntimeWithConfig(ctx, rc)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, r.rt); err != nil {
		_ = r.closeRuntime(ctx)
		return nil, fmt.Errorf("wasmtools: instantiate WASI: %w", err)
	}
	if err := r.instantiateHost(ctx); err != nil {
		_ = r.closeRuntime(ctx)
		return nil, fmt.Errorf("wasmtools: instantiate the keel host module: %w", err)
	}
	r.wasi = map[string]bool{}
	for name := range r.rt.Module(wasi_snapshot_preview1.ModuleName).ExportedFunctionDefinitions() {
		r.wasi[name] = true
	}
	return r, nil
}

// lookup returns the named tool. While the tools found at Open are still
// loading, it waits for that one tool only, moving it ahead of the
// others.
func (r *Registry) lookup(ctx context.Context, name string) (*tool, error) {
	if t, ok := r.set.Load().tools[name]; ok && !t.pending {
		return t, nil
	}
	q := r.first.Load()
	if q == nil {
		// The first load may have ended since the set was read; it
		// stores the whole set before it clears first.
		return r.set.Load().tools[name], nil
	}
	return r.await(ctx, q, name)
}

// grant records what t is given and prepares the mounts and environment.
// A grant that cannot be honoured (bad guest path, host directory missing)
// is logged and left out, so the tool's requests show it as missing.
func (r *Registry) grant(t *tool, g capabilities.Grants) {
	name := t.info.Spec.Name
	var given capabilities.Grants
	for _, fg := range g.FS {
		if !path.IsAbs(fg.GuestPath) {
			r.log.Error("wasmtools: grant dropped: guest path must be absolute", logkey.Tool, name, logkey.GuestPath, fg.GuestPath)
			continue
		}
		fg.GuestPath = path.Clean(fg.GuestPath)
		fg, err := fg.WithLabels()
		if err != nil {
			r.log.Error("wasmtools: grant dropped: bad label", logkey.Tool, name, logkey.GuestPath, fg.GuestPath, logkey.Err, err)
			continue
		}
		root, err := os.OpenRoot(fg.HostPath)
		if err != nil {
			r.log.Error("wasmtools: grant dropped: host directory unusable", logkey.Tool, name, logkey.GuestPath, fg.GuestPath, logkey.Err, err)
			continue
		}
		t.roots = append(t.roots, root)
		t.mounts = append(t.mounts, mount{root: root, guest: fg.GuestPath, readOnly: fg.ReadOnly, real: realDir(fg.HostPath), labels: fg.AllLabels()})
		given.FS = append(given.FS, fg)
	}
	mc := baseModuleConfig().WithArgs(name)
	for _, e := range g.Env {
		if v, ok := os.LookupEnv(e); ok {
			mc = mc.WithEnv(e, v)
		} else {
			r.log.Warn("wasmtools: granted environment variable is not set", logkey.Tool, name, logkey.Env, e)
		}
	}
	given.Env = slices.Clone(g.Env)
	// No host function reaches the network yet; the grant is recorded so
	// requests can be checked against it.
	given.Network = slices.Clone(g.Network)
	t.info.Grants = given
	t.module = mc
}

// mount is one granted directory, opened.
type mount struct {
	root     *os.Root
	guest    string
	readOnly bool
	// real is the host directory with its symbolic links resolved, the
	// base of the paths a call records (keel.Touched.Paths).
	real string
	// labels are the grant's labels, "private" included.
	labels []string
}

// realDir returns the absolute host directory dir with its symbolic
// links resolved, or as absolute as it can be made.
func realDir(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		return real
	}
	return dir
}

// instanceConfig returns t's module configuration with its granted
// directories mounted, for one new instance, the meters counting what
// that instance writes through its read-write grants (see disk.go), and
// the record of what it opens through them (see touched.go; nil when it
// has no mounts).
func (r *Registry) instanceConfig(t *tool) (wazero.ModuleConfig, diskUse, *fsUse) {
	if len(t.mounts) == 0 {
		return t.module, nil, nil
	}
	fsc := wazero.NewFSConfig()
	var disk diskUse
	use := newFSUse(t.mounts)
	for i, m := range t.mounts {
		rfs := rootFS{root: m.root, use: &mountUse{use: use, idx: i, real: m.real}}
		var fs experimentalsys.FS
		switch {
		case m.readOnly:
			fs = &sysfs.ReadFS{FS: rfs}
		case t.limits.writeQuota < 0 && r.cfg.MinFreeDiskBytes < 0:
			fs = rfs
		default:
			rfs.meter = &diskMeter{guest: m.guest, quota: t.limits.writeQuota, floor: r.cfg.MinFreeDiskBytes}
			disk = append(disk, rfs.meter)
			fs = rfs
		}
		fsc = fsc.(sysfs.FSConfig).WithSysFSMount(fs, m.guest)
	}
	return t.module.WithFSConfig(fsc), disk, use
}

// baseModuleConfig is what every instance gets: clocks and randomness,
// and nothing else until grants add to it.
func baseModuleConfig() wazero.ModuleConfig {
	return wazero.NewModuleConfig().
		WithName(""). // anonymous, so one module can have many instances
		WithSysWalltime().
		WithSysNanotime().
		WithRandSource(rand.Reader)
}

// close releases what load acquired and stops the idle timer;
// Registry.Close leaves the compiled module to the runtime, which closes
// them all.
func (t *tool) close(ctx context.Context, compiled bool) {
	t.mu.Lock()
	t.closed = true
	t.timer.stop()
	if compiled && t.compiled != nil {
		_ = t.compiled.Close(ctx)
	}
	t.mu.Unlock()
	if t.pool != nil {
		t.pool.close(ctx)
	}
	for _, root := range t.roots {
		_ = root.Close()
	}
}

// Tools returns the tools sorted by name. While the tools found at Open
// load in the background, those not loaded yet are listed only if the
// index knows them, marked Compiling (see Listed). The result is a copy.
func (r *Registry) Tools() []Tool {
	set := r.set.Load()
	out := make([]Tool, 0, len(set.names))
	for _, n := range set.names {
		out = append(out, set.tools[n].info.clone())
	}
	return out
}

// Tool returns the tool name (a copy, as Tools lists it), and whether
// there is one.
func (r *Registry) Tool(name string) (Tool, bool) {
	t, ok := r.set.Load().tools[name]
	if !ok {
		return Tool{}, false
	}
	return t.info.clone(), true
}

// SideEffects returns the side-effect class of the tool name (as Tools
// lists it), and whether there is one. Unlike Tool, it copies nothing.
func (r *Registry) SideEffects(name string) (keel.SideEffect, bool) {
	t, ok := r.set.Load().tools[name]
	if !ok {
		return "", false
	}
	return t.info.Spec.SideEffects, true
}

// Specs returns the specs of the tools Tools lists, sorted by name.
func (r *Registry) Specs() []keel.ToolSpec {
	set := r.set.Load()
	out := make([]keel.ToolSpec, 0, len(set.names))
	for _, n := range set.names {
		out = append(out, set.tools[n].info.clone().Spec)
	}
	return out
}

func (t Tool) clone() Tool {
	t.Spec.InputSchema = slices.Clone(t.Spec.InputSchema)
	t.Spec.OutputSchema = slices.Clone(t.Spec.OutputSchema)
	t.Requests = cloneGrants(t.Requests)
	t.Grants = cloneGrants(t.Grants)
	t.Labels = slices.Clone(t.Labels)
	return t
}

func cloneGrants(g capabilities.Grants) capabilities.Grants { return g.Clone() }

// ErrCloseTimeout is what Close returns when ctx ended before the calls
// and loads it stopped had returned.
var ErrCloseTimeout = errors.New("wasmtools: close: calls or loads still running")

// Close stops the calls in flight (they fail with a timeout error) and
// the loading of tools, waits for them, and releases the compiled
// modules, the cache and the granted directories. Calls after Close fail.
// Close is idempotent.
//
// Every guest is interrupted at once, so the wait is short; only a host
// step in progress (a compilation, a grow of memory) delays it. If ctx
// ends first, Close returns ErrCloseTimeout (wrapping ctx's error) at
// once and the release happens when the last of them returns: compiled
// code that may still be running is never unmapped.
func (r *Registry) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.stopReclaim()
	released := make(chan error, 1)
	go func() {
		r.calls.Wait()
		r.loadLock <- struct{}{} // the background load and any Reload have ended
		defer r.unlockLoad()
		released <- r.release(context.WithoutCancel(ctx))
	}()
	select {
	case err := <-released:
		return err
	case <-ctx.Done():
		r.log.Error("wasmtools: close: gave up waiting for calls and loads; the runtime is released when they end", logkey.Err, ctx.Err())
		return fmt.Errorf("%w: %w", ErrCloseTimeout, ctx.Err())
	}
}

// release closes the tools and the runtime; Close calls it once nothing
// runs.
func (r *Registry) release(ctx context.Context) error {
	if set := r.set.Load(); set != nil {
		for _, t := range set.tools {
			t.close(ctx, false)
		}
	}
	for _, t := range r.retired {
		t.close(ctx, false)
	}
	return r.closeRuntime(ctx)
}

func (r *Registry) closeRuntime(ctx context.Context) error {
	err := r.rt.Close(ctx)
	if r.ownCache {
		err = errors.Join(err, r.cache.Close(ctx))
	}
	if err != nil {
		return fmt.Errorf("wasmtools: close: %w", err)
	}
	return nil
}
