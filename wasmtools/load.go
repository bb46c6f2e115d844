package wasmtools

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/atomicfile"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// Loading tools: reading NAME.wasm files from the tools directory,
// compiling and checking them (here or in a compile child, compiler.go),
// reading or printing their manifests, and publishing each loaded tool
// into the registry's current set. What is installed, granted and
// callable is registry.go; calls are call.go.

// lockLoad takes loadLock, unless ctx or the registry ends first: a
// Reload asked for while the first load runs gives up when its caller
// does, so it cannot hold up a shutdown until every tool has compiled.
func (r *Registry) lockLoad(ctx context.Context) error {
	select {
	case r.loadLock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-r.ctx.Done():
		return errors.New("registry closed")
	}
}

func (r *Registry) unlockLoad() { <-r.loadLock }

// loadDir builds a tool set from the directory entries. A tool whose file
// and sidecar are unchanged since prev is reused, not recompiled.
func (r *Registry) loadDir(ctx context.Context, entries []os.DirEntry, prev *toolSet) (*toolSet, error) {
	return r.loadAll(r.plan(ctx, entries, prev))
}

// plan splits the directory entries into the tools kept from prev and a
// queue of those to load.
func (r *Registry) plan(ctx context.Context, entries []os.DirEntry, prev *toolSet) (*toolSet, *loadQueue) {
	set := &toolSet{tools: map[string]*tool{}}
	q := &loadQueue{ctx: ctx, done: map[string]chan struct{}{}, loaded: map[string]*tool{}}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".wasm")
		if !ok || e.IsDir() {
			continue
		}
		if prev != nil {
			file := filepath.Join(r.cfg.Dir, e.Name())
			if old, ok := prev.tools[name]; ok && unchanged(old, file) && sameGrants(old.granted, r.grantsFor(name, old.info.GrantDigest)) {
				set.tools[name] = old
				continue
			}
		}
		q.todo = append(q.todo, name)
		q.done[name] = make(chan struct{})
	}
	return set, q
}

// loadAll loads the tools of q in parallel, loadWorkers at a time
// (loading from the compilation cache is single-threaded per module), and
// adds them to set. With q.publish set, each tool is published as soon as it has
// loaded, and q is the registry's first load until loadAll returns.
func (r *Registry) loadAll(set *toolSet, q *loadQueue) (*toolSet, error) {
	// The workers start under q.mu, as await's goroutines do: each
	// joins q.workers before Wait (see await).
	q.mu.Lock()
	for range min(loadWorkers(), len(q.todo)) {
		q.workers.Go(func() {
			for {
				name, ok := q.next()
				if !ok {
					return
				}
				r.loadQueued(q, name)
			}
		})
	}
	q.mu.Unlock()
	q.workers.Wait()
	if len(q.done) > 0 {
		// Compiling a Go module takes hundreds of MiB of heap that is
		// garbage once it is done; Go would hand it back to the system
		// only slowly, and a daemon that idles all day should not keep
		// its compile peak. (q.todo is empty by now: the workers took
		// every name from it.)
		r.reclaim()
	}
	publish := q.publish != nil
	if err := q.ctx.Err(); err != nil {
		// What was published stays in the set, for Close to release.
		cur := r.set.Load()
		for name, t := range q.loaded {
			if !publish || cur.tools[name] != t {
				t.close(context.WithoutCancel(q.ctx), true)
			}
		}
		if publish {
			r.first.Store(nil)
		}
		return nil, fmt.Errorf("wasmtools: open: %w", err)
	}
	maps.Copy(set.tools, q.loaded)
	set.names = slices.Sorted(maps.Keys(set.tools))
	if publish {
		// The whole set first, then no queue: a call that misses in the
		// set and finds no queue reads the set again (see lookup).
		r.set.Store(set)
		r.first.Store(nil)
	}
	return set, nil
}

// testHookLoad, set by tests before Open, runs before each tool loads.
var testHookLoad func(name string)

