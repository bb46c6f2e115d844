package daemon_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

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
	// a key naming everything its content depends on (see testcache.Dir).
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
	// The tools unpacked once, kept in the user cache directory (unpacking
	// them takes seconds of CPU under -race).
	builtinDir := filepath.Join("..", "wasmtools", "builtin")
	if err := testcache.Installed("bundled-test", builtinDir, []string{filepath.Join(builtinDir, "embedded")}, bundledDir, builtin.Install); err != nil {
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

	// Caches of other wasmtools code or tools go when no test binary
	// used them for a day, or beyond 1 GiB (about 150 MiB each).
	warmCache, err = testcache.Dir("daemon-test", filepath.Join("..", "wasmtools"), filepath.Join(tmp, "cache"), 1024*testcache.MiB, bundledDir, variantDir)
	if err != nil {
		return 0, err
	}
	// Compile the tools into the cache up front, without a deadline, so
	// that each test's daemon loads them from it. A cache filled before
	// (warmDone) is used as it is: opening the tools on it would still
	// read and load every compiled module, about 5 s of CPU under -race.
	if _, err := os.Stat(filepath.Join(warmCache, warmDone)); err != nil {
		for _, dir := range []string{bundledDir, variantDir} {
			if err := fill(warmCache, dir); err != nil {
				return 0, err
			}
		}
		if err := os.WriteFile(filepath.Join(warmCache, warmDone), nil, 0o600); err != nil {
			return 0, err
		}
	}
	return m.Run(), nil
}

// warmDone marks a cache fill has completed (a dot file: testcache.Link
// does not link it).
const warmDone = ".warm"

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

// linkWarmCache makes dst a compilation cache for one test's daemon: a
// new directory whose files are links to those of warmCache. What the
// daemon adds (its tool index, a module no other test compiles) stays in
// the test's directory, and nothing in warmCache changes: the cache
// replaces a file by renaming a new one over it, never by writing into
// it.
func linkWarmCache(t *testing.T, dst string) {
	t.Helper()
	if err := testcache.Link(warmCache, dst); err != nil {
		t.Fatalf("link the warm compilation cache: %v", err)
	}
}
