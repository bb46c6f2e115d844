// Package testcache keeps bounded the compilation caches that test
// binaries share in the user cache directory (keel/wasmtools-test,
// keel/daemon-test, keel/cmd-test, ...), and names them (Dir: a key over
// everything a cache's content depends on). The caches outlive a test run so that the next run
// loads compiled tools instead of compiling them again; without a bound
// they would grow by every tool module a change produces, for good.
//
// Pruning is best effort: errors are ignored, and a file removed while
// another test process has it open stays readable to that process. The
// cost of removing an entry still in use is one compilation at the next
// run. Only tests use this package.
package testcache

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// MiB is a mebibyte, for the byte limits.
const MiB = 1 << 20

// PruneFiles removes the regular files under dir written more than
// maxAge ago, then, while the files left take more than maxBytes in all,
// the oldest of them by modification time. A cache that replaces an
// entry by writing a new file keeps its recent entries this way.
func PruneFiles(dir string, maxAge time.Duration, maxBytes int64) {
	cutoff := time.Now().Add(-maxAge)
	var kept []entry
	var total int64
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if fi.ModTime().Before(cutoff) {
			os.Remove(path)
			return nil
		}
		kept = append(kept, entry{path, fi.ModTime(), fi.Size()})
		total += fi.Size()
		return nil
	})
	removeOldest(kept, total, maxBytes)
}

// PruneDirs keeps the caches that are the directories of parent: it
// marks parent/keep used now (creating it), removes the others not
// marked used within maxAge, then, while all of them take more than
// maxBytes, the least recently used. keep is never removed, whatever its
// size. Each test binary marks the cache it uses, keyed by what its
// content depends on, so another worktree's cache in use stays.
func PruneDirs(parent, keep string, maxAge time.Duration, maxBytes int64) {
	now := time.Now()
	if err := os.MkdirAll(filepath.Join(parent, keep), 0o700); err == nil {
		os.Chtimes(filepath.Join(parent, keep), now, now)
	}
	var others []entry
	var total int64
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		path := filepath.Join(parent, e.Name())
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if e.Name() != keep && now.Sub(fi.ModTime()) > maxAge {
			os.RemoveAll(path)
			continue
		}
		size := sizeOf(path)
		total += size
		if e.Name() != keep {
			others = append(others, entry{path, fi.ModTime(), size})
		}
	}
	removeOldest(others, total, maxBytes)
}

// entry is a file or directory of a cache, last used (written) at used.
type entry struct {
	path string
	used time.Time
	size int64
}

// removeOldest removes entries, least recently used first, while total,
// the bytes of the whole cache, is over maxBytes.
func removeOldest(entries []entry, total, maxBytes int64) {
	slices.SortFunc(entries, func(a, b entry) int { return a.used.Compare(b.used) })
	for _, e := range entries {
		if total <= maxBytes {
			return
		}
		if os.RemoveAll(e.path) == nil {
			total -= e.size
		}
	}
}

// sizeOf returns the bytes of the regular files under dir.
func sizeOf(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