// loadWorkers is how many tools load at once: one per core but one, so
// a load never takes every core from serving, from a call whose tool is
// loading next (see await) or from a run.
func loadWorkers() int { return max(1, runtime.GOMAXPROCS(0)-1) }

// loadQueue hands the tool files of one load to its workers in order; a
// call waiting for a tool that no worker has started starts it on a
// goroutine of its own (see await).
type loadQueue struct {
	ctx     context.Context
	workers sync.WaitGroup // the workers and the goroutines await starts
	publish func(*tool)    // nil: nothing is visible before the load ends

	mu     sync.Mutex
	todo   []string                 // not yet started, in order
	done   map[string]chan struct{} // closed when that tool's load ended
	loaded map[string]*tool         // the tools that loaded
}

// next takes the next tool to load, if any is left.
func (q *loadQueue) next() (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.todo) == 0 {
		return "", false
	}
	name := q.todo[0]
	q.todo = q.todo[1:]
	return name, true
}

// loadQueued loads one tool of q and records the outcome.
func (r *Registry) loadQueued(q *loadQueue, name string) {
	if testHookLoad != nil {
		testHookLoad(name)
	}
	var t *tool
	if q.ctx.Err() == nil {
		file := filepath.Join(r.cfg.Dir, name+".wasm")
		var err error
		if t, err = r.load(q.ctx, name, file); err != nil {
			r.log.Error("wasmtools: tool skipped", logkey.File, file, logkey.Err, err)
		} else {
			r.log.Info("wasmtools: tool loaded", logkey.Tool, name, logkey.Version, t.info.Spec.Version, logkey.SHA256, t.info.SHA256)
			r.remember(t)
		}
	}
	r.loaded.Add(1)
	q.mu.Lock()
	defer q.mu.Unlock()
	if t != nil {
		q.loaded[name] = t
		if q.publish != nil && q.ctx.Err() == nil {
			q.publish(t)
			if r.cfg.OnChange != nil {
				r.cfg.OnChange() // one more tool is callable
			}
		}
	}
	close(q.done[name])
}

// await waits until q's load of name has ended, starting it at once if
// no worker has yet, and returns the tool; nil if name is not part of q
// or did not load. It fails only when ctx ends first.
func (r *Registry) await(ctx context.Context, q *loadQueue, name string) (*tool, error) {
	q.mu.Lock()
	done, ok := q.done[name]
	if !ok {
		q.mu.Unlock()
		return nil, nil
	}
	if i := slices.Index(q.todo, name); i >= 0 {
		// name is still queued, so either loadAll has not started the
		// workers or none has run out of work: either way loadAll has
		// not passed its Wait, and this goroutine joins them.
		q.todo = slices.Delete(q.todo, i, i+1)
		q.workers.Go(func() { r.loadQueued(q, name) })
	}
	q.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.loaded[name], nil
}

