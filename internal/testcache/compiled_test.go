package testcache

import (
	"os"
	"path/filepath"
	"testing"
)

// TestKeyNamesItsInputs: the key changes with a tool file's content, a
// file added to a tool directory and a wasmtools source, and not with a
// wasmtools test file: a stale cache is never read, an unchanged one is.
func TestKeyNamesItsInputs(t *testing.T) {
	src, tools := t.TempDir(), t.TempDir()
	write := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(src, "a.go"), "package a")
	write(filepath.Join(src, "a_test.go"), "package a")
	write(filepath.Join(tools, "x.wasm"), "x")
	single := filepath.Join(t.TempDir(), "y.wasm")
	write(single, "y")
	key := func() string {
		t.Helper()
		k, err := Key(src, tools, single)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	seen := map[string]string{}
	step := func(name string, change func(), same bool) {
		t.Helper()
		before := key()
		change()
		after := key()
		if (before == after) != same {
			t.Errorf("%s: key %s -> %s, want same=%v", name, before, after, same)
		}
		if !same {
			if prev, ok := seen[after]; ok {
				t.Errorf("%s: key %s already seen after %s", name, after, prev)
			}
			seen[after] = name
		}
	}
	step("test file changed", func() { write(filepath.Join(src, "a_test.go"), "package a // changed") }, true)
	step("tool changed", func() { write(filepath.Join(tools, "x.wasm"), "x2") }, false)
	step("tool added", func() { write(filepath.Join(tools, "z.wasm"), "z") }, false)
	step("single file changed", func() { write(single, "y2") }, false)
	step("source changed", func() { write(filepath.Join(src, "a.go"), "package a // changed") }, false)
	if _, err := Key(t.TempDir()); err == nil {
		t.Error("Key of a directory without .go files: no error")
	}
}

// TestLinkSkipsFilesBeingWritten: Link mirrors the tree with links to
// the files, and leaves out dot files and temporary names.
func TestLinkSkipsFilesBeingWritten(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "view")
	for _, f := range []string{"sub/a", "b", ".marker", "sub/c.tmp123"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, f)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, f), []byte(f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := Link(src, dst); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]bool{"sub/a": true, "b": true, ".marker": false, "sub/c.tmp123": false} {
		target, err := os.Readlink(filepath.Join(dst, f))
		if got := err == nil; got != want {
			t.Errorf("%s linked = %v (%v), want %v", f, got, err, want)
		} else if want && target != filepath.Join(src, f) {
			t.Errorf("%s links to %s, want %s", f, target, filepath.Join(src, f))
		}
	}
}
