package wasmtools

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
)

// bound is how long an operation the sandbox must bound may take in these
// tests: far more than it needs, far less than forever.
const bound = 30 * time.Second

// within runs f and fails the test if it has not returned within bound.
// A hung f is left running: the test has failed anyway.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(bound):
		t.Fatalf("%s did not return within %v", what, bound)
	}
}

// startLoopDir writes the start-function loopers to a new directory:
// startcmd and startreactor with sidecar manifests when sidecars is set,
// without them otherwise (their manifest then comes from running them).
func startLoopDir(t *testing.T, sidecars bool) string {
	dir := t.TempDir()
	files := map[string][]byte{
		"startcmd.wasm":     startLoopModule(false),
		"startreactor.wasm": startLoopModule(true),
		"fixed.wasm":        fixedModule(`{"output":{"greeting":"hi"}}`),
		"fixed.manifest.json": []byte(`{"name":"fixed","description":"Always greets.",` +
			`"input_schema":{"type":"object"},"side_effects":"read_only"}`),
	}
	if sidecars {
		for _, name := range []string{"startcmd", "startreactor"} {
			files[name+".manifest.json"] = []byte(`{"name":"` + name + `","description":"Loops in its start function.",` +
				`"input_schema":{"type":"object"},"side_effects":"read_only"}`)
		}
	}
	if err := writeFiles(dir, files); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestStartFunctionCallDeadline: a module whose start function loops
// forever runs under the call's deadline, as a command and as a reactor.
func TestStartFunctionCallDeadline(t *testing.T) {
	t.Parallel()
	r := openRegistry(t, Config{Dir: startLoopDir(t, true), CallTimeout: 500 * time.Millisecond})
	for _, name := range []string{"startcmd", "startreactor"} {
		within(t, "Call("+name+")", func() {
			terr := wantCode(t, r, name, `{}`, keel.ToolTimeout)
			if !strings.Contains(terr.Message, "time limit") {
				t.Errorf("Call(%s) error = %q, want it to name the time limit", name, terr.Message)
			}
		})
	}
	mustCall(t, r, "fixed", `{}`)
}

// TestStartFunctionLoadDeadline: loading a module that loops in its start
// function while keel asks for its manifest (by running it, or through
// keel_manifest) ends at the deadline and skips the tool; so does
// Inspect, which `keel tools install` uses.
func TestStartFunctionLoadDeadline(t *testing.T) {
	t.Parallel()
	dir := startLoopDir(t, false)
	var logs lockedBuffer
	var r *Registry
	within(t, "Open", func() {
		r = openRegistry(t, Config{Dir: dir, CallTimeout: 500 * time.Millisecond, Logger: testLogger(t, &logs)})
	})
	var names []string
	for _, tool := range r.Tools() {
		names = append(names, tool.Spec.Name)
	}
	if want := []string{"fixed"}; !slices.Equal(names, want) {
		t.Errorf("Tools() = %q, want %q\nlog:\n%s", names, want, logs.String())
	}
	for _, name := range []string{"startcmd", "startreactor"} {
		if !strings.Contains(logs.String(), name+".wasm") {
			t.Errorf("nothing logged about %s.wasm\nlog:\n%s", name, logs.String())
		}
		within(t, "Inspect("+name+")", func() {
			if _, err := r.Inspect(context.Background(), filepath.Join(dir, name+".wasm")); err == nil || !strings.Contains(err.Error(), "did not finish within") {
				t.Errorf("Inspect(%s) = %v, want an error naming the time limit", name, err)
			}
		})
	}
}

// TestCloseStopsLoading: Close returns promptly while the background
// load runs a start function that would loop for the whole (long) call
// timeout.
func TestCloseStopsLoading(t *testing.T) {
	dir := startLoopDir(t, false)
	if err := os.Remove(filepath.Join(dir, "startcmd.wasm")); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 2)
	testHookLoad = func(name string) {
		if name == "startreactor" {
			started <- struct{}{}
		}
	}
	t.Cleanup(func() { testHookLoad = nil })
	r, err := Open(context.Background(), shared(Config{Dir: dir, Background: true, CallTimeout: time.Hour, Logger: testLogger(t, nil)}))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	within(t, "Close", func() {
		if err := r.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

// TestCloseBounded: Close gives up when its context ends before the
// work it waits for, and says so.
func TestCloseBounded(t *testing.T) {
	t.Parallel()
	r, err := Open(context.Background(), shared(Config{Dir: tinyDir}))
	if err != nil {
		t.Fatal(err)
	}
	r.calls.Add(1) // a call that never returns
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Close(ctx); !errors.Is(err, ErrCloseTimeout) || !errors.Is(err, context.Canceled) {
		t.Errorf("Close with a call stuck = %v, want ErrCloseTimeout wrapping context.Canceled", err)
	}
	// When the stuck call ends, the runtime is released: TestMain's
	// goroutine check fails if the goroutine waiting for it is left.
	r.calls.Done()
}

// TestTablesCountAgainstMemoryCap: table entries, which wazero allocates
// outside linear memory, count against the memory cap: a grow past it
// is refused before it is made (and reported as resource_exhausted when
// the tool dies of it), a table too large to start with is not loaded,
// and memory cannot grow into what the tables took.
func TestTablesCountAgainstMemoryCap(t *testing.T) {
	t.Parallel()
	const capMiB = 16
	manifest := func(name string) []byte {
		return []byte(`{"name":"` + name + `","description":"Grows its table.","input_schema":{"type":"object"},"side_effects":"read_only"}`)
	}
	files := map[string][]byte{
		// 1000 entries and 4 pages: well within the cap.
		"small.wasm": tableModule(1, 1000, 4),
		// 8M entries take 64 MiB.
		"tablebomb.wasm": tableModule(1, 8<<20, 0),
		// 1.5M entries (12 MiB) fit, but then 4 MiB more memory does not.
		"tablethenmemory.wasm": tableModule(1, 3<<19, 64),
		// A table of 4M entries (32 MiB) to start with.
		"bigtable.wasm": tableModule(4<<20, 0, 0),
	}
	for name := range files {
		name = strings.TrimSuffix(name, ".wasm")
		files[name+".manifest.json"] = manifest(name)
	}
	dir := t.TempDir()
	if err := writeFiles(dir, files); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	r := openRegistry(t, Config{Dir: dir, MemoryLimitMiB: capMiB, Logger: testLogger(t, &logs)})
	mustCall(t, r, "small", `{}`)
	for _, name := range []string{"tablebomb", "tablethenmemory"} {
		terr := wantCode(t, r, name, `{}`, keel.ToolResourceExhausted)
		if !strings.Contains(terr.Message, "memory limit") {
			t.Errorf("Call(%s) error = %q, want it to name the memory limit", name, terr.Message)
		}
	}
	if _, ok := r.Tool("bigtable"); ok {
		t.Errorf("bigtable loaded; its 32 MiB table is over the %d MiB cap", capMiB)
	}
	if !strings.Contains(logs.String(), "needs 32 MiB of memory and tables") {
		t.Errorf("no log line saying why bigtable was skipped\nlog:\n%s", logs.String())
	}
	mustCall(t, r, "small", `{}`)
}

// TestStackOverflow: a guest that overflows wazero's call stack is
// resource_exhausted, and says it was the stack, even when the deadline
// passes meanwhile. (A Go guest's stack lives in its linear memory and
// meets the memory cap first: TestHostile and TestReactorDiscard.)
func TestStackOverflow(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := writeFiles(dir, map[string][]byte{
		"recurse.wasm":          recursionModule(),
		"recurse.manifest.json": []byte(`{"name":"recurse","description":"Recurses forever.","input_schema":{"type":"object"},"side_effects":"read_only"}`),
	}); err != nil {
		t.Fatal(err)
	}
	r := openRegistry(t, Config{Dir: dir})
	for range 3 {
		terr := wantCode(t, r, "recurse", `{}`, keel.ToolResourceExhausted)
		if !strings.Contains(terr.Message, "stack overflow") {
			t.Errorf("Call(recurse) error = %q, want it to say stack overflow", terr.Message)
		}
	}
	// The classification does not depend on the deadline.
	o := outcome{err: fmt.Errorf("wrapped: %w", errStackOverflow())}
	ctx, cancel := context.WithTimeout(context.Background(), -1)
	defer cancel()
	if f := r.failure(ctx, o, "", r.defaultLimits()); f == nil || f.Code != keel.ToolResourceExhausted {
		t.Errorf("failure(stack overflow past the deadline) = %v, want resource_exhausted", f)
	}
}