// publish adds t to the current set (see loadDir).
func (r *Registry) publish(t *tool) {
	old := r.set.Load()
	next := &toolSet{tools: maps.Clone(old.tools)}
	next.tools[t.info.Spec.Name] = t
	next.names = slices.Sorted(maps.Keys(next.tools))
	r.set.Store(next)
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

// unusableError marks a load error as the tool file's fault: it matches
// keel.ErrUnusableTool as well as what it wraps.
type unusableError struct{ err error }

func (e *unusableError) Error() string   { return e.err.Error() }
func (e *unusableError) Unwrap() []error { return []error{e.err, keel.ErrUnusableTool} }

// unusable marks err, if not nil, as the tool file's fault.
func unusable(err error) error {
	if err == nil {
		return nil
	}
	return &unusableError{err}
}

// moduleProblem explains why instrument or wazero refused bin's module: a
// feature keel cannot bound (an *UnsupportedError), or a broken binary.
func moduleProblem(err error) error {
	if _, ok := errors.AsType[*UnsupportedError](err); ok {
		return unusable(fmt.Errorf("keel cannot run this module: %w", err))
	}
	return unusable(fmt.Errorf("not a valid WebAssembly module: %w", err))
}

// load compiles and checks one tool file. With a Compiler the module
// is compiled and inspected in a child process, and the tool starts
// unloaded: its first call loads the compiled code from the cache (see
// compiler.go and unload.go). An error that is the file's fault (its
// bytes, its manifest, its name) matches keel.ErrUnusableTool; a module
// keel cannot bound has an *UnsupportedError in its chain.
func (r *Registry) load(ctx context.Context, name, file string) (*tool, error) {
	if !namePattern.MatchString(name) {
		return nil, unusable(fmt.Errorf("file name %q is not a tool name: it must match %s", name, namePattern))
	}
	if r.childCompiles() {
		in, err := r.inspectOutside(ctx, name, file)
		if err != nil {
			return nil, err
		}
		return r.build(ctx, name, file, in, nil)
	}
	in, compiled, err := r.inspect(ctx, name, file)
	if err != nil {
		return nil, err
	}
	return r.build(ctx, name, file, in, compiled)
}

// inspection is what compiling and inspecting a tool file found: all
// that building the tool needs besides the compiled module. The compile
// child sends it to the daemon as JSON.
type inspection struct {
	SHA256  string    `json:"sha256"` // hex, of the file as read
	Stamp   fileStamp `json:"stamp"`
	Reactor bool      `json:"reactor"`
	// Manifest is the sidecar's content when HasSidecar, else what the
	// module printed (not parsed yet).
	Manifest   []byte `json:"manifest"`
	HasSidecar bool   `json:"has_sidecar"`
	// Need is the bytes of memory and tables the module starts with,
	// which its memory limit must cover.
	Need uint64 `json:"need"`
}

// inspect reads, rewrites and compiles the tool file, checks the module
// and reads its manifest (running it when there is no sidecar), in this
// process. The caller owns the compiled module.
func (r *Registry) inspect(ctx context.Context, name, file string) (_ inspection, _ wazero.CompiledModule, err error) {
	var in inspection
	bin, stamp, err := readTool(file)
	if err != nil {
		return in, nil, err
	}
	sum := sha256.Sum256(bin)
	in.SHA256, in.Stamp = hex.EncodeToString(sum[:]), stamp
	if bin, err = r.instrumented(bin, sum); err != nil {
		return in, nil, moduleProblem(err)
	}
	tables, err := tableBytes(bin)
	if err != nil {
		return in, nil, moduleProblem(err)
	}
	compiled, err := r.rt.CompileModule(r.compileContext(ctx), bin)
	bin = nil // wazero keeps what it needs; the rewritten binary is garbage now
	if err != nil {
		if ctx.Err() != nil {
			return in, nil, err
		}
		return in, nil, moduleProblem(err)
	}
	defer func() {
		if err != nil {
			_ = compiled.Close(ctx)
		}
	}()
	if in.Reactor, in.Need, err = r.checkModule(compiled, tables); err != nil {
		return in, nil, unusable(err)
	}
	data, err := readSidecar(filepath.Join(filepath.Dir(file), name+".manifest.json"))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// What a module says its manifest is depends only on its bytes
		// and the name it runs under; asking it means starting an
		// instance, so a restart reads the answer back instead.
		ask := r.printManifest
		if in.Reactor {
			ask = r.reactorManifest
		}
		key := fmt.Sprintf("%x-%s-v%s.json", sum, name, manifestCacheVersion)
		// The module's manifest may ask for more memory than the
		// default, so it is asked with as much as the module starts
		// with; it cannot grow past that.
		lim := r.defaultLimits()
		lim.memoryMiB = max(lim.memoryMiB, int((in.Need+1<<20-1)>>20))
		if data, err = r.cached("manifests", key, func() ([]byte, error) { return ask(ctx, name, compiled, lim) }); err != nil {
			if ctx.Err() != nil {
				return in, nil, err
			}
			return in, nil, unusable(err)
		}
	case err != nil:
		return in, nil, fmt.Errorf("read sidecar manifest: %w", err)
	default:
		in.HasSidecar = true
	}
	in.Manifest = data
	return in, compiled, nil
}

