package wasmtools

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/internal/atomicfile"
	"github.com/keel-runtime/keel/schema"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// Defaults for the zero fields of Config.
const (
	DefaultCallTimeout    = 10 * time.Second
	DefaultMemoryLimitMiB = 256
	DefaultMaxOutputBytes = 1 << 20
)

// maxMemoryLimitMiB is the most a 32-bit WebAssembly memory can address.
const maxMemoryLimitMiB = 4 << 10

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
	// Grants holds what each tool may touch, by tool name. A tool that is
	// not in the map gets nothing: no directories, no environment.
	Grants map[string]capabilities.Grants
	// GrantsFor, when set, is asked for a tool's grants at every load and
	// Reload instead of Grants, so grants can change while the daemon
	// runs: a tool whose grants changed is reloaded by the next Reload.
	// It must be safe for concurrent use.
	GrantsFor func(name string) capabilities.Grants
	// AllowPrivateNetwork lets tools reach loopback, private and
	// link-local addresses when granted. Default false: the daemon, Ollama
	// and the rest of the local network are out of reach whatever a tool
	// is granted.
	AllowPrivateNetwork bool
	// Background makes Open return at once and compile the tools in the
	// background (compiling a Go module takes seconds); Ready reports when
	// they are loaded, Progress how far it got, and Call waits for them.
	// Default false: Open returns with every tool loaded.
	Background bool
	// OnChange, when set, is called after every Reload that changed the
	// tools or their grants (including those Watch makes). It must not
	// block or call back into the Registry.
	OnChange func()
	// CallTimeout bounds a whole call, from instantiation to the last
	// byte of output, and printing the manifest at Open. Default 10s.
	CallTimeout time.Duration
	// MemoryLimitMiB caps each instance's linear memory. Default 256, at
	// most 4096.
	MemoryLimitMiB int
	// MaxOutputBytes caps what a tool may write to stdout in one call.
	// Default 1 MiB.
	MaxOutputBytes int
	// MaxIdleInstances bounds the idle, initialized instances kept per
	// reactor tool for warm calls. Default 2 × GOMAXPROCS.
	MaxIdleInstances int
	// Logger receives load problems and call outcomes. Default discards.
	Logger *slog.Logger
}

// Tool is one loaded tool.
type Tool struct {
	Spec     keel.ToolSpec
	Requests capabilities.Grants // what the manifest asked for
	Grants   capabilities.Grants // what it was given
	SHA256   string              // hex digest of the .wasm file
	Path     string              // the .wasm file
}

// Registry holds the tools of one directory, compiled and ready to call.
// Its methods are safe for concurrent use.
type Registry struct {
	cfg   Config
	log   *slog.Logger
	rt    wazero.Runtime
	cache wazero.CompilationCache // nil without a CacheDir
	wasi  map[string]bool         // function names WASI offers
	// set is the current tool set; Reload swaps it atomically so calls
	// never see a half-updated registry.
	set atomic.Pointer[toolSet]
	// ready is closed when the first load is done; total and loaded
	// count the tool files of that load, for progress.
	ready         chan struct{}
	total, loaded atomic.Int32
	// loadMu serializes Reload; retired holds replaced tools, released at
	// Close because calls begun before a swap may still use them.
	loadMu  sync.Mutex
	retired []*tool

	// ctx is the registry's lifetime: Close cancels it, which stops the
	// calls in flight.
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	closed bool
	calls  sync.WaitGroup
}

// toolSet is an immutable snapshot of the loaded tools.
type toolSet struct {
	tools map[string]*tool
	names []string // sorted
}

