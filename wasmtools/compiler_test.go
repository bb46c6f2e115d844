package wasmtools

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
)

// testChildEnv tells the test binary, re-executed as a compile child,
// to misbehave for one tool: "crash:NAME" exits without a reply, "hang:NAME"
// never replies.
const testChildEnv = "KEEL_TEST_COMPILE_CHILD"

// testCompileChild is TestMain's entry for the test binary run as a
// compile child by a Compiler whose Path is os.Args[0].
func testCompileChild() int {
	mode, name, _ := strings.Cut(os.Getenv(testChildEnv), ":")
	return compileChild(context.Background(), os.Stdin, os.Stdout, func(req childRequest) {
		if req.Name != name {
			return
		}
		switch mode {
		case "crash":
			os.Stderr.WriteString("test child: crashing on purpose\n")
			os.Exit(3)
		case "hang":
			select {}
		}
	})
}

// testCompiler is a Compiler that runs this test binary as the child.
func testCompiler(env ...string) *Compiler {
	return &Compiler{Path: os.Args[0], Env: env, Timeout: time.Minute}
}

// cacheFiles lists the files under dir, relative to it.
func cacheFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// TestCompilerChildFillsTheCache: with a Compiler, Open compiles and
// inspects each tool in a child, never in the registry's process: the
// tools start unloaded, a call loads the module from what the child put
// in the cache without compiling anything (no new cache file), and a
// second registry on the same cache starts no child at all.
func TestCompilerChildFillsTheCache(t *testing.T) {
	t.Parallel()
	dir, cache := t.TempDir(), t.TempDir()
	if err := writeFiles(dir, map[string][]byte{
		"fixed.wasm": fixedModule(`{"output":{"greeting":"hi"}}`),
		"fixed.manifest.json": []byte(`{"name":"fixed","description":"Always greets.",` +
			`"input_schema":{"type":"object"},"side_effects":"read_only"}`),
		// No sidecar: the child asks the module for its manifest.
		"printed.wasm": fixedModule(`{"name":"printed","description":"Prints its manifest.","input_schema":{"type":"object"},"side_effects":"read_only"}`),
	}); err != nil {
		t.Fatal(err)
	}
	var children atomic.Int32
	open := func() *Registry {
		t.Helper()
		r, err := Open(context.Background(), Config{
			Dir: dir, CacheDir: cache, Compiler: testCompiler(),
			testHookChild: func(string) { children.Add(1) },
		})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return r
	}

	r := open()
	if got := children.Load(); got != 2 {
		t.Errorf("Open started %d compile children, want 2", got)
	}
	if got := len(r.Tools()); got != 2 {
		t.Fatalf("Open listed %d tools, want 2: %v", got, r.Tools())
	}
	if tl, _ := r.Tool("printed"); tl.Spec.Description != "Prints its manifest." {
		t.Errorf("printed's description = %q, want the one it printed", tl.Spec.Description)
	}
	fixed := r.set.Load().tools["fixed"]
	if loaded, _, _ := fixed.residency(); loaded {
		t.Error("fixed is loaded after a child compiled it; want it unloaded until its first call")
	}
	before := cacheFiles(t, cache)
	out, err := r.Call(context.Background(), keel.ToolInvocation{Name: "fixed"})
	if err != nil || string(out) != `{"greeting":"hi"}` {
		t.Fatalf("Call(fixed) = %s, %v; want the greeting", out, err)
	}
	if loaded, loads, _ := fixed.residency(); !loaded || loads != 1 {
		t.Errorf("after a call fixed is loaded=%v after %d loads, want loaded once", loaded, loads)
	}
	if after := cacheFiles(t, cache); !slices.Equal(before, after) {
		t.Errorf("the call compiled in the registry's process: cache files %v became %v", before, after)
	}
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	r = open()
	defer r.Close(context.Background())
	if got := children.Load(); got != 2 {
		t.Errorf("a second Open on the same cache started %d more compile children, want none", got-2)
	}
	if out, err := r.Call(context.Background(), keel.ToolInvocation{Name: "fixed"}); err != nil || string(out) != `{"greeting":"hi"}` {
		t.Fatalf("Call(fixed) after a restart = %s, %v; want the greeting", out, err)
	}
}