// build makes the tool that in describes, holding compiled; with
// compiled nil, the tool starts unloaded (see unload.go).
func (r *Registry) build(ctx context.Context, name, file string, in inspection, compiled wazero.CompiledModule) (_ *tool, err error) {
	t := &tool{compiled: compiled, stamp: in.Stamp}
	defer func() {
		if err != nil {
			t.close(ctx, true)
		}
	}()
	if in.Reactor {
		t.pool = newPool(r.cfg.MaxIdleInstances, r.cfg.IdleInstanceTimeout, r.reclaim)
	}
	if in.HasSidecar {
		t.sidecar = in.Manifest
		if t.sidecar == nil {
			t.sidecar = []byte{}
		}
	}
	m, err := parseManifest(in.Manifest)
	if err != nil {
		return nil, unusable(err)
	}
	if m.Name != name {
		return nil, unusable(fmt.Errorf("manifest name %q does not match the file name %q", m.Name, name))
	}
	t.input, t.output = m.input, m.output
	t.fresh = m.Isolation == isolationFresh
	t.manifest = in.Manifest
	t.info = describe(m, in.SHA256, t.sidecar, file)
	t.targets = schemaTargets(t.info.Spec.InputSchema)
	t.granted = r.grantsFor(name, t.info.GrantDigest)
	var raise string
	t.limits, raise = r.resolveLimits(m.Requests.Limits, t.granted.Limits)
	if in.Need > t.limits.memoryBytes() {
		return nil, unusable(fmt.Errorf("needs %d MiB of memory and tables to start; the limit is %d MiB", in.Need>>20, t.limits.memoryMiB))
	}
	r.grant(t, t.granted)
	if t.missing = missingGrant(t.info.Requests, t.info.Grants); t.missing == "" {
		t.missing = raise
	}
	if t.missing != "" {
		r.log.Info("wasmtools: tool not granted all it requests; calls are denied until the user grants it", logkey.Tool, name, logkey.Missing, t.missing)
	}
	if compiled != nil {
		// Loaded and idle: a tool never called is unloaded too.
		t.mu.Lock()
		t.lastUse = time.Now()
		r.armUnload(t, r.toolTimeout)
		t.mu.Unlock()
	}
	return t, nil
}

// compileContext is ctx with the number of compilation workers: by
// default every core, since compiling a Go module takes seconds.
func (r *Registry) compileContext(ctx context.Context) context.Context {
	n := r.workers
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	return experimental.WithCompilationWorkers(ctx, n)
}

// readTool reads a tool file and stamps it, from the same open file.
func readTool(file string) ([]byte, fileStamp, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fileStamp{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fileStamp{}, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fileStamp{}, fmt.Errorf("%s is not a regular file", file)
	}
	// Read into a buffer of the size Stat gave (io.ReadAll grows from 512
	// bytes, copying and clearing a module of megabytes many times), one
	// byte more to see whether the file grew since.
	bin := make([]byte, 0, fi.Size()+1)
	for {
		n, err := f.Read(bin[len(bin):cap(bin)])
		bin = bin[:len(bin)+n]
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fileStamp{}, err
		}
		if len(bin) == cap(bin) {
			bin = slices.Grow(bin, len(bin))
		}
	}
	return bin, stampOf(fi), nil
}

// instrumentVersion names the current form of instrument's rewrite in
// the cache; change it whenever the rewrite changes.
const instrumentVersion = "3"

// manifestCacheVersion names the form of the manifests kept in the cache.
const manifestCacheVersion = "1"