// tool is a loaded tool. It is not changed after Open.
type tool struct {
	info     Tool
	compiled wazero.CompiledModule
	input    *schema.Schema
	output   *schema.Schema // nil: no output schema
	// module holds argv, clocks, randomness, the granted mounts and
	// environment; each call adds its own stdio.
	module wazero.ModuleConfig
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
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	entries, err := os.ReadDir(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("wasmtools: read tool directory: %w", err)
	}

	r := &Registry{cfg: cfg, log: log}
	// Memory is capped per instance by memoryCap, not by
	// WithMemoryLimitPages, so that exhaustion can be told from a crash.
	// Deadlines stop guest code through the interrupt global every module
	// gets before it is compiled (see instrument), not through wazero's
	// WithCloseOnContextDone, which costs guest code twice as much.
	rc := wazero.NewRuntimeConfig()
	if cfg.CacheDir != "" {
		cache, err := wazero.NewCompilationCacheWithDir(cfg.CacheDir)
		if err != nil {
			log.Warn("wasmtools: compilation cache unusable; compiling in memory only", "dir", cfg.CacheDir, "error", err)
		} else {
			r.cache = cache
			rc = rc.WithCompilationCache(cache)
		}
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
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.ready = make(chan struct{})
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".wasm") && !e.IsDir() {
			r.total.Add(1)
		}
	}

	if cfg.Background {
		// Serve an empty set at once; the loader holds loadMu so a Reload
		// waits for it, and Close waits for it through loadMu too.
		r.set.Store(&toolSet{tools: map[string]*tool{}})
		r.loadMu.Lock()
		go func() {
			defer r.loadMu.Unlock()
			defer close(r.ready)
			start := time.Now()
			set, err := r.loadDir(r.ctx, entries, nil)
			if err != nil {
				log.Error("wasmtools: loading tools stopped", "error", err)
				return
			}
			r.set.Store(set)
			log.Info("wasmtools: all tools loaded", "tools", len(set.names), "duration", time.Since(start))
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
			log.Warn("wasmtools: grant for a tool that is not loaded", "tool", name)
		}
	}
	return r, nil
}

// loadDir builds a tool set from the directory entries. A tool whose file
// and sidecar are unchanged since prev is reused, not recompiled.
func (r *Registry) loadDir(ctx context.Context, entries []os.DirEntry, prev *toolSet) (*toolSet, error) {
	set := &toolSet{tools: map[string]*tool{}}
	var todo []string
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".wasm")
		if !ok || e.IsDir() {
			continue
		}
		if prev != nil {
			file := filepath.Join(r.cfg.Dir, e.Name())
			if old, ok := prev.tools[name]; ok && unchanged(old, file) && sameGrants(old.granted, r.grantsFor(name)) {
				set.tools[name] = old
				continue
			}
		}
		todo = append(todo, name)
	}
	// Load the new and changed tools in parallel, one per core: loading
	// from the compilation cache is single-threaded per module.
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		sem     = make(chan struct{}, runtime.GOMAXPROCS(0))
		fresh   []*tool
		stopped error
	)
	for _, name := range todo {
		if err := ctx.Err(); err != nil {
			stopped = err
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			file := filepath.Join(r.cfg.Dir, name+".wasm")
			t, err := r.load(ctx, name, file)
			r.loaded.Add(1)
			if err != nil {
				r.log.Error("wasmtools: tool skipped", "file", file, "error", err)
				return
			}
			r.log.Info("wasmtools: tool loaded", "tool", name, "version", t.info.Spec.Version, "sha256", t.info.SHA256)
			mu.Lock()
			set.tools[name] = t
			fresh = append(fresh, t)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if stopped != nil {
		for _, t := range fresh {
			t.close(context.WithoutCancel(ctx), true)
		}
		return nil, fmt.Errorf("wasmtools: open: %w", stopped)
	}
	for name := range set.tools {
		set.names = append(set.names, name)
	}
	slices.Sort(set.names)
	return set, nil
}

// unchanged reports whether file still has the content t was loaded from
// and no sidecar manifest appeared, changed or vanished.
func unchanged(t *tool, file string) bool {
	sum, err := fileSHA256(file)
	if err != nil || sum != t.info.SHA256 {
		return false
	}
	side, _ := readSidecar(strings.TrimSuffix(file, ".wasm") + ".manifest.json")
	return bytes.Equal(side, t.sidecar)
}

func fileSHA256(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// load compiles and checks one tool file.
func (r *Registry) load(ctx context.Context, name, file string) (_ *tool, err error) {
	if !namePattern.MatchString(name) {
		return nil, fmt.Errorf("file name %q is not a tool name: it must match %s", name, namePattern)
	}
	bin, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(bin)
	if bin, err = r.instrumented(bin, sum); err != nil {
		return nil, fmt.Errorf("not a usable WebAssembly module: %w", err)
	}
	// Compiling a Go module takes seconds; use every core for it.
	compiled, err := r.rt.CompileModule(experimental.WithCompilationWorkers(ctx, runtime.GOMAXPROCS(0)), bin)
	if err != nil {
		return nil, fmt.Errorf("not a usable WebAssembly module: %w", err)
	}
	t := &tool{compiled: compiled}
	defer func() {
		if err != nil {
			t.close(ctx, true)
		}
	}()
	reactor, err := r.checkModule(compiled)
	if err != nil {
		return nil, err
	}
	if reactor {
		t.pool = newPool(r.cfg.MaxIdleInstances)
	}

	data, err := readSidecar(filepath.Join(filepath.Dir(file), name+".manifest.json"))
	switch {
	case errors.Is(err, fs.ErrNotExist) && reactor:
		if data, err = r.reactorManifest(ctx, name, compiled); err != nil {
			return nil, err
		}
	case errors.Is(err, fs.ErrNotExist):
		if data, err = r.printManifest(ctx, name, compiled); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, fmt.Errorf("read sidecar manifest: %w", err)
	default:
		t.sidecar = data
	}
	m, err := parseManifest(data)
	if err != nil {
		return nil, err
	}
	if m.Name != name {
		return nil, fmt.Errorf("manifest name %q does not match the file name %q", m.Name, name)
	}
	t.input, t.output = m.input, m.output
	t.fresh = m.Isolation == isolationFresh

	abs, err := filepath.Abs(file)
	if err != nil {
		abs = file
	}
	t.info = Tool{
		Spec: keel.ToolSpec{
			Name:         m.Name,
			Version:      m.Version,
			Description:  m.Description,
			InputSchema:  m.InputSchema,
			OutputSchema: m.OutputSchema,
			SideEffects:  m.SideEffects,
		},
		Requests: m.Requests,
		SHA256:   hex.EncodeToString(sum[:]),
		Path:     abs,
	}
	t.granted = r.grantsFor(name)
	r.grant(t, t.granted)
	if t.missing = missingGrant(t.info.Requests, t.info.Grants); t.missing != "" {
		r.log.Info("wasmtools: tool not granted all it requests; calls are denied until the user grants it", "tool", name, "missing", t.missing)
	}
	return t, nil
}

// instrumentVersion names the current form of instrument's rewrite in
// the cache; change it whenever the rewrite changes.
const instrumentVersion = "1"

// instrumented returns bin rewritten by instrument. With a CacheDir the
// rewrite (tens of milliseconds for a Go module) is kept there, under the
// original's sha256, so a restart reads it back instead; the cache is
// as trusted as wazero's compiled code beside it.
func (r *Registry) instrumented(bin []byte, sum [32]byte) ([]byte, error) {
	if r.cache == nil {
		return instrument(bin)
	}
	file := filepath.Join(r.cfg.CacheDir, "instrumented", fmt.Sprintf("%x-v%s.wasm", sum, instrumentVersion))
	if out, err := os.ReadFile(file); err == nil {
		return out, nil
	}
	out, err := instrument(bin)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		r.log.Warn("wasmtools: cannot cache an instrumented module", "error", err)
	} else if err := atomicfile.Write(file, bytes.NewReader(out), 0o600); err != nil {
		r.log.Warn("wasmtools: cannot cache an instrumented module", "error", err)
	}
	return out, nil
}

// readSidecar reads a sidecar manifest of at most maxManifestBytes.
func readSidecar(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxManifestBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxManifestBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", filepath.Base(name), maxManifestBytes)
	}
	return data, nil
}

