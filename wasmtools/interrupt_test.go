package wasmtools

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// compileBare compiles bin in a runtime without WithCloseOnContextDone,
// so that only the interrupt global can stop its guest code.
func compileBare(t testing.TB, bin []byte) (wazero.Runtime, wazero.CompiledModule) {
	t.Helper()
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	t.Cleanup(func() { _ = rt.Close(ctx) })
	compiled, err := rt.CompileModule(ctx, bin)
	if err != nil {
		t.Fatalf("compile the instrumented module: %v", err)
	}
	return rt, compiled
}

// TestInterruptStopsLoop: an endless loop, in a runtime that does not
// watch contexts, stops when the host sets the interrupt global, and
// only then.
// TestInterruptStopsLoop spins a core: it runs alone, not in parallel.
func TestInterruptStopsLoop(t *testing.T) {
	bin, err := instrument(spinModule())
	if err != nil {
		t.Fatalf("instrument: %v", err)
	}
	rt, compiled := compileBare(t, bin)
	ctx := context.Background()
	mod, err := rt.InstantiateModule(ctx, compiled, wazero.NewModuleConfig().WithStartFunctions())
	if err != nil {
		t.Fatal(err)
	}
	g, ok := mod.ExportedGlobal(interruptGlobal).(api.MutableGlobal)
	if !ok {
		t.Fatalf("the instrumented module exports no mutable %q", interruptGlobal)
	}
	done := make(chan error, 1)
	go func() {
		_, err := mod.ExportedFunction("_start").Call(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the loop ended before the interrupt: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	// A spinning guest must not hold up the garbage collector: its
	// stop-the-world waits for every goroutine, and native code cannot be
	// preempted, only the guest's periodic tick into Go lets it through.
	gc := make(chan struct{})
	go func() { runtime.GC(); close(gc) }()
	select {
	case <-gc:
	case <-time.After(time.Minute): // generous: a loaded machine, not a stuck GC, is slow
		g.Set(1) // stop the guest, or it spins on through the other tests
		<-done
		t.Fatal("a garbage collection did not finish within a minute while the guest spun")
	}
	g.Set(1)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "unreachable") {
			t.Fatalf("interrupted call returned %v, want an unreachable trap", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the loop did not stop within 10 s of the interrupt")
	}
}

// TestInstrumentSections: a module with neither a global nor an export
// section gets both, in the right place, and a module that already has
// globals keeps their indices.
func TestInstrumentSections(t *testing.T) {
	// (module (memory 1) (global i32 (i32.const 7)) (func (loop (br_if 0 (global.get 0)))))
	withGlobal := module(
		section(secType, vec(voidType)),
		section(secFunc, vec([]byte{0})),
		section(secMemory, vec([]byte{0x00, 0x01})),
		section(6, vec([]byte{0x7f, 0x00, 0x41, 0x07, 0x0b})),
		section(secCode, vec(body(0x03, 0x40, 0x23, 0x00, 0x0d, 0x00, 0x0b, 0x0b))),
	)
	// (module (memory 1) (func (loop)))
	bare := module(
		section(secType, vec(voidType)),
		section(secFunc, vec([]byte{0})),
		section(secMemory, vec([]byte{0x00, 0x01})),
		section(secCode, vec(body(0x03, 0x40, 0x0b, 0x0b))),
	)
	// (module (memory 1)), no function, no type, no code section.
	empty := module(section(secMemory, vec([]byte{0x00, 0x01})))
	for name, tc := range map[string]struct {
		bin        []byte
		fuel, tick uint32
	}{"with a global": {withGlobal, 1, 1}, "bare": {bare, 0, 1}, "empty": {empty, 0, 0}} {
		t.Run(name, func(t *testing.T) {
			bin, err := instrument(tc.bin)
			if err != nil {
				t.Fatalf("instrument: %v", err)
			}
			rt, compiled := compileBare(t, bin)
			mod, err := rt.InstantiateModule(context.Background(), compiled, wazero.NewModuleConfig())
			if err != nil {
				t.Fatal(err)
			}
			g, ok := mod.ExportedGlobal(interruptGlobal).(api.MutableGlobal)
			if !ok || g.Type() != api.ValueTypeI32 {
				t.Fatalf("no mutable i32 %q export", interruptGlobal)
			}
			// The check uses the new global and function.
			if tc.tick > 0 && !strings.Contains(string(bin), string(loopCheck(appendU32(nil, tc.fuel), appendU32(nil, tc.tick)))) {
				t.Errorf("no loop check on global %d and function %d in the instrumented module", tc.fuel, tc.tick)
			}
		})
	}
}

// TestInstrumentRefuses: modules the rewrite cannot make safe.
func TestInstrumentRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		bin  []byte
		want string
	}{
		// (func (global.set 0 (i32.const 0))) with no globals: after the
		// rewrite, index 0 would be the interrupt global.
		"clears the interrupt": {module(
			section(secType, vec(voidType)),
			section(secFunc, vec([]byte{0})),
			section(secMemory, vec([]byte{0x00, 0x01})),
			section(secCode, vec(body(0x41, 0x00, 0x24, 0x00, 0x0b))),
		), "refers to global 0"},
		// (func (call 1)): after the rewrite, function 1 would be tick.
		"calls the tick": {module(
			section(secType, vec(voidType)),
			section(secFunc, vec([]byte{0})),
			section(secMemory, vec([]byte{0x00, 0x01})),
			section(secCode, vec(body(0x10, 0x01, 0x0b))),
		), "refers to function 1"},
		"no memory": {module(
			section(secType, vec(voidType)),
			section(secFunc, vec([]byte{0})),
			section(secCode, vec(body(0x0b))),
		), "has no memory"},
		"exports the reserved name": {module(
			section(secType, vec(voidType)),
			section(secFunc, vec([]byte{0})),
			section(secMemory, vec([]byte{0x00, 0x01})),
			section(secExport, vec(append(str(interruptGlobal), exportFunc, 0))),
			section(secCode, vec(body(0x0b))),
		), "reserves"},
		"unknown instruction": {module(
			section(secType, vec(voidType)),
			section(secFunc, vec([]byte{0})),
			section(secMemory, vec([]byte{0x00, 0x01})),
			section(secCode, vec(body(0x27, 0x0b))),
		), "unknown instruction"},
		"truncated body": {module(
			section(secType, vec(voidType)),
			section(secFunc, vec([]byte{0})),
			section(secMemory, vec([]byte{0x00, 0x01})),
			section(secCode, vec(body(0x03, 0x40, 0x0b))),
		), "before its final end"},
		"sections out of order": {module(
			section(secFunc, vec([]byte{0})),
			section(secType, vec(voidType)),
		), "out of order"},
		"not wasm":    {[]byte("#!/bin/sh\necho hi\n"), "not a WebAssembly binary"},
		"version two": {[]byte("\x00asm\x02\x00\x00\x00"), "version 2"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := instrument(tc.bin)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("instrument = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// FuzzInstrument: the rewrite never panics, and whatever wazero accepts
// before it (and the rewrite does not refuse) wazero accepts after it.
func FuzzInstrument(f *testing.F) {
	f.Add(spinModule())
	f.Add(fixedModule(`{"output":{}}`))
	f.Add(sneakyModule())
	f.Add(startLoopModule(false))
	f.Add(startLoopModule(true))
	f.Add(tableModule(1, 1000, 4))
	if bin, err := os.ReadFile(filepath.Join(hostileDir, "hostile.wasm")); err == nil {
		f.Add(bin)
	}
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	f.Fuzz(func(t *testing.T, bin []byte) {
		out, err := instrument(bin)
		if err != nil {
			return
		}
		before, err := rt.CompileModule(ctx, bin)
		if err != nil {
			return
		}
		_ = before.Close(ctx)
		after, err := rt.CompileModule(ctx, out)
		if err != nil {
			t.Fatalf("wazero accepts the module but not its instrumented form: %v", err)
		}
		_ = after.Close(ctx)
	})
}
