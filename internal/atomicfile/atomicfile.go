// Package atomicfile writes files so that a reader sees either the old
// content or the whole new content, never part of it.
package atomicfile

import (
	"io"
	"os"
	"path/filepath"
)

// Write copies r into path with the given mode: into a hidden temporary
// file in the same directory (".NAME.tmp…", which directory watchers
// skip), synced to disk, then renamed over path.
func Write(path string, r io.Reader, mode os.FileMode) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Chmod(mode); err != nil {
		return err
	}
	if _, err := io.Copy(tmp, r); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
