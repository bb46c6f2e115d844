package wasmtools

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
)

// TestWatchHotReload drops tools into a watched directory, replaces one,
// writes a broken file and deletes one, checking the registry follows
// each change live and keeps serving throughout.
func TestWatchHotReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := openRegistry(t, Config{Dir: dir})
	if n := len(r.Tools()); n != 0 {
		t.Fatalf("empty dir loaded %d tools", n)
	}
	changes := make(chan []Tool, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Watch(ctx, 50*time.Millisecond, func(ts []Tool) { changes <- ts }) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch = %v", err)
		}
	}()
	next := func(what string) []Tool {
		t.Helper()
		select {
		case ts := <-changes:
			return ts
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: no reload within 20s", what)
			return nil
		}
	}
	manifest, err := os.ReadFile(filepath.Join(tinyDir, "fixed.manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(filepath.Join(tinyDir, "fixed.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	// Drop in: sidecar first, then the module.
	if err := os.WriteFile(filepath.Join(dir, "fixed.manifest.json"), manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "fixed.wasm"), bin, 0o644); err != nil {
		t.Fatal(err)
	}
	ts := next("drop in")
	if len(ts) != 1 || ts[0].Spec.Name != "fixed" || ts[0].Spec.Version != "1.0.0" {
		t.Fatalf("after drop-in tools = %+v", ts)
	}
	mustCall(t, r, "fixed", `{}`)

	// Replace: a new manifest version is picked up.
	v2 := strings.Replace(string(manifest), `"1.0.0"`, `"2.0.0"`, 1)
	if err := os.WriteFile(filepath.Join(dir, "fixed.manifest.json"), []byte(v2), 0o644); err != nil {
		t.Fatal(err)
	}
	if ts := next("replace"); len(ts) != 1 || ts[0].Spec.Version != "2.0.0" {
		t.Fatalf("after replace tools = %+v", ts)
	}

	// A broken or half-written file is skipped; the others keep working.
	// A tool dropped in after it makes a reload that has seen both.
	if err := os.WriteFile(filepath.Join(dir, "half.wasm"), bin[:len(bin)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	other := strings.Replace(string(manifest), `"name":"fixed"`, `"name":"other"`, 1)
	if err := os.WriteFile(filepath.Join(dir, "other.manifest.json"), []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "other.wasm"), bin, 0o644); err != nil {
		t.Fatal(err)
	}
	ts = next("broken file, then another tool")
	if got := toolNames(ts); !slices.Equal(got, []string{"fixed", "other"}) {
		t.Fatalf("after broken file tools = %q, want fixed and other", got)
	}
	mustCall(t, r, "fixed", `{}`)

	// Delete.
	if err := os.Remove(filepath.Join(dir, "fixed.wasm")); err != nil {
		t.Fatal(err)
	}
	if got := toolNames(next("delete")); !slices.Equal(got, []string{"other"}) {
		t.Fatalf("after delete tools = %q, want other", got)
	}
	wantCode(t, r, "fixed", `{}`, keel.ToolNotFound)
}

// toolNames returns the names of ts, sorted.
func toolNames(ts []Tool) []string {
	var names []string
	for _, tl := range ts {
		names = append(names, tl.Spec.Name)
	}
	slices.Sort(names)
	return names
}

// TestReloadWhileCalling swaps the tool set while calls run, under -race.
func TestReloadWhileCalling(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, f := range []string{"fixed.wasm", "fixed.manifest.json"} {
		b, err := os.ReadFile(filepath.Join(tinyDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := openRegistry(t, Config{Dir: dir})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := r.Call(context.Background(), keel.ToolInvocation{Name: "fixed", Args: []byte(`{}`)}); err != nil {
					t.Errorf("Call during reload = %v", err)
					return
				}
			}
		}()
	}
	manifest, _ := os.ReadFile(filepath.Join(dir, "fixed.manifest.json"))
	for i := 0; i < 5; i++ {
		m := strings.Replace(string(manifest), `"1.0.0"`, `"1.0.`+string(rune('1'+i))+`"`, 1)
		if err := os.WriteFile(filepath.Join(dir, "fixed.manifest.json"), []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
		changed, err := r.Reload(context.Background())
		if err != nil || !changed {
			t.Errorf("Reload %d = %v, %v; want changed", i, changed, err)
		}
	}
	if changed, err := r.Reload(context.Background()); err != nil || changed {
		t.Errorf("Reload with nothing new = %v, %v; want unchanged", changed, err)
	}
	close(stop)
	wg.Wait()
}

// TestRegistryConcurrentChurn installs, replaces and removes tool files
// and reloads while other goroutines call and list, under -race. Every
// call either succeeds or fails with not_found (the tool was removed at
// that moment); nothing else.
func TestRegistryConcurrentChurn(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin, err := os.ReadFile(filepath.Join(tinyDir, "fixed.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(tinyDir, "fixed.manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	install := func(version string) {
		m := strings.Replace(string(manifest), `"1.0.0"`, `"`+version+`"`, 1)
		if err := os.WriteFile(filepath.Join(dir, "fixed.manifest.json"), []byte(m), 0o644); err != nil {
			t.Error(err)
		}
		tmp := filepath.Join(dir, ".fixed.tmp")
		if err := os.WriteFile(tmp, bin, 0o644); err != nil {
			t.Error(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "fixed.wasm")); err != nil {
			t.Error(err)
		}
	}
	install("1.0.0")
	var changes sync.WaitGroup
	r := openRegistry(t, Config{Dir: dir, OnChange: func() {}})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := r.Call(context.Background(), keel.ToolInvocation{Name: "fixed", Args: []byte(`{}`)})
				var te *keel.ToolError
				if err != nil && (!errors.As(err, &te) || te.Code != keel.ToolNotFound) {
					t.Errorf("Call during churn = %v", err)
					return
				}
				r.Tools()
			}
		}()
	}
	changes.Add(1)
	go func() {
		defer changes.Done()
		for i := 0; i < 20; i++ {
			switch i % 3 {
			case 0:
				install(fmt.Sprintf("1.0.%d", i))
			case 1:
				os.Remove(filepath.Join(dir, "fixed.wasm"))
			case 2:
				install("2.0.0")
			}
			if _, err := r.Reload(context.Background()); err != nil {
				t.Errorf("Reload = %v", err)
			}
		}
	}()
	changes.Wait()
	close(stop)
	wg.Wait()
	install("3.0.0")
	if _, err := r.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ts := r.Tools(); len(ts) != 1 || ts[0].Spec.Version != "3.0.0" {
		t.Errorf("after churn tools = %+v", ts)
	}
	mustCall(t, r, "fixed", `{}`)
}
