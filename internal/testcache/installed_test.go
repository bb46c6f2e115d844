package testcache

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestInstalledOncePerKey: the first call installs into the cache, later
// ones copy from it without installing; dst gets the files, not the
// marker, as copies; a changed input installs again.
func TestInstalledOncePerKey(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "a.go"), []byte("package a"), 0o600); err != nil {
		t.Fatal(err)
	}
	input := filepath.Join(t.TempDir(), "tools.gz")
	if err := os.WriteFile(input, []byte("v1"), 0o600); err != nil {
		t.Fatal(err)
	}
	installs := 0
	install := func(dir string) error {
		installs++
		return os.WriteFile(filepath.Join(dir, "tool.wasm"), []byte("tool"), 0o644)
	}
	dsts := make([]string, 3)
	for i := range dsts {
		if i == 2 {
			if err := os.WriteFile(input, []byte("v2"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		dsts[i] = filepath.Join(t.TempDir(), "tools")
		if err := Installed("installed-test", src, []string{input}, dsts[i], install); err != nil {
			t.Fatalf("Installed #%d: %v", i+1, err)
		}
		entries, err := os.ReadDir(dsts[i])
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, []string{"tool.wasm"}) {
			t.Errorf("Installed #%d wrote %q, want [tool.wasm]", i+1, names)
		}
	}
	if installs != 2 {
		t.Errorf("install ran %d times for two keys, want 2", installs)
	}
	// dst holds a copy: changing it leaves the cache as it was.
	if err := os.WriteFile(filepath.Join(dsts[2], "tool.wasm"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	again := filepath.Join(t.TempDir(), "tools")
	if err := Installed("installed-test", src, []string{input}, again, install); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(again, "tool.wasm")); err != nil || string(b) != "tool" || installs != 2 {
		t.Errorf("after a dst was changed: %q, %v, %d installs; want tool from the cache, 2 installs", b, err, installs)
	}
}
