// Package nodetest gives tests the Node.js peers they run against (the
// official MCP and ACP SDKs, the MCP conformance suite, reference
// servers): each lives in a directory with its package.json and
// package-lock.json, whose node_modules npm installs on first use and
// keeps. Only tests and benchmarks use this package.
package nodetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var (
	mu       sync.Mutex
	installs = map[string]*install{} // by absolute directory
)

type install struct {
	once sync.Once
	err  error
}

// Need skips t when node is not installed, unless CI is set (then t
// fails: CI must run it), and installs dir's packages with npm ci once
// per test binary and directory (not at all when node_modules holds a
// complete install: npm writes node_modules/.package-lock.json last).
// The install may take minutes on a cold npm cache; it is bounded by 5.
// Safe for concurrent use by parallel tests.
func Need(t testing.TB, dir string) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("node is needed (CI is set): %v", err)
		}
		t.Skipf("node is not installed: %v", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	in := installs[abs]
	if in == nil {
		in = &install{}
		installs[abs] = in
	}
	mu.Unlock()
	in.once.Do(func() { in.err = Install(context.Background(), abs, nil) })
	if in.err != nil {
		t.Fatal(in.err)
	}
}

// Install runs npm ci in dir unless node_modules holds a complete
// install. For benchmarks too, which have no testing.T; ctx bounds it,
// and so does a 5-minute limit. npm's output goes to progress, or with
// progress nil into the error, should it fail.
func Install(ctx context.Context, dir string, progress io.Writer) error {
	_, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json"))
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if progress != nil {
		fmt.Fprintf(progress, "installing the Node packages in %s (npm ci)\n", dir)
		cmd.Stdout, cmd.Stderr = progress, progress
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("npm ci in %s: %w", dir, err)
		}
		return nil
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm ci in %s: %w\n%s", dir, err, out)
	}
	return nil
}