// checkModule refuses modules keel cannot run: only WASI is offered, and
// a tool exports its memory and either _start (a command) or
// _initialize, keel_alloc and keel_call (a reactor). It reports which.
func (r *Registry) checkModule(m wazero.CompiledModule) (reactor bool, err error) {
	for _, f := range m.ImportedFunctions() {
		mod, fn, _ := f.Import()
		if mod == hostModuleName && hostFuncs[fn] {
			continue
		}
		if mod != wasi_snapshot_preview1.ModuleName {
			return false, fmt.Errorf("imports %s.%s: only WASI (%s) and %s.http_request/http_response are offered to tools", mod, fn, wasi_snapshot_preview1.ModuleName, hostModuleName)
		}
		if !r.wasi[fn] {
			return false, fmt.Errorf("imports %s.%s, which this host's WASI does not provide", mod, fn)
		}
	}
	if len(m.ImportedMemories()) > 0 {
		return false, errors.New("imports a memory; a tool must define its own")
	}
	mem, ok := m.ExportedMemories()["memory"]
	if !ok {
		return false, errors.New(`does not export its memory as "memory"`)
	}
	if need := uint64(mem.Min()) * 65536; need > r.memoryLimit() {
		return false, fmt.Errorf("needs %d MiB of memory to start; the limit is %d MiB", need>>20, r.cfg.MemoryLimitMiB)
	}
	if reactor, err := isReactor(m); reactor || err != nil {
		return reactor, err
	}
	if _, ok := m.ExportedFunctions()["_start"]; !ok {
		return false, errors.New("does not export _start (a WASI command) nor _initialize, keel_alloc and keel_call (a keel reactor)")
	}
	return false, nil
}

