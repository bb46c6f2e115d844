package builtin

import (
	"compress/gzip"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/keel-runtime/keel/internal/atomicfile"
)

//go:generate go run gen.go

//go:embed embedded/*.wasm.gz
var embedded embed.FS

// Names returns the names of the embedded tools, sorted.
func Names() []string {
	entries, _ := embedded.ReadDir("embedded") // cannot fail: the directory is embedded
	var names []string
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".wasm.gz"); ok {
			names = append(names, name)
		}
	}
	return names
}

// Install writes each embedded tool to dir as NAME.wasm, creating dir if
// needed. A file that already exists under that name is left alone, so a
// user's own build of a tool wins. Each file appears whole or not at all
// (written to a temporary file, then renamed).
func Install(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("builtin: %w", err)
	}
	for _, name := range Names() {
		dst := filepath.Join(dir, name+".wasm")
		if _, err := os.Lstat(dst); err == nil {
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("builtin: install %s: %w", name, err)
		}
		if err := install(name, dst); err != nil {
			return fmt.Errorf("builtin: install %s: %w", name, err)
		}
	}
	return nil
}

func install(name, dst string) (err error) {
	src, err := embedded.Open("embedded/" + name + ".wasm.gz")
	if err != nil {
		return err
	}
	defer src.Close()
	zr, err := gzip.NewReader(src)
	if err != nil {
		return err
	}
	defer zr.Close()
	return atomicfile.Write(dst, zr, 0o644)
}
