package c_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/wasmtools"
)

// requireEnv, when set (CI sets it), turns a missing C toolchain from a
// skip into a failure, so CI cannot pass without building the tool.
const requireEnv = "KEEL_TEST_REQUIRE_C"

// build compiles linecount.c with clang for wasm32-wasi into dir and
// returns the file. It skips the test when clang, wasm-ld or wasi-libc
// or clang's wasm32 runtime library is missing (Debian: apt-get install
// clang lld wasi-libc libclang-rt-dev-wasm32), unless
// requireEnv is set.
func build(t *testing.T, dir string) string {
	t.Helper()
	missing := func(what string) {
		t.Helper()
		msg := what + " is missing; install clang, lld, wasi-libc and libclang-rt-dev-wasm32 (Debian packages) to build the C example"
		if os.Getenv(requireEnv) != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	clang, err := exec.LookPath("clang")
	if err != nil {
		missing("clang")
	}
	if _, err := exec.LookPath("wasm-ld"); err != nil {
		missing("wasm-ld (lld)")
	}
	// clang prints the bare name of a library it cannot find, and the
	// path of its runtime library whether it is there or not.
	if out, err := exec.Command(clang, "--target=wasm32-wasi", "-print-file-name=libc.a").Output(); err != nil || !filepath.IsAbs(strings.TrimSpace(string(out))) {
		missing("wasi-libc")
	}
	if out, err := exec.Command(clang, "--target=wasm32-wasi", "-print-libgcc-file-name").Output(); err != nil {
		missing("clang's wasm32 runtime library (Debian: libclang-rt-dev-wasm32)")
	} else if _, err := os.Stat(strings.TrimSpace(string(out))); err != nil {
		missing("clang's wasm32 runtime library (Debian: libclang-rt-dev-wasm32)")
	}
	file := filepath.Join(dir, "linecount.wasm")
	cmd := exec.Command(clang, "--target=wasm32-wasi", "-mexec-model=reactor", "-O2", "-Wall", "-Werror", "-s", "-o", file, filepath.Join("linecount", "linecount.c"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	return file
}

// TestLinecount builds the C tool, inspects and installs it into a real
// registry, and calls it: with the workspace granted it counts, it
// reports its own errors with their codes, and without the grant it does
// not run.
func TestLinecount(t *testing.T) {
	ctx := context.Background()
	tools := t.TempDir()
	file := build(t, tools)

	workspace := t.TempDir()
	if err := os.WriteFile(filepath.Join(workspace, "story.txt"), []byte("Once upon a time\nthere was a tiny model.\nThe end"), 0o600); err != nil {
		t.Fatal(err)
	}
	grant := capabilities.Grants{FS: []capabilities.FSGrant{{GuestPath: "/workspace", HostPath: workspace, ReadOnly: true}}}
	r, err := wasmtools.Open(ctx, wasmtools.Config{Dir: tools, Grants: map[string]capabilities.Grants{"linecount": grant}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(context.Background()) })

	info, err := r.Inspect(ctx, file)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if info.Spec.Name != "linecount" || info.Spec.SideEffects != keel.SideEffectReadOnly || len(info.Requests.FS) != 1 || info.Requests.FS[0].GuestPath != "/workspace" {
		t.Fatalf("Inspect = %+v, want linecount, read_only, requesting /workspace", info)
	}
	if _, ok := r.Tool("linecount"); !ok {
		t.Fatal("linecount is not loaded")
	}

	// Twice, so the second call runs on the pooled instance the first
	// left: keel_alloc's buffer is reused.
	for range 2 {
		out, err := r.Call(ctx, keel.ToolInvocation{Name: "linecount", Args: json.RawMessage(`{"path":"story.txt"}`)})
		if err != nil {
			t.Fatalf("Call: %v", err)
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		want := map[string]any{"path": "story.txt", "lines": 3.0, "bytes": 48.0}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("Call(story.txt) output (-want +got):\n%s", diff)
		}
	}

	for _, tc := range []struct {
		input string
		code  keel.ToolErrorCode
		msg   string
	}{
		{`{"path":"nope.txt"}`, keel.ToolFailed, "not_found: nope.txt"},
		{`{"path":"../escape.txt"}`, keel.ToolFailed, "../escape.txt"},
		{`{"path":"/etc/passwd"}`, keel.ToolInvalidInput, ""},
		{`{"path":"st\u0061ry.txt"}`, keel.ToolFailed, "invalid_input: path"},
	} {
		_, err := r.Call(ctx, keel.ToolInvocation{Name: "linecount", Args: json.RawMessage(tc.input)})
		te, ok := errors.AsType[*keel.ToolError](err)
		if !ok || te.Code != tc.code || !strings.Contains(te.Message, tc.msg) {
			t.Errorf("Call(%s) = %v, want %s containing %q", tc.input, err, tc.code, tc.msg)
		}
	}

	// Without the grant the tool does not start.
	bare, err := wasmtools.Open(ctx, wasmtools.Config{Dir: tools})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close(ctx)
	_, err = bare.Call(ctx, keel.ToolInvocation{Name: "linecount", Args: json.RawMessage(`{"path":"story.txt"}`)})
	if te, ok := errors.AsType[*keel.ToolError](err); !ok || te.Code != keel.ToolPermissionDenied {
		t.Fatalf("Call without a grant = %v, want permission_denied", err)
	}
}
