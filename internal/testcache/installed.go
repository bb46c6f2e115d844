package testcache

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Installed fills dst as install(dst) would, from a copy that install
// made once in a directory of the user cache directory's keel/name (see
// Dir for its key, from srcDir and inputs, and its pruning): the first
// run installs there and marks the directory complete, later runs copy
// its regular files into dst. It is for an install that costs more than
// a copy, such as unpacking the bundled tools (seconds of CPU under
// -race, for the decompressor's every byte). Files are copied, never
// linked, so a test may change what it is given. install must skip
// files already present and write each file whole (as builtin.Install
// does): two test binaries may fill the same directory at once. Without
// a user cache directory, install writes dst itself.
func Installed(name, srcDir string, inputs []string, dst string, install func(dir string) error) error {
	dir, err := Dir(name, srcDir, "", 256*MiB, inputs...)
	if err != nil {
		return err
	}
	if dir == "" {
		return install(dst)
	}
	marker := filepath.Join(dir, installedDone)
	if _, err := os.Stat(marker); err != nil {
		if err := install(dir); err != nil {
			return err
		}
		if err := os.WriteFile(marker, nil, 0o600); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name() != installedDone {
			if err := copyFile(filepath.Join(dir, e.Name()), filepath.Join(dst, e.Name())); err != nil {
				return fmt.Errorf("testcache: %w", err)
			}
		}
	}
	return nil
}

// installedDone marks a directory Installed has filled.
const installedDone = ".installed"

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
