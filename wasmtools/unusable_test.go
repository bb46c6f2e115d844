package wasmtools

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
)

// TestUnusableModules: a module keel cannot bound is refused with the
// feature it uses, and a broken binary as not valid WebAssembly; both are
// keel.ErrUnusableTool (the file's fault), never keel.ErrInvalid (the
// request's).
func TestUnusableModules(t *testing.T) {
	t.Parallel()
	r := plainRegistry(t)
	// command builds a module with one function of type () -> (),
	// exported as _start, with the given memory section entries.
	command := func(code []byte, memories ...[]byte) []byte {
		return module(
			section(secType, vec(voidType)),
			section(secFunc, vec([]byte{0})),
			section(secMemory, vec(memories...)),
			section(secExport, vec(
				append(str("memory"), exportMemory, 0),
				append(str("_start"), exportFunc, 0))),
			section(secCode, vec(code)),
		)
	}
	oneMemory := []byte{0x00, 0x01}
	for _, tc := range []struct {
		name    string
		bin     []byte
		feature string // "": a broken binary
	}{
		// (func (export "_start") (return_call 0))
		{"tail call", command(body(0x12, 0x00, 0x0b), oneMemory), "tail calls"},
		// (func (export "_start") (atomic.fence))
		{"atomics", command(body(0xfe, 0x03, 0x00, 0x0b), oneMemory), "threads (atomic instructions)"},
		// (memory (export "memory") 1 1 shared)
		{"shared memory", command(body(0x0b), []byte{0x03, 0x01, 0x01}), "threads (a shared memory)"},
		// (func (export "_start") (try (do)))
		{"try", command(body(0x06, 0x40, 0x0b, 0x0b), oneMemory), "exception handling"},
		// (tag (param)) in a tag section, between memory and export.
		{"tag section", module(
			section(secType, vec(voidType)),
			section(secFunc, vec([]byte{0})),
			section(secMemory, vec(oneMemory)),
			section(13, vec([]byte{0x00, 0x00})),
			section(secExport, vec(append(str("memory"), exportMemory, 0), append(str("_start"), exportFunc, 0))),
			section(secCode, vec(body(0x0b))),
		), "exception handling"},
		// (memory 1) (memory 1)
		{"two memories", command(body(0x0b), oneMemory, oneMemory), "multiple memories"},
		{"not wasm", []byte("not wasm at all"), ""},
		{"truncated", command(body(0x0b), oneMemory)[:20], ""},
		// A body whose instruction does not exist (0x27 is unassigned).
		{"bad instruction", command(body(0x27, 0x0b), oneMemory), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			file := filepath.Join(t.TempDir(), "tool.wasm")
			if err := os.WriteFile(file, tc.bin, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := r.Inspect(context.Background(), file)
			if !errors.Is(err, keel.ErrUnusableTool) || errors.Is(err, keel.ErrInvalid) {
				t.Fatalf("Inspect = %v; want keel.ErrUnusableTool and not keel.ErrInvalid", err)
			}
			ue, ok := errors.AsType[*UnsupportedError](err)
			if tc.feature == "" {
				if ok || !strings.Contains(err.Error(), "not a valid WebAssembly module") {
					t.Fatalf("Inspect = %v; want a broken binary, not valid WebAssembly", err)
				}
				return
			}
			if !ok || ue.Feature != tc.feature {
				t.Fatalf("Inspect = %v; want an *UnsupportedError of %q", err, tc.feature)
			}
			if want := "uses " + tc.feature + ", which keel cannot bound"; !strings.Contains(err.Error(), want) {
				t.Fatalf("Inspect = %v; want it to say %q", err, want)
			}
		})
	}
}