// TestCompilerChildFailures: a compile child that crashes, hangs or
// passes its memory limit is killed and reported as such, with the
// registry still serving its other tools. The memory case is a real Go
// module whose compile needs more than the 64 MiB it is allowed.
func TestCompilerChildFailures(t *testing.T) {
	t.Parallel()
	hostile, err := os.ReadFile(filepath.Join(hostileDir, "hostile.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	fixedSidecar := func(name string) []byte {
		return []byte(`{"name":"` + name + `","description":"Always greets.","input_schema":{"type":"object"},"side_effects":"read_only"}`)
	}
	for _, tc := range []struct {
		name     string
		compiler *Compiler
		victim   []byte
		want     error
	}{
		{"crash", testCompiler(testChildEnv + "=crash:victim"), fixedModule(`{"output":{}}`), ErrCompileCrashed},
		{"hang", &Compiler{Path: os.Args[0], Env: []string{testChildEnv + "=hang:victim"}, Timeout: 3 * time.Second}, fixedModule(`{"output":{}}`), ErrCompileTimeout},
		{"memory", &Compiler{Path: os.Args[0], MemoryLimitMiB: 64, SoftLimitMiB: -1, Timeout: time.Minute}, hostile, ErrCompileOutOfMemory},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir, other, cache := t.TempDir(), t.TempDir(), t.TempDir()
			if err := writeFiles(dir, map[string][]byte{
				"fixed.wasm":          fixedModule(`{"output":{"greeting":"hi"}}`),
				"fixed.manifest.json": fixedSidecar("fixed"),
			}); err != nil {
				t.Fatal(err)
			}
			if err := writeFiles(other, map[string][]byte{
				"victim.wasm":          tc.victim,
				"victim.manifest.json": fixedSidecar("victim"),
			}); err != nil {
				t.Fatal(err)
			}
			r, err := Open(context.Background(), Config{Dir: dir, CacheDir: cache, Compiler: tc.compiler})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer r.Close(context.Background())
			_, err = r.Inspect(context.Background(), filepath.Join(other, "victim.wasm"))
			var ce *CompileError
			if !errors.Is(err, tc.want) || !errors.As(err, &ce) || ce.Tool != "victim" || !errors.Is(err, keel.ErrUnusableTool) {
				t.Errorf("Inspect(victim) = %v, want a CompileError for victim wrapping %v, an unusable tool", err, tc.want)
			}
			if out, err := r.Call(context.Background(), keel.ToolInvocation{Name: "fixed"}); err != nil || string(out) != `{"greeting":"hi"}` {
				t.Errorf("Call(fixed) after the failed compile = %s, %v; want the greeting", out, err)
			}
		})
	}
}

// TestCompilerChildStoppedByClose: while the first load waits on a
// compile child that never replies, a Reload (the daemon's watcher asks
// for one at once) gives up when its context ends instead of waiting for
// the load, and Close kills the child and returns: a daemon stopping
// mid-compile does not wait for every tool to compile.
func TestCompilerChildStoppedByClose(t *testing.T) {
	t.Parallel()
	dir, cache := t.TempDir(), t.TempDir()
	if err := writeFiles(dir, map[string][]byte{
		"victim.wasm": fixedModule(`{"output":{}}`),
		"victim.manifest.json": []byte(`{"name":"victim","description":"x",` +
			`"input_schema":{"type":"object"},"side_effects":"read_only"}`),
	}); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 1)
	r, err := Open(context.Background(), Config{
		Dir: dir, CacheDir: cache, Background: true,
		Compiler:      &Compiler{Path: os.Args[0], Env: []string{testChildEnv + "=hang:victim"}, Timeout: 10 * time.Minute},
		testHookChild: func(string) { started <- struct{}{} },
	})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	reloaded := make(chan error, 1)
	go func() {
		_, err := r.Reload(ctx)
		reloaded <- err
	}()
	cancel()
	select {
	case err := <-reloaded:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Reload with its context cancelled during the first load = %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Reload still waits for the first load 30 s after its context ended")
	}
	closeCtx, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	if err := r.Close(closeCtx); err != nil {
		t.Errorf("Close while a compile child hangs = %v, want it killed and nil", err)
	}
}

// TestCompilerChildUnusable: what a compile child finds wrong with a
// module reaches the caller as it would from a compile in process: the
// file's fault (keel.ErrUnusableTool), with the feature keel cannot
// bound (*UnsupportedError) when that is why.
func TestCompilerChildUnusable(t *testing.T) {
	t.Parallel()
	dir, other, cache := t.TempDir(), t.TempDir(), t.TempDir()
	// (func (export "_start") (return_call 0)): a tail call.
	tail := module(
		section(secType, vec(voidType)),
		section(secFunc, vec([]byte{0})),
		section(secMemory, vec([]byte{0x00, 0x01})),
		section(secExport, vec(append(str("memory"), exportMemory, 0), append(str("_start"), exportFunc, 0))),
		section(secCode, vec(body(0x12, 0x00, 0x0b))),
	)
	if err := writeFiles(other, map[string][]byte{"tail.wasm": tail, "notwasm.wasm": []byte("not wasm")}); err != nil {
		t.Fatal(err)
	}
	r, err := Open(context.Background(), Config{Dir: dir, CacheDir: cache, Compiler: testCompiler()})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer r.Close(context.Background())
	_, err = r.Inspect(context.Background(), filepath.Join(other, "tail.wasm"))
	if u, ok := errors.AsType[*UnsupportedError](err); !ok || u.Feature != "tail calls" || !errors.Is(err, keel.ErrUnusableTool) {
		t.Errorf("Inspect(tail.wasm) through a child = %v, want an unusable tool using tail calls", err)
	}
	_, err = r.Inspect(context.Background(), filepath.Join(other, "notwasm.wasm"))
	if !errors.Is(err, keel.ErrUnusableTool) || errors.As(err, new(*CompileError)) {
		t.Errorf("Inspect(notwasm.wasm) through a child = %v, want an unusable tool, not a failed child", err)
	}
}
