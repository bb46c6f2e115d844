package daemon_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel/internal/testcache"
	"github.com/keel-runtime/keel/wasmtools"
	"github.com/keel-runtime/keel/wasmtools/builtin"
)

// Shared by every test of the package, made once by TestMain.
var (
	// warmCache is a wazero compilation cache holding the bundled tools
	// compiled, and writefileVariant too. Compiling a Go module takes
	// seconds (far more under -race), so it lives in the user's cache
	// directory and survives between runs, like Go's build cache, under
	// a key naming everything its content depends on (see cacheKey).
	// Tests do not use it directly: linkWarmCache gives each daemon a
	// view of its own.
	warmCache string
	// bundledDir holds the bundled tools, installed once; withTools
	// copies the few a test needs from it.
	bundledDir string
	// writefileVariant is the bundled writefile with a custom section
	// appended: another digest, the same behaviour (withCustomSection).
	writefileVariant []byte
)

// cloudKeyEnv names the environment variable models.json points the
// cloud providers of the tests at, set once by TestMain to cloudKey:
// t.Setenv cannot be used by parallel tests.
const (
	cloudKeyEnv = "KEEL_TEST_CLOUD_KEY"
	cloudKey    = "sk-keel-test-0123456789"
)

func TestMain(m *testing.M) {
	code, err := testMain(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "daemon TestMain:", err)
		code = 1
	}
	os.Exit(code)
}

func testMain(m *testing.M) (int, error) {
	os.Setenv(cloudKeyEnv, cloudKey)
	tmp, err := os.MkdirTemp("", "keel-daemon-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	bundledDir = filepath.Join(tmp, "bundled")
	if err := builtin.Install(bundledDir); err != nil {
		return 0, err
	}
	orig, err := os.ReadFile(filepath.Join(bundledDir, "writefile.wasm"))
	if err != nil {
		return 0, err
	}
	writefileVariant = withCustomSection(orig)
	variantDir := filepath.Join(tmp, "variant")
	if err := os.Mkdir(variantDir, 0o700); err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(variantDir, "writefile.wasm"), writefileVariant, 0o600); err != nil {
		return 0, err
	}

	warmCache = filepath.Join(tmp, "cache")
	if dir, err := os.UserCacheDir(); err == nil {
		key, err := cacheKey(bundledDir, variantDir)
		if err != nil {
			return 0, err
		}
		warmCache = filepath.Join(dir, "keel", "daemon-test", key)
		// Caches of other wasmtools code or tools go when no test binary
		// used them for a day, or beyond 1 GiB (about 150 MiB each).
		testcache.PruneDirs(filepath.Dir(warmCache), filepath.Base(warmCache), 24*time.Hour, 1024*testcache.MiB)
	}
	// Compile the tools into the cache up front, without a deadline, so
	// that each test's daemon loads them from it. A warm cache makes this
	// a few reads.
	for _, dir := range []string{bundledDir, variantDir} {
		if err := fill(warmCache, dir); err != nil {
			return 0, err
		}
	}
	return m.Run(), nil
}

// fill opens the tools of dir with cache as their compilation cache, so
// that cache holds them compiled. The registry's index of dir (a temp
// dir) is removed from the cache: it would only pile up.
func fill(cache, dir string) error {
	ctx := context.Background()
	reg, err := wasmtools.Open(ctx, wasmtools.Config{Dir: dir, CacheDir: cache})
	if err != nil {
		return err
	}
	if err := reg.Close(ctx); err != nil {
		return err
	}
	index, _ := filepath.Glob(filepath.Join(cache, "index-v*"))
	for _, d := range index {
		os.RemoveAll(d)
	}
	return nil
}

// cacheKey names what the content of a compilation cache for the tools
// of dirs depends on: the tool files, wazero's version, and wasmtools'
// own code (how it instruments a module and what it keeps beside the
// compiled code), so that a change to any of them starts a new cache
// rather than reading a stale one.
func cacheKey(dirs ...string) (string, error) {
	h := sha256.New()
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range bi.Deps {
			if dep.Path == "github.com/tetratelabs/wazero" {
				fmt.Fprintf(h, "wazero %s %s\n", dep.Version, dep.Sum)
			}
		}
	}
	src, err := filepath.Glob(filepath.Join("..", "wasmtools", "*.go"))
	if err != nil || len(src) == 0 {
		return "", fmt.Errorf("wasmtools sources for the cache key: %v (found %d)", err, len(src))
	}
	var files []string
	for _, f := range src {
		if !strings.HasSuffix(f, "_test.go") {
			files = append(files, f)
		}
	}
	for _, dir := range dirs {
		wasm, err := filepath.Glob(filepath.Join(dir, "*.wasm"))
		if err != nil {
			return "", err
		}
		files = append(files, wasm...)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256(b)
		fmt.Fprintf(h, "%s %x\n", filepath.Base(f), sum)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// linkWarmCache makes dst a compilation cache for one test's daemon: a
// new directory whose files are links to those of warmCache. What the
// daemon adds (its tool index, a module no other test compiles) stays in
// the test's directory, and nothing in warmCache changes: the cache
// replaces a file by renaming a new one over it, never by writing into
// it.
func linkWarmCache(t *testing.T, dst string) {
	t.Helper()
	err := filepath.WalkDir(warmCache, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(warmCache, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		if !d.Type().IsRegular() || strings.HasPrefix(d.Name(), ".") || strings.Contains(d.Name(), ".tmp") {
			return nil // a temporary file another test binary is writing
		}
		return os.Symlink(path, filepath.Join(dst, rel))
	})
	if err != nil {
		t.Fatalf("link the warm compilation cache: %v", err)
	}
}
