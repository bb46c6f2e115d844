package wasmtools

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

// limitsManifest is a sidecar manifest for name whose requests ask for
// limits (a JSON object).
func limitsManifest(name, limits string) []byte {
	return []byte(`{"name":"` + name + `","description":"Asks for limits.","input_schema":{"type":"object"},` +
		`"side_effects":"read_only","requests":{"limits":` + limits + `}}`)
}

// fixedModulePages is fixedModule with an initial memory of pages
// 64 KiB pages.
func fixedModulePages(msg string, pages int) []byte {
	bin := fixedModule(msg)
	// fixedModule's memory section is (memory 1): id 5, size 2, one
	// memory, flags 0, minimum 1.
	old := string([]byte{secMemory, 0x03, 0x01, 0x00, 0x01})
	mem := section(secMemory, vec(append([]byte{0x00}, leb(pages)...)))
	return []byte(strings.Replace(string(bin), old, string(mem), 1))
}

// TestManifestLimits: a manifest may lower its limits, and raise them
// only as far as the grants allow; calls are denied until a raise is
// granted, and run with the raised limit once it is.
func TestManifestLimits(t *testing.T) {
	t.Parallel()
	const ok = `{"output":{"ok":true}}`
	dir := t.TempDir()
	if err := writeFiles(dir, map[string][]byte{
		// Lower: a 100 ms deadline instead of 10 s, and 10 bytes of output.
		"spin.wasm":            spinModule(),
		"spin.manifest.json":   limitsManifest("spin", `{"timeout_ms":100}`),
		"chatty.wasm":          fixedModule(ok),
		"chatty.manifest.json": limitsManifest("chatty", `{"output_bytes":10}`),
		// Raise: starts with 2 MiB of memory, over the registry's 1 MiB.
		"big.wasm":          fixedModulePages(ok, 32),
		"big.manifest.json": limitsManifest("big", `{"memory_mib":2}`),
		// Lower below what the module needs to start: not loaded.
		"cramped.wasm":          fixedModulePages(ok, 32),
		"cramped.manifest.json": limitsManifest("cramped", `{"memory_mib":1}`),
	}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	r := openRegistry(t, Config{Dir: dir, MemoryLimitMiB: 1})
	if terr := wantCode(t, r, "spin", `{}`, keel.ToolTimeout); !strings.Contains(terr.Message, "100ms") {
		t.Errorf("Call(spin) = %q, want its own time limit, 100ms", terr.Message)
	}
	if terr := wantCode(t, r, "chatty", `{}`, keel.ToolResourceExhausted); !strings.Contains(terr.Message, "10 bytes") {
		t.Errorf("Call(chatty) = %q, want its own output limit, 10 bytes", terr.Message)
	}
	if terr := wantCode(t, r, "big", `{}`, keel.ToolPermissionDenied); !strings.Contains(terr.Message, "memory of 2 MiB") || !strings.Contains(terr.Message, "limit:memory") {
		t.Errorf("Call(big) without a grant = %q, want it to name the memory limit and how to grant it", terr.Message)
	}
	if _, ok := r.Tool("cramped"); ok {
		t.Error("cramped loaded, though its manifest's memory limit is less than it starts with")
	}
	if _, err := r.Inspect(ctx, dir+"/cramped.wasm"); !errors.Is(err, keel.ErrUnusableTool) || !strings.Contains(err.Error(), "the limit is 1 MiB") {
		t.Errorf("Inspect(cramped) = %v, want unusable: the limit is 1 MiB", err)
	}

	// Granted 2 MiB (or more), big runs; granted less, it is still denied.
	for _, tc := range []struct {
		granted int64
		want    keel.ToolErrorCode // "": it runs
	}{{1, keel.ToolPermissionDenied}, {2, ""}, {4, ""}} {
		g := map[string]capabilities.Grants{"big": {Limits: capabilities.Limits{MemoryMiB: tc.granted}}}
		r := openRegistry(t, Config{Dir: dir, MemoryLimitMiB: 1, Grants: g})
		if tc.want != "" {
			wantCode(t, r, "big", `{}`, tc.want)
			continue
		}
		if got := mustCall(t, r, "big", `{}`); got.(map[string]any)["ok"] != true {
			t.Errorf("Call(big) granted %d MiB = %v, want ok", tc.granted, got)
		}
	}
}

// TestParseLimitManifest: a manifest's limits are checked like the rest
// of it.
func TestParseLimitManifest(t *testing.T) {
	t.Parallel()
	for _, limits := range []string{`{"memory_mib":5000}`, `{"timeout_ms":-1}`, `{"cpu":1}`} {
		if _, err := parseManifest(limitsManifest("t", limits)); err == nil {
			t.Errorf("parseManifest(limits %s) = nil error, want it refused", limits)
		}
	}
	m, err := parseManifest(limitsManifest("t", `{"timeout_ms":30000,"memory_mib":512}`))
	if err != nil || m.Requests.Limits != (capabilities.Limits{TimeoutMS: 30000, MemoryMiB: 512}) {
		t.Fatalf("parseManifest = %+v, %v; want limits 30000 ms, 512 MiB", m, err)
	}
}
