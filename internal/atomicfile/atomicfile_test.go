package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, strings.NewReader("new"), 0o640); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "new" {
		t.Fatalf("read %q, %v; want new", b, err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", fi.Mode().Perm())
	}

	// A failing reader leaves the old content and no temporary file.
	err = Write(path, io.MultiReader(strings.NewReader("half"), errReader{}), 0o640)
	if err == nil {
		t.Fatal("Write with a failing reader succeeded")
	}
	if b, _ := os.ReadFile(path); string(b) != "new" {
		t.Errorf("after a failed write the file holds %q, want the old content", b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %d entries after a failed write, want 1", len(entries))
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk gone") }
