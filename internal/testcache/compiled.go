package testcache

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// Dir returns the directory of a compilation cache that outlives the
// test binary, parent/KEY under the user cache directory's keel/name,
// where KEY names everything the cache's content depends on: wazero's
// version (from the test binary's build info), wasmtools' code (the
// non-test .go files of wasmtoolsDir: how a module is instrumented and
// what is kept beside the compiled code) and the tool files (their
// contents; a directory stands for the files in it). A change to any of
// them starts a new cache rather than reading a stale one. Caches of
// name not used for a day, or beyond maxBytes in all, are pruned
// (PruneDirs). Without a user cache directory, Dir returns fallback.
func Dir(name, wasmtoolsDir, fallback string, maxBytes int64, tools ...string) (string, error) {
	key, err := Key(wasmtoolsDir, tools...)
	if err != nil {
		return "", err
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return fallback, nil
	}
	parent := filepath.Join(base, "keel", name)
	PruneDirs(parent, key, 24*time.Hour, maxBytes)
	return filepath.Join(parent, key), nil
}

// Key is Dir's key: 16 hex digits of a SHA-256 over wazero's version,
// the non-test .go files of wasmtoolsDir and the files tools (a
// directory stands for its regular files, not recursively).
func Key(wasmtoolsDir string, tools ...string) (string, error) {
	h := sha256.New()
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range bi.Deps {
			if dep.Path == "github.com/tetratelabs/wazero" {
				fmt.Fprintf(h, "wazero %s %s\n", dep.Version, dep.Sum)
			}
		}
	}
	src, err := filepath.Glob(filepath.Join(wasmtoolsDir, "*.go"))
	if err != nil || len(src) == 0 {
		return "", fmt.Errorf("wasmtools sources for the cache key in %s: %v (found %d)", wasmtoolsDir, err, len(src))
	}
	src = slices.DeleteFunc(src, func(f string) bool { return strings.HasSuffix(f, "_test.go") })
	files := src
	for _, t := range tools {
		fi, err := os.Stat(t)
		if err != nil {
			return "", err
		}
		if !fi.IsDir() {
			files = append(files, t)
			continue
		}
		entries, err := os.ReadDir(t)
		if err != nil {
			return "", err
		}
		for _, e := range entries {
			if e.Type().IsRegular() {
				files = append(files, filepath.Join(t, e.Name()))
			}
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %x\n", filepath.Base(f), sha256.Sum256(b))
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// Link makes dst a view of the cache src for one test: a new directory
// tree whose files are symbolic links to those of src. What the test's
// daemon adds (its tool index, a module no other test compiles) stays in
// dst, and nothing in src changes: a wazero cache replaces a file by
// renaming a new one over it, never by writing into it. Files being
// written (dot files, names holding ".tmp") are skipped.
func Link(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		if !d.Type().IsRegular() || strings.HasPrefix(d.Name(), ".") || strings.Contains(d.Name(), ".tmp") {
			return nil
		}
		return os.Symlink(path, filepath.Join(dst, rel))
	})
}
