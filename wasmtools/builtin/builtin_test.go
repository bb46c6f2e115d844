package builtin

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestNames(t *testing.T) {
	got := Names()
	for _, want := range []string{"readfile", "wordcount"} {
		if !slices.Contains(got, want) {
			t.Errorf("Names() = %q, want it to contain %q", got, want)
		}
	}
	if !slices.IsSorted(got) {
		t.Errorf("Names() = %q, want sorted", got)
	}
}

func TestInstall(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tools") // Install creates it
	mine := []byte("my own build")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "wordcount.wasm"), mine, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Install(dir); err != nil {
		t.Fatalf("Install: %v", err)
	}
	for _, name := range Names() {
		got, err := os.ReadFile(filepath.Join(dir, name+".wasm"))
		if err != nil {
			t.Fatalf("Install left no %s.wasm: %v", name, err)
		}
		if name == "wordcount" {
			if !bytes.Equal(got, mine) {
				t.Errorf("Install replaced an existing wordcount.wasm")
			}
			continue
		}
		if want := embeddedWasm(t, name); !bytes.Equal(got, want) {
			t.Errorf("installed %s.wasm (%d bytes) differs from the embedded one (%d bytes)", name, len(got), len(want))
		}
		if !bytes.HasPrefix(got, []byte("\x00asm")) {
			t.Errorf("installed %s.wasm is not WebAssembly", name)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("Install left a temporary file %s", e.Name())
		}
	}
	// A second Install changes nothing and does not fail.
	if err := Install(dir); err != nil {
		t.Fatalf("second Install: %v", err)
	}
}

// TestEmbeddedUpToDate rebuilds the example tools with gen.go and checks
// the embedded files match, so a change to a tool or the toolkit cannot
// ship without regenerating. Builds are reproducible for one Go version
// only, so the test skips under another.
func TestEmbeddedUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("rebuilds the example tools; skipped with -short")
	}
	recorded, err := os.ReadFile("embedded/GOVERSION")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimSpace(string(recorded))
	if v := runtime.Version(); v != want {
		t.Skipf("embedded tools were built with %s and this test runs %s; builds are only comparable with the same Go. Run go generate ./wasmtools/builtin with %s to refresh them.", want, v, v)
	}
	goVersion, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		t.Skipf("no go command to rebuild the tools with: %v", err)
	}
	if v := strings.TrimSpace(string(goVersion)); v != want {
		t.Skipf("embedded tools were built with %s and the go command on PATH is %s; builds are only comparable with the same Go", want, v)
	}

	out := t.TempDir()
	cmd := exec.Command("go", "run", "gen.go", "-out", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run gen.go: %v\n%s", err, b)
	}
	fresh, err := filepath.Glob(filepath.Join(out, "*.wasm.gz"))
	if err != nil {
		t.Fatal(err)
	}
	var freshNames []string
	for _, f := range fresh {
		freshNames = append(freshNames, strings.TrimSuffix(filepath.Base(f), ".wasm.gz"))
	}
	if !slices.Equal(freshNames, Names()) {
		t.Fatalf("examples/tools has tools %q, embedded are %q; run go generate ./wasmtools/builtin", freshNames, Names())
	}
	for _, name := range freshNames {
		gotSum := sum(embeddedWasm(t, name))
		wantSum := sum(gunzipFile(t, filepath.Join(out, name+".wasm.gz")))
		if gotSum != wantSum {
			t.Errorf("embedded %s.wasm has sha256 %s, a fresh build has %s; run go generate ./wasmtools/builtin", name, gotSum, wantSum)
		}
	}
}

func embeddedWasm(t *testing.T, name string) []byte {
	t.Helper()
	f, err := embedded.Open("embedded/" + name + ".wasm.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return gunzip(t, f)
}

func gunzipFile(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return gunzip(t, f)
}

func gunzip(t *testing.T, r io.Reader) []byte {
	t.Helper()
	zr, err := gzip.NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
