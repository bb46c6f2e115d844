package wasmtools

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestPruneCache: the shared test cache loses files written over maxAge
// ago and keeps the others.
func TestPruneCache(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	old, young := filepath.Join(dir, "sub", "old"), filepath.Join(dir, "young")
	for _, f := range []string{old, young} {
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-8 * 24 * time.Hour)
	if err := os.Chtimes(old, long, long); err != nil {
		t.Fatal(err)
	}
	pruneCache(dir, 7*24*time.Hour)
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("a file written 8 days ago is still there (%v)", err)
	}
	if _, err := os.Stat(young); err != nil {
		t.Errorf("a new file was removed: %v", err)
	}
}