func (r *Registry) memoryLimit() uint64 { return uint64(r.cfg.MemoryLimitMiB) << 20 }

// printManifest runs the module with --manifest, with nothing granted.
func (r *Registry) printManifest(ctx context.Context, name string, compiled wazero.CompiledModule) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	mc := baseModuleConfig().WithArgs(name, "--manifest")
	o := r.run(ctx, compiled, mc, nil)
	if f := r.failure(ctx, o, fmt.Sprintf("did not finish within %s", r.cfg.CallTimeout)); f != nil {
		return nil, fmt.Errorf("print manifest (no sidecar %s.manifest.json either): %s", name, f.Message)
	}
	return o.stdout, nil
}

// grant records what t is given and prepares the mounts and environment.
// A grant that cannot be honoured (bad guest path, host directory missing)
// is logged and left out, so the tool's requests show it as missing.
func (r *Registry) grant(t *tool, g capabilities.Grants) {
	name := t.info.Spec.Name
	fsc := wazero.NewFSConfig()
	var given capabilities.Grants
	for _, fg := range g.FS {
		if !path.IsAbs(fg.GuestPath) {
			r.log.Error("wasmtools: grant dropped: guest path must be absolute", "tool", name, "guest_path", fg.GuestPath)
			continue
		}
		fg.GuestPath = path.Clean(fg.GuestPath)
		root, err := os.OpenRoot(fg.HostPath)
		if err != nil {
			r.log.Error("wasmtools: grant dropped: host directory unusable", "tool", name, "guest_path", fg.GuestPath, "error", err)
			continue
		}
		t.roots = append(t.roots, root)
		var mount experimentalsys.FS = rootFS{root: root}
		if fg.ReadOnly {
			mount = &sysfs.ReadFS{FS: mount}
		}
		fsc = fsc.(sysfs.FSConfig).WithSysFSMount(mount, fg.GuestPath)
		given.FS = append(given.FS, fg)
	}
	mc := baseModuleConfig().WithArgs(name).WithFSConfig(fsc)
	for _, e := range g.Env {
		if v, ok := os.LookupEnv(e); ok {
			mc = mc.WithEnv(e, v)
		} else {
			r.log.Warn("wasmtools: granted environment variable is not set", "tool", name, "env", e)
		}
	}
	given.Env = slices.Clone(g.Env)
	// No host function reaches the network yet; the grant is recorded so
	// requests can be checked against it.
	given.Network = slices.Clone(g.Network)
	t.info.Grants = given
	t.module = mc
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

// close releases what load acquired; Registry.Close leaves the compiled
// module to the runtime, which closes them all.
func (t *tool) close(ctx context.Context, compiled bool) {
	if t.pool != nil {
		t.pool.close(ctx)
	}
	if compiled {
		_ = t.compiled.Close(ctx)
	}
	for _, root := range t.roots {
		_ = root.Close()
	}
}

// Tools returns the loaded tools sorted by name. The result is a copy.
func (r *Registry) Tools() []Tool {
	set := r.set.Load()
	out := make([]Tool, 0, len(set.names))
	for _, n := range set.names {
		out = append(out, set.tools[n].info.clone())
	}
	return out
}

// Tool returns the loaded tool name (a copy), and whether there is one.
func (r *Registry) Tool(name string) (Tool, bool) {
	t, ok := r.set.Load().tools[name]
	if !ok {
		return Tool{}, false
	}
	return t.info.clone(), true
}

// SideEffects returns the side-effect class of the loaded tool name,
// and whether there is one. Unlike Tool, it copies nothing.
func (r *Registry) SideEffects(name string) (keel.SideEffect, bool) {
	t, ok := r.set.Load().tools[name]
	if !ok {
		return "", false
	}
	return t.info.Spec.SideEffects, true
}

// Specs returns the specs of the loaded tools sorted by name.
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
	return t
}

func cloneGrants(g capabilities.Grants) capabilities.Grants {
	return capabilities.Grants{FS: slices.Clone(g.FS), Network: slices.Clone(g.Network), Env: slices.Clone(g.Env)}
}

// Close stops the calls in flight (they fail with a timeout error), waits
// for them, and releases the compiled modules, the cache and the granted
// directories. Calls after Close fail. Close is idempotent.
func (r *Registry) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.calls.Wait()
	r.loadMu.Lock()
	defer r.loadMu.Unlock()
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
	if r.cache != nil {
		err = errors.Join(err, r.cache.Close(ctx))
	}
	if err != nil {
		return fmt.Errorf("wasmtools: close: %w", err)
	}
	return nil
}
