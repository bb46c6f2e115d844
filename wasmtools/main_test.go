package wasmtools

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/testcache"
	"github.com/keel-runtime/keel/internal/wasmtest"
	"github.com/keel-runtime/keel/wasmtools/builtin"
	"github.com/tetratelabs/wazero"
	"go.uber.org/goleak"
)

// cacheMaxBytes bounds cacheDir: one checkout's fixtures compile to
// about 300 MiB, so this keeps a few versions of them (other worktrees',
// or before a change to a fixture) beside the current one.
const cacheMaxBytes = 1024 * testcache.MiB

// Fixture directories, filled once by TestMain.
var (
	// toolsDir holds the embedded example tools, readfile and wordcount;
	// readfileDir holds readfile alone, for the tests of grants.
	toolsDir, readfileDir string
	// bundledDir holds each bundled tool alone in a directory, by name:
	// a test that calls one tool loads only that one.
	bundledDir = map[string]string{}
	// hostileDir holds hostile.wasm (built from testdata/hostile) and two
	// hand-assembled modules with sidecar manifests: spin (an endless
	// loop) and fixed (writes a constant result through fd_write).
	hostileDir string
	// reactorDir holds hostile.wasm built as a reactor
	// (-buildmode=c-shared), and freshhostile.wasm, the same module with a
	// sidecar manifest that asks for fresh isolation.
	reactorDir string
	// brokenDir holds fixed.wasm next to files that must not load.
	brokenDir string
	// tinyDir holds fixed.wasm alone: quick to compile into a new cache.
	tinyDir string
	// cacheDir is the compilation cache shared by the tests. Go modules
	// take seconds to compile (more under -race), so it lives in the
	// user's cache directory and survives between runs, like Go's build
	// cache, pruned to the files written in the last week and to
	// cacheMaxBytes.
	cacheDir string
	// sharedCache is the one wazero compilation cache, on cacheDir, of
	// every registry the tests open on cacheDir (Config.testCache): a
	// module is compiled, or read from cacheDir (tens of MiB of machine
	// code for a Go tool), once per package run, not once per registry.
	// keepers, open from TestMain to its end, hold each fixture's
	// modules in it.
	sharedCache wazero.CompilationCache
	keepers     []*Registry

	// plainOnce opens plain, a registry on toolsDir without grants that
	// tests share; TestMain closes it.
	plainOnce sync.Once
	plain     *Registry
	plainErr  error
)

// plainRegistry returns the shared registry on toolsDir, no grants.
func plainRegistry(t *testing.T) *Registry {
	t.Helper()
	plainOnce.Do(func() {
		plain, plainErr = Open(context.Background(), shared(Config{Dir: toolsDir}))
	})
	if plainErr != nil {
		t.Fatalf("Open: %v", plainErr)
	}
	return plain
}

func TestMain(m *testing.M) {
	if IsCompileChild() {
		os.Exit(testCompileChild()) // this binary re-executed by a Compiler
	}
	code, err := testMain(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "wasmtools TestMain:", err)
		code = 1
	}
	os.Exit(code)
}

