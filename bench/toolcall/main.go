// Command toolcall measures one small JSON tool, wordcount, called three
// ways on this machine in one run:
//
//   - warm: through a wasmtools.Registry, on a pooled, initialized
//     reactor instance (the daemon's path);
//   - cold: through a registry whose manifest for the same module asks
//     for fresh isolation, so every call instantiates the module and
//     starts its Go runtime (compiled code cached);
//   - spawn: the same tool source built natively for this machine and
//     started as a process per call with the input on stdin, as most
//     agents run tools.
//
// It prints p50 and p99 of each, the ratio spawn/warm, and the linear
// memory of an idle pooled instance.
//
//	go run ./bench/toolcall [-n 1000] [-ncold 100]
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bench/internal/timing"
	"github.com/keel-runtime/keel/wasmtools"
	"github.com/keel-runtime/keel/wasmtools/builtin"
)

const input = `{"text":"the quick brown fox\njumps over the lazy dog\n"}`

func main() {
	n := flag.Int("n", 1000, "calls per warm and spawn measurement")
	ncold := flag.Int("ncold", 100, "calls for the cold measurement")
	flag.Parse()
	if err := run(*n, *ncold); err != nil {
		fmt.Fprintln(os.Stderr, "toolcall:", err)
		os.Exit(1)
	}
}

func run(n, ncold int) error {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "keel-bench-toolcall")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	cache := filepath.Join(tmp, "cache")
	if dir, err := os.UserCacheDir(); err == nil {
		cache = filepath.Join(dir, "keel", "bench-toolcall")
	}

	warmDir := filepath.Join(tmp, "warm")
	if err := builtin.Install(warmDir); err != nil {
		return err
	}
	warm, err := wasmtools.Open(ctx, wasmtools.Config{Dir: warmDir, CacheDir: cache})
	if err != nil {
		return err
	}
	defer warm.Close(ctx)
	if _, ok := warm.PoolStats("wordcount"); !ok {
		return fmt.Errorf("wordcount did not load as a reactor")
	}

	// The cold registry holds the same module, with a sidecar manifest
	// that asks for a fresh instance per call.
	coldDir := filepath.Join(tmp, "cold")
	if err := os.Mkdir(coldDir, 0o755); err != nil {
		return err
	}
	bin, err := os.ReadFile(filepath.Join(warmDir, "wordcount.wasm"))
	if err != nil {
		return err
	}
	var spec map[string]any
	for _, s := range warm.Specs() {
		if s.Name == "wordcount" {
			b, _ := json.Marshal(s)
			_ = json.Unmarshal(b, &spec)
		}
	}
	spec["isolation"] = "fresh"
	side, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(coldDir, "wordcount.wasm"), bin, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(coldDir, "wordcount.manifest.json"), side, 0o644); err != nil {
		return err
	}
	cold, err := wasmtools.Open(ctx, wasmtools.Config{Dir: coldDir, CacheDir: cache})
	if err != nil {
		return err
	}
	defer cold.Close(ctx)

	native := filepath.Join(tmp, "wordcount-native")
	build := exec.Command("go", "build", "-o", native, "github.com/keel-runtime/keel/examples/tools/wordcount")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build the native tool: %w", err)
	}

	// Nothing else runs while calls are timed: both registries have
	// loaded every tool (they compile and load in the background).
	for _, r := range []*wasmtools.Registry{warm, cold} {
		if err := r.WaitReady(ctx); err != nil {
			return err
		}
	}

	call := func(r *wasmtools.Registry) func() error {
		return func() error {
			_, err := r.Call(ctx, keel.ToolInvocation{Name: "wordcount", Args: json.RawMessage(input)})
			return err
		}
	}
	spawn := func() error {
		cmd := exec.Command(native)
		cmd.Stdin = bytes.NewReader([]byte(input))
		out, err := cmd.Output()
		if err != nil {
			return err
		}
		if !bytes.HasPrefix(out, []byte(`{"output":`)) {
			return fmt.Errorf("native tool wrote %q", out)
		}
		return nil
	}

	// Warm calls and spawns alternate in rounds, so that both see the
	// same machine: its speed drifts by tens of percent over seconds.
	var w, s []time.Duration
	for round := range rounds {
		k := n / rounds
		if round < n%rounds {
			k++
		}
		d, err := timing.Measure(k, call(warm))
		if err != nil {
			return fmt.Errorf("warm: %w", err)
		}
		w = append(w, d...)
		if d, err = timing.Measure(k, spawn); err != nil {
			return fmt.Errorf("spawn: %w", err)
		}
		s = append(s, d...)
		time.Sleep(settle)
	}
	c, err := timing.Measure(ncold, call(cold))
	if err != nil {
		return fmt.Errorf("cold: %w", err)
	}
	ps, _ := warm.PoolStats("wordcount")

	fmt.Printf("wordcount, input %d bytes; warm and spawn n=%d each, in %d alternating rounds; cold n=%d\n", len(input), n, rounds, ncold)
	fmt.Printf("%-44s p50 %10v  p99 %10v\n", "warm call (pooled reactor instance)", timing.Pct(w, .50), timing.Pct(w, .99))
	fmt.Printf("%-44s p50 %10v  p99 %10v\n", "cold call (fresh instance, cache warm)", timing.Pct(c, .50), timing.Pct(c, .99))
	fmt.Printf("%-44s p50 %10v  p99 %10v\n", "native process spawned per call", timing.Pct(s, .50), timing.Pct(s, .99))
	fmt.Printf("spawn/warm at p50: %.1fx   cold/warm at p50: %.1fx\n",
		float64(timing.Pct(s, .50))/float64(timing.Pct(w, .50)), float64(timing.Pct(c, .50))/float64(timing.Pct(w, .50)))
	if ps.Idle > 0 {
		fmt.Printf("idle pooled instances: %d; linear memory per idle instance: %.1f MiB (WebAssembly pages x 64 KiB; compiled code is shared)\n",
			ps.Idle, float64(ps.IdleMemoryBytes)/float64(ps.Idle)/(1<<20))
	}
	return nil
}

// rounds is how many alternating rounds of warm calls and spawns make up
// their measurements.
const rounds = 10

// settle is the pause after each round of spawns: the kernel is still
// tearing the last processes down for a few milliseconds.
const settle = 50 * time.Millisecond
