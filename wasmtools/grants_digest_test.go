package wasmtools

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
)

// TestFileDigests: without a sidecar the grant digest is the module's
// digest; a sidecar, even an empty one, makes it another, and another
// sidecar another again.
func TestFileDigests(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "tool.wasm")
	bin := []byte("\x00asm\x01\x00\x00\x00")
	if err := os.WriteFile(file, bin, 0o600); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(bin)
	want := hex.EncodeToString(h[:])
	side := filepath.Join(dir, "tool.manifest.json")
	seen := map[string]string{}
	for _, tc := range []struct {
		name    string
		sidecar []byte // nil: none
	}{
		{"no sidecar", nil},
		{"empty sidecar", []byte{}},
		{"sidecar a", []byte(`{"side_effects":"non_idempotent_write"}`)},
		{"sidecar b", []byte(`{"side_effects":"read_only"}`)},
	} {
		os.Remove(side)
		if tc.sidecar != nil {
			if err := os.WriteFile(side, tc.sidecar, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		sum, digest, err := FileDigests(file)
		if err != nil || sum != want {
			t.Fatalf("%s: FileDigests = %s, %v; want sha256 %s", tc.name, sum, err, want)
		}
		if tc.sidecar == nil && digest != want || tc.sidecar != nil && digest == want {
			t.Errorf("%s: grant digest %s, module digest %s: want them equal only without a sidecar", tc.name, digest, want)
		}
		if digest != GrantDigest(sum, tc.sidecar) {
			t.Errorf("%s: FileDigests grant digest %s != GrantDigest %s", tc.name, digest, GrantDigest(sum, tc.sidecar))
		}
		if prev, ok := seen[digest]; ok {
			t.Errorf("%s and %s have the same grant digest", prev, tc.name)
		}
		seen[digest] = tc.name
	}
	if _, _, err := FileDigests(filepath.Join(dir, "missing.wasm")); !os.IsNotExist(err) {
		t.Errorf("FileDigests of a missing file = %v, want not exist", err)
	}
}