func testMain(m *testing.M) (int, error) {
	tmp, err := os.MkdirTemp("", "keel-wasmtools-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)

	cacheDir = filepath.Join(tmp, "cache")
	if dir, err := os.UserCacheDir(); err == nil {
		cacheDir = filepath.Join(dir, "keel", "wasmtools-test")
		testcache.PruneFiles(cacheDir, 7*24*time.Hour, cacheMaxBytes)
	}

	toolsDir = filepath.Join(tmp, "tools")
	if err := installBundled(toolsDir); err != nil {
		return 0, err
	}

	for _, name := range []string{"fetch", "readfile", "wordcount", "writefile"} {
		dir := filepath.Join(tmp, "bundled", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return 0, err
		}
		bin, err := os.ReadFile(filepath.Join(toolsDir, name+".wasm"))
		if err != nil {
			return 0, err
		}
		if err := writeFiles(dir, map[string][]byte{name + ".wasm": bin}); err != nil {
			return 0, err
		}
		bundledDir[name] = dir
	}
	readfileDir = bundledDir["readfile"]

	hostileDir = filepath.Join(tmp, "hostile")
	if err := os.Mkdir(hostileDir, 0o755); err != nil {
		return 0, err
	}
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(hostileDir, "hostile.wasm"), "./testdata/hostile")
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("build testdata/hostile: %v\n%s", err, out)
	}
	// reactorDir holds the same fixture built as a reactor, and again as
	// freshhostile with a sidecar manifest asking for fresh isolation.
	reactorDir = filepath.Join(tmp, "reactor")
	if err := os.Mkdir(reactorDir, 0o755); err != nil {
		return 0, err
	}
	build = exec.Command("go", "build", "-trimpath", "-buildmode=c-shared", "-o", filepath.Join(reactorDir, "hostile.wasm"), "./testdata/hostile")
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("build testdata/hostile as a reactor: %v\n%s", err, out)
	}
	reactorWasm, err := os.ReadFile(filepath.Join(reactorDir, "hostile.wasm"))
	if err != nil {
		return 0, err
	}
	if err := writeFiles(reactorDir, map[string][]byte{
		"freshhostile.wasm": reactorWasm,
		"freshhostile.manifest.json": []byte(`{"name":"freshhostile","description":"hostile, fresh every call.",` +
			`"input_schema":{"type":"object"},"side_effects":"read_only","isolation":"fresh"}`),
	}); err != nil {
		return 0, err
	}

	fixed := map[string][]byte{
		"fixed.wasm": fixedModule(`{"output":{"greeting":"hi"}}`),
		"fixed.manifest.json": []byte(`{"name":"fixed","version":"1.0.0","description":"Always greets.",` +
			`"input_schema":{"type":"object"},` +
			`"output_schema":{"type":"object","properties":{"greeting":{"type":"string"}},"required":["greeting"]},` +
			`"side_effects":"read_only"}`),
	}
	files := map[string][]byte{
		"spin.wasm":          spinModule(),
		"spin.manifest.json": []byte(`{"name":"spin","description":"Loops forever.","input_schema":{"type":"object"},"side_effects":"read_only"}`),
	}
	if err := writeFiles(hostileDir, files); err != nil {
		return 0, err
	}
	if err := writeFiles(hostileDir, fixed); err != nil {
		return 0, err
	}

	tinyDir = filepath.Join(tmp, "tiny")
	if err := os.Mkdir(tinyDir, 0o755); err != nil {
		return 0, err
	}
	if err := writeFiles(tinyDir, fixed); err != nil {
		return 0, err
	}

	brokenDir = filepath.Join(tmp, "broken")
	if err := os.Mkdir(brokenDir, 0o755); err != nil {
		return 0, err
	}
	if err := writeFiles(brokenDir, fixed); err != nil {
		return 0, err
	}
	files = map[string][]byte{
		"notwasm.wasm":              []byte("this is not WebAssembly\n"),
		"sneaky.wasm":               sneakyModule(),
		"Bad-Name.wasm":             fixedModule(`{"output":{}}`),
		"badmanifest.wasm":          fixedModule(`{"output":{}}`),
		"badmanifest.manifest.json": []byte(`{"name":"badmanifest","description":"x","input_schema":{"type":"object"},"side_effects":"sometimes"}`),
		"misnamed.wasm":             fixedModule(`{"output":{}}`),
		"misnamed.manifest.json":    []byte(`{"name":"othername","description":"x","input_schema":{"type":"object"},"side_effects":"read_only"}`),
		"bigmemory.wasm":            loopModule(5000, "_start"), // 312 MiB, over the default 256
		"bigmemory.manifest.json":   []byte(`{"name":"bigmemory","description":"x","input_schema":{"type":"object"},"side_effects":"read_only"}`),
		"reactor.wasm":              loopModule(1, "_initialize"),
		"reactor.manifest.json":     []byte(`{"name":"reactor","description":"x","input_schema":{"type":"object"},"side_effects":"read_only"}`),
		"nomanifest.wasm":           fixedModule(`not a manifest`),
	}
	if err := writeFiles(brokenDir, files); err != nil {
		return 0, err
	}

	sharedCache, err = wazero.NewCompilationCacheWithDir(cacheDir)
	if err != nil {
		return 0, err
	}
	defer sharedCache.Close(context.Background())
	for _, dir := range []string{toolsDir, hostileDir, reactorDir} {
		r, err := Open(context.Background(), shared(Config{Dir: dir, IdleToolTimeout: -1}))
		if err != nil {
			return 0, err
		}
		keepers = append(keepers, r)
	}
	code := m.Run()
	for _, r := range keepers {
		if err := r.Close(context.Background()); err != nil {
			return 0, err
		}
	}
	if plain != nil {
		if err := plain.Close(context.Background()); err != nil {
			return 0, err
		}
	}
	if code == 0 {
		// Every registry is closed now: nothing may be left running.
		if err := goleak.Find(); err != nil {
			return 0, fmt.Errorf("goroutines left behind: %w", err)
		}
	}
	return code, nil
}

