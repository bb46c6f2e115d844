//go:build ignore

// gen builds every example tool (each directory of examples/tools with a
// main.go) for GOOS=wasip1 GOARCH=wasm as a reactor (-buildmode=c-shared,
// so keel can keep initialized instances for warm calls) and writes it gzipped to
// embedded/NAME.wasm.gz, removing files of tools that no longer exist. It
// records the Go version that built them in embedded/GOVERSION.
//
// Usage (from this directory, which go generate arranges):
//
//	go run gen.go [-out dir]
package main

import (
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func main() {
	out := flag.String("out", "embedded", "directory to write NAME.wasm.gz and GOVERSION to")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(out string) error {
	gomod, err := goCmd("env", "GOMOD")
	if err != nil {
		return err
	}
	toolsDir := filepath.Join(filepath.Dir(gomod), "examples", "tools")
	entries, err := os.ReadDir(toolsDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	built := map[string]bool{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(toolsDir, e.Name(), "main.go")); err != nil {
			continue
		}
		if err := build(filepath.Join(toolsDir, e.Name()), filepath.Join(out, e.Name()+".wasm.gz")); err != nil {
			return fmt.Errorf("%s: %w", e.Name(), err)
		}
		built[e.Name()] = true
	}
	old, _ := filepath.Glob(filepath.Join(out, "*.wasm.gz"))
	for _, f := range old {
		if !built[strings.TrimSuffix(filepath.Base(f), ".wasm.gz")] {
			if err := os.Remove(f); err != nil {
				return err
			}
		}
	}
	version, err := goCmd("env", "GOVERSION")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "GOVERSION"), []byte(version+"\n"), 0o644)
}

// build compiles the tool in dir and writes it gzipped to dst. The flags
// make the output depend on the source and the Go version only.
func build(dir, dst string) error {
	tmp, err := os.MkdirTemp("", "keel-gen-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	wasm := filepath.Join(tmp, "tool.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", wasm, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOWASM=")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build: %w", err)
	}
	bin, err := os.ReadFile(wasm)
	if err != nil {
		return err
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression) // no name, no time: reproducible
	if err != nil {
		return err
	}
	if _, err := zw.Write(bin); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(dst, gz.Bytes(), 0o644)
}

func goCmd(args ...string) (string, error) {
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}
