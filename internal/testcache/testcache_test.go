package testcache

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// write creates path with size bytes, modified age ago.
func write(t *testing.T, path string, size int, age time.Duration) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	touch(t, path, age)
}

func touch(t *testing.T, path string, age time.Duration) {
	t.Helper()
	when := time.Now().Add(-age)
	if err := os.Chtimes(path, when, when); err != nil {
		t.Fatal(err)
	}
}

// pruneCase is one cap a prune runs with and which names survive it.
type pruneCase struct {
	name     string
	maxBytes int64
	want     map[string]bool
}

// runCases runs each case in parallel on a new directory filled by fill.
func runCases(t *testing.T, cases []pruneCase, fill func(t *testing.T, dir string), prune func(t *testing.T, dir string, maxBytes int64)) {
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			fill(t, dir)
			prune(t, dir, tt.maxBytes)
			for name, ok := range tt.want {
				if _, err := os.Stat(filepath.Join(dir, name)); (err == nil) != ok {
					t.Errorf("%s exists = %v, want %v", name, err == nil, ok)
				}
			}
		})
	}
}

const day = 24 * time.Hour

// TestPruneFiles: files written over maxAge ago go; then the oldest go
// until the rest fit in maxBytes.
func TestPruneFiles(t *testing.T) {
	t.Parallel()
	runCases(t, []pruneCase{
		{"under the cap: only the expired go", 3 * MiB,
			map[string]bool{"expired": false, "sub/old": true, "middle": true, "sub/new": true}},
		{"over the cap: the oldest go first", 2*MiB + 1,
			map[string]bool{"expired": false, "sub/old": false, "middle": true, "sub/new": true}},
		{"a cap below one file leaves nothing", 1,
			map[string]bool{"expired": false, "sub/old": false, "middle": false, "sub/new": false}},
	}, func(t *testing.T, dir string) {
		write(t, filepath.Join(dir, "expired"), 1, 8*day)
		write(t, filepath.Join(dir, "sub", "old"), MiB, 3*day)
		write(t, filepath.Join(dir, "middle"), MiB, 2*day)
		write(t, filepath.Join(dir, "sub", "new"), MiB, time.Hour)
	}, func(_ *testing.T, dir string, maxBytes int64) {
		PruneFiles(dir, 7*day, maxBytes)
	})
}

// TestPruneDirs: the kept cache is marked used and never removed; the
// others go when unused for maxAge, then least recently used first
// until all fit in maxBytes.
func TestPruneDirs(t *testing.T) {
	t.Parallel()
	runCases(t, []pruneCase{
		{"under the cap: only the unused go", 10 * MiB,
			map[string]bool{"keep": true, "unused": false, "older": true, "newer": true, "file": true}},
		{"over the cap: least recently used first", 2*MiB + 1,
			map[string]bool{"keep": true, "unused": false, "older": false, "newer": true, "file": true}},
		{"the kept cache stays over the cap", 1,
			map[string]bool{"keep": true, "unused": false, "older": false, "newer": false, "file": true}},
	}, func(t *testing.T, parent string) {
		write(t, filepath.Join(parent, "keep", "a"), MiB, 0)
		write(t, filepath.Join(parent, "unused", "a"), 1, 0)
		write(t, filepath.Join(parent, "older", "a"), MiB, 0)
		write(t, filepath.Join(parent, "newer", "sub", "a"), MiB, 0)
		write(t, filepath.Join(parent, "file"), 1, 3*day) // not a cache: left alone
		touch(t, filepath.Join(parent, "keep"), 3*day)    // used last 3 days ago, used now
		touch(t, filepath.Join(parent, "unused"), 2*day)
		touch(t, filepath.Join(parent, "older"), 2*time.Hour)
		touch(t, filepath.Join(parent, "newer"), time.Hour)
	}, func(t *testing.T, parent string, maxBytes int64) {
		start := time.Now()
		PruneDirs(parent, "keep", day, maxBytes)
		if fi, err := os.Stat(filepath.Join(parent, "keep")); err != nil || fi.ModTime().Before(start.Add(-time.Second)) {
			t.Errorf("keep not marked used now: %v", err)
		}
	})
}

// TestPruneDirsCreatesKeep: the first run's cache directory is made.
func TestPruneDirsCreatesKeep(t *testing.T) {
	t.Parallel()
	parent := filepath.Join(t.TempDir(), "daemon-test")
	PruneDirs(parent, "k1", time.Hour, MiB)
	if fi, err := os.Stat(filepath.Join(parent, "k1")); err != nil || !fi.IsDir() {
		t.Errorf("PruneDirs did not create the kept cache: %v", err)
	}
}