// installBundled writes the bundled tools into dir as builtin.Install
// does, copied from their unpacked form kept in the user cache directory:
// unpacking them takes seconds of CPU under -race.
func installBundled(dir string) error {
	return testcache.Installed("bundled-test", "builtin", []string{filepath.Join("builtin", "embedded")}, dir, builtin.Install)
}

// cloneCache returns a new cache directory holding keel's part of
// cacheDir (instrumented modules, manifests, the index) but the
// subdirectories skip, hard-linked where it can be (the registry
// replaces cache files by renaming, never writes into one), else
// copied. wazero's compiled code is left out: a registry on the clone
// takes it from sharedCache (Config.testCache).
func cloneCache(t *testing.T, skip ...string) string {
	t.Helper()
	clone := t.TempDir()
	err := filepath.WalkDir(cacheDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(cacheDir, path)
		if err != nil {
			return err
		}
		dst := filepath.Join(clone, rel)
		switch {
		case d.IsDir() && (slices.Contains(skip, rel) || strings.HasPrefix(rel, "wazero-")):
			return fs.SkipDir
		case d.IsDir():
			return os.MkdirAll(dst, 0o700)
		case !d.Type().IsRegular() || strings.HasSuffix(path, ".tmp"): // another registry's file being written
			return nil
		}
		if os.Link(path, dst) == nil {
			return nil
		}
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) { // replaced meanwhile
			return nil
		}
		if err != nil {
			return err
		}
		return os.WriteFile(dst, data, 0o600)
	})
	if err != nil {
		t.Fatalf("clone the compilation cache: %v", err)
	}
	return clone
}

func writeFiles(dir string, files map[string][]byte) error {
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// shared returns cfg on the shared cache: cacheDir and sharedCache,
// unless cfg has a CacheDir of its own. A call that must succeed gets a
// minute, not the default 10 s: a loaded machine runs the package's
// parallel tests slowly. Tests of time limits set their own.
func shared(cfg Config) Config {
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = time.Minute
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = cacheDir
	}
	if cfg.CacheDir == cacheDir {
		cfg.testCache = sharedCache
	}
	return cfg
}

// openRegistry opens a registry on cfg (filling in the shared cache) and
// closes it when the test ends.
func openRegistry(t *testing.T, cfg Config) *Registry {
	t.Helper()
	cfg = shared(cfg)
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t, nil)
	}
	r, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := r.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// testLogger logs to buf when it is not nil, else to the test log.
func testLogger(t *testing.T, buf *lockedBuffer) *slog.Logger {
	if buf != nil {
		return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimSpace(p)))
	return len(p), nil
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// call calls a tool and decodes its output into a generic value.
func call(t *testing.T, r *Registry, name, input string) (any, *keel.ToolError) {
	t.Helper()
	out, err := r.Call(context.Background(), keel.ToolInvocation{Name: name, Args: json.RawMessage(input)})
	if err != nil {
		var te *keel.ToolError
		if !errors.As(err, &te) {
			t.Fatalf("Call(%s, %s) error %T %v, want *keel.ToolError", name, input, err, err)
		}
		return nil, te
	}
	var v any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("Call(%s, %s) = %s, not JSON: %v", name, input, out, err)
	}
	return v, nil
}