// instrumented returns bin rewritten by instrument. The rewrite (tens of
// milliseconds for a Go module) is cached under the original's sha256.
func (r *Registry) instrumented(bin []byte, sum [32]byte) ([]byte, error) {
	key := fmt.Sprintf("%x-v%s.wasm", sum, instrumentVersion)
	return r.cached("instrumented", key, func() ([]byte, error) { return instrument(bin) })
}

// cached returns the file key of the cache's directory sub, or what make
// returns, which it then keeps there. Without a CacheDir it only calls
// make. The cache is as trusted as wazero's compiled code beside it; a
// file that cannot be kept is logged and the result still returned.
func (r *Registry) cached(sub, key string, make func() ([]byte, error)) ([]byte, error) {
	if r.cache == nil {
		return make()
	}
	file := filepath.Join(r.cfg.CacheDir, sub, key)
	if out, err := os.ReadFile(file); err == nil {
		return out, nil
	}
	out, err := make()
	if err != nil {
		return nil, err
	}
	r.keep(file, out)
	return out, nil
}

// keep writes data to the cache file file, whole or not at all. A failure
// is logged, not returned: the cache only saves time.
func (r *Registry) keep(file string, data []byte) {
	err := os.MkdirAll(filepath.Dir(file), 0o700)
	if err == nil {
		err = atomicfile.Write(file, bytes.NewReader(data), 0o600)
	}
	if err != nil {
		r.log.Warn("wasmtools: cannot write to the cache", logkey.File, file, logkey.Err, err)
	}
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
// _initialize, keel_alloc and keel_call (a reactor); its initial memory
// and tables (tables bytes), need, fit the most memory a tool may be
// granted. It reports which it is, and need, which its manifest's limit
// must fit too.
func (r *Registry) checkModule(m wazero.CompiledModule, tables uint64) (reactor bool, need uint64, err error) {
	for _, f := range m.ImportedFunctions() {
		mod, fn, _ := f.Import()
		if mod == hostModuleName && hostFuncs[fn] {
			continue
		}
		if mod != wasi_snapshot_preview1.ModuleName {
			return false, 0, fmt.Errorf("imports %s.%s: only WASI (%s) and %s.http_request/http_response are offered to tools", mod, fn, wasi_snapshot_preview1.ModuleName, hostModuleName)
		}
		if !r.wasi[fn] {
			return false, 0, fmt.Errorf("imports %s.%s, which this host's WASI does not provide", mod, fn)
		}
	}
	if len(m.ImportedMemories()) > 0 {
		return false, 0, errors.New("imports a memory; a tool must define its own")
	}
	mem, ok := m.ExportedMemories()["memory"]
	if !ok {
		return false, 0, errors.New(`does not export its memory as "memory"`)
	}
	need = uint64(mem.Min())*65536 + tables
	if need > uint64(maxMemoryLimitMiB)<<20 {
		return false, 0, fmt.Errorf("needs %d MiB of memory and tables to start; no tool may have more than %d MiB", need>>20, maxMemoryLimitMiB)
	}
	if reactor, err := isReactor(m); reactor || err != nil {
		return reactor, need, err
	}
	if _, ok := m.ExportedFunctions()["_start"]; !ok {
		return false, 0, errors.New("does not export _start (a WASI command) nor _initialize, keel_alloc and keel_call (a keel reactor)")
	}
	return false, need, nil
}

// printManifest runs the module with --manifest, with nothing granted,
// under lim.
func (r *Registry) printManifest(ctx context.Context, name string, compiled wazero.CompiledModule, lim limits) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, lim.timeout)
	defer cancel()
	mc := baseModuleConfig().WithArgs(name, "--manifest")
	o := r.run(ctx, compiled, mc, nil, lim, nil, nil)
	if f := r.failure(ctx, o, fmt.Sprintf("did not finish within %s", lim.timeout), lim); f != nil {
		return nil, fmt.Errorf("print manifest (no sidecar %s.manifest.json either): %s", name, f.Message)
	}
	return o.stdout, nil
}