// mustCall calls a tool that must succeed.
func mustCall(t *testing.T, r *Registry, name, input string) any {
	t.Helper()
	v, terr := call(t, r, name, input)
	if terr != nil {
		t.Fatalf("Call(%s, %s) = %v, want success", name, input, terr)
	}
	return v
}

// wantCode calls a tool that must fail with code and returns the error.
func wantCode(t *testing.T, r *Registry, name, input string, code keel.ToolErrorCode) *keel.ToolError {
	t.Helper()
	v, terr := call(t, r, name, input)
	if terr == nil {
		t.Fatalf("Call(%s, %s) = %v, want error %s", name, input, v, code)
	}
	if terr.Code != code {
		t.Fatalf("Call(%s, %s) error = %v, want code %s", name, input, terr, code)
	}
	return terr
}

// Hand-assembled WebAssembly modules. There is no .wat compiler in Go, so
// these build the binary format directly; each comment gives the module
// in text format.

func leb(n int) []byte { return binary.AppendUvarint(nil, uint64(n)) }

func vec(items ...[]byte) []byte {
	out := leb(len(items))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func str(s string) []byte { return append(leb(len(s)), s...) }

func section(id byte, content []byte) []byte {
	return append(append([]byte{id}, leb(len(content))...), content...)
}

func body(code ...byte) []byte {
	b := append([]byte{0x00}, code...) // no locals
	return append(leb(len(b)), b...)
}

func module(sections ...[]byte) []byte {
	out := []byte("\x00asm\x01\x00\x00\x00")
	for _, s := range sections {
		out = append(out, s...)
	}
	return out
}

const (
	secType, secImport, secFunc, secMemory, secExport, secCode, secData = 1, 2, 3, 5, 7, 10, 11
	opI32Const, opI64Const, opEnd                                       = 0x41, 0x42, 0x0b
	exportFunc, exportMemory                                            = 0x00, 0x02
)

var voidType = []byte{0x60, 0x00, 0x00} // () -> ()

// spinModule:
//
//	(module (memory (export "memory") 1)
//	  (func (export "_start") (loop (br 0))))
func spinModule() []byte { return loopModule(1, "_start") }

// loopModule is spinModule with another initial memory size (in 64 KiB
// pages) and another name for the looping function.
func loopModule(pages int, export string) []byte {
	return module(
		section(secType, vec(voidType)),
		section(secFunc, vec([]byte{0})),
		section(secMemory, vec(append([]byte{0x00}, leb(pages)...))),
		section(secExport, vec(
			append(str("memory"), exportMemory, 0),
			append(str(export), exportFunc, 0))),
		section(secCode, vec(body(0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b))),
	)
}

// sneakyModule imports a host function keel does not offer:
//
//	(module (import "env" "sneaky" (func))
//	  (memory (export "memory") 1)
//	  (func (export "_start") (call 0)))
func sneakyModule() []byte {
	return module(
		section(secType, vec(voidType)),
		section(secImport, vec(append(append(str("env"), str("sneaky")...), 0x00, 0))),
		section(secFunc, vec([]byte{0})),
		section(secMemory, vec([]byte{0x00, 0x01})),
		section(secExport, vec(
			append(str("memory"), exportMemory, 0),
			append(str("_start"), exportFunc, 1))),
		section(secCode, vec(body(0x10, 0x00, 0x0b))),
	)
}

// fixedModule writes msg to stdout with WASI fd_write, whatever its
// arguments, like a tool from another toolchain:
//
//	(module
//	  (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))
//	  (memory (export "memory") 1)
//	  (data (i32.const 0) "<iovec: ptr 16, len N><nwritten>" "<msg>")
//	  (func (export "_start") (drop (call 0 (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
func fixedModule(msg string) []byte {
	data := binary.LittleEndian.AppendUint32(nil, 16)
	data = binary.LittleEndian.AppendUint32(data, uint32(len(msg)))
	data = append(data, make([]byte, 8)...)
	data = append(data, msg...)
	fdWrite := []byte{0x60, 0x04, 0x7f, 0x7f, 0x7f, 0x7f, 0x01, 0x7f}
	return module(
		section(secType, vec(fdWrite, voidType)),
		section(secImport, vec(append(append(str("wasi_snapshot_preview1"), str("fd_write")...), 0x00, 0))),
		section(secFunc, vec([]byte{1})),
		section(secMemory, vec([]byte{0x00, 0x01})),
		section(secExport, vec(
			append(str("memory"), exportMemory, 0),
			append(str("_start"), exportFunc, 1))),
		section(secCode, vec(body(
			0x41, 0x01, // i32.const 1 (stdout)
			0x41, 0x00, // i32.const 0 (iovec)
			0x41, 0x01, // i32.const 1 (one iovec)
			0x41, 0x08, // i32.const 8 (nwritten)
			0x10, 0x00, // call fd_write
			0x1a, // drop
			0x0b))),
		section(secData, vec(append([]byte{0x00, 0x41, 0x00, 0x0b}, append(leb(len(data)), data...)...))),
	)
}

// cannedReactor is the least a reactor can be: keel_alloc hands out the
// buffer at 1024 and keel_call returns result, stored at 2048, whatever
// the input. A call of it costs the host's part of a warm call alone.
//
//	(module (memory (export "memory") 1)
//	  (data (i32.const 2048) "<result>")
//	  (func (export "_initialize"))
//	  (func (export "keel_alloc") (param i32) (result i32) (i32.const 1024))
//	  (func (export "keel_call") (param i32 i32) (result i64) (i64.const <2048<<32 | len>)))
func cannedReactor(result string) []byte { return wasmtest.CannedReactor(result) }

// sleb encodes v as signed LEB128.
func sleb(v int64) []byte {
	var out []byte
	for {
		b := byte(v & 0x7f)
		v >>= 7
		if v == 0 && b&0x40 == 0 || v == -1 && b&0x40 != 0 {
			return append(out, b)
		}
		out = append(out, b|0x80)
	}
}

// secStart is the start section's id.
const secStart = 8

// startLoopModule has a start function that loops forever, which a
// runtime runs while it instantiates the module. As a command it
// exports a _start that returns at once; as a reactor it exports the
// reactor functions, each returning at once (keel_manifest returns an
// empty manifest: the start function never lets it be called).
//
//	(module (memory (export "memory") 1)
//	  (func $spin (loop (br 0)))
//	  (start $spin)
//	  (func (export "_start"))                     ; a command
//	  (func (export "_initialize")) ...            ; or a reactor
//	  (func (export "keel_alloc") (param i32) (result i32) (i32.const 0))
//	  (func (export "keel_call") (param i32 i32) (result i64) (i64.const 0))
//	  (func (export "keel_manifest") (result i64) (i64.const 0)))
func startLoopModule(reactor bool) []byte {
	spin := body(0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b)
	noop := body(opEnd)
	if !reactor {
		return module(
			section(secType, vec(voidType)),
			section(secFunc, vec([]byte{0}, []byte{0})),
			section(secMemory, vec([]byte{0x00, 0x01})),
			section(secExport, vec(
				append(str("memory"), exportMemory, 0),
				append(str("_start"), exportFunc, 1))),
			section(secStart, leb(0)),
			section(secCode, vec(spin, noop)),
		)
	}
	i32ToI32 := []byte{0x60, 0x01, 0x7f, 0x01, 0x7f}
	i32i32ToI64 := []byte{0x60, 0x02, 0x7f, 0x7f, 0x01, 0x7e}
	toI64 := []byte{0x60, 0x00, 0x01, 0x7e}
	return module(
		section(secType, vec(voidType, i32ToI32, i32i32ToI64, toI64)),
		section(secFunc, vec([]byte{0}, []byte{0}, []byte{1}, []byte{2}, []byte{3})),
		section(secMemory, vec([]byte{0x00, 0x01})),
		section(secExport, vec(
			append(str("memory"), exportMemory, 0),
			append(str("_initialize"), exportFunc, 1),
			append(str("keel_alloc"), exportFunc, 2),
			append(str("keel_call"), exportFunc, 3),
			append(str("keel_manifest"), exportFunc, 4))),
		section(secStart, leb(0)),
		section(secCode, vec(spin, noop,
			body(opI32Const, 0x00, opEnd),
			body(opI64Const, 0x00, opEnd),
			body(opI64Const, 0x00, opEnd))),
	)
}

// tableModule grows its table (initially tableMin funcref entries) by
// tableDelta entries, then its memory by memDelta pages, traps if either
// grow fails, and writes {"output":{}} otherwise. wazero allocates 8
// bytes per table entry outside linear memory.
//
//	(module
//	  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
//	  (memory (export "memory") 1)
//	  (table tableMin funcref)
//	  (data (i32.const 0) "<iovec: ptr 16, len N><nwritten>" "{\"output\":{}}")
//	  (func (export "_start")
//	    (if (i32.eq (table.grow 0 (ref.null func) (i32.const tableDelta)) (i32.const -1)) (then unreachable))
//	    (if (i32.eq (memory.grow (i32.const memDelta)) (i32.const -1)) (then unreachable))
//	    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
func tableModule(tableMin, tableDelta, memDelta int) []byte {
	const msg = `{"output":{}}`
	data := binary.LittleEndian.AppendUint32(nil, 16)
	data = binary.LittleEndian.AppendUint32(data, uint32(len(msg)))
	data = append(data, make([]byte, 8)...)
	data = append(data, msg...)
	fdWrite := []byte{0x60, 0x04, 0x7f, 0x7f, 0x7f, 0x7f, 0x01, 0x7f}
	code := []byte{0xd0, 0x70, opI32Const}
	code = append(code, sleb(int64(tableDelta))...)
	code = append(code, 0xfc, 0x0f, 0x00, opI32Const, 0x7f, 0x46, 0x04, 0x40, 0x00, 0x0b)
	code = append(append(code, opI32Const), sleb(int64(memDelta))...)
	code = append(code, 0x40, 0x00, opI32Const, 0x7f, 0x46, 0x04, 0x40, 0x00, 0x0b)
	code = append(code, 0x41, 0x01, 0x41, 0x00, 0x41, 0x01, 0x41, 0x08, 0x10, 0x00, 0x1a, opEnd)
	return module(
		section(secType, vec(fdWrite, voidType)),
		section(secImport, vec(append(append(str("wasi_snapshot_preview1"), str("fd_write")...), 0x00, 0))),
		section(secFunc, vec([]byte{1})),
		section(4, vec(append([]byte{0x70, 0x00}, leb(tableMin)...))),
		section(secMemory, vec([]byte{0x00, 0x01})),
		section(secExport, vec(
			append(str("memory"), exportMemory, 0),
			append(str("_start"), exportFunc, 1))),
		section(secCode, vec(body(code...))),
		section(secData, vec(append([]byte{0x00, 0x41, 0x00, 0x0b}, append(leb(len(data)), data...)...))),
	)
}

// recursionModule recurses until the stack gives out:
//
//	(module (memory (export "memory") 1)
//	  (func (export "_start") (call 0)))
func recursionModule() []byte {
	return module(
		section(secType, vec(voidType)),
		section(secFunc, vec([]byte{0})),
		section(secMemory, vec([]byte{0x00, 0x01})),
		section(secExport, vec(
			append(str("memory"), exportMemory, 0),
			append(str("_start"), exportFunc, 0))),
		section(secCode, vec(body(0x10, 0x00, opEnd))),
	)
}
