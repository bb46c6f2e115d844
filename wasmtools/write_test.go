package wasmtools

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

// TestWriteGrant runs the bundled writefile tool: a read-write grant lets
// it write and patch inside the granted directory only; a read-only grant
// or none refuses it before it runs; no path or symlink leads outside.
func TestWriteGrant(t *testing.T) {
	ws, outside := t.TempDir(), t.TempDir()
	secret := filepath.Join(outside, "secret.txt")
	mustWrite(t, secret, "untouched")
	if err := os.Symlink(outside, filepath.Join(ws, "out-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(ws, "secret-link.txt")); err != nil {
		t.Fatal(err)
	}
	rw := map[string]capabilities.Grants{"writefile": {FS: []capabilities.FSGrant{{HostPath: ws, GuestPath: "/workspace"}}}}
	r := openRegistry(t, Config{Dir: toolsDir, Grants: rw})

	mustCall(t, r, "writefile", `{"path":"notes/todo.txt","content":"buy milk\n"}`)
	if b, err := os.ReadFile(filepath.Join(ws, "notes", "todo.txt")); err != nil || string(b) != "buy milk\n" {
		t.Fatalf("written file = %q, %v", b, err)
	}
	mustCall(t, r, "writefile", `{"path":"notes/todo.txt","old":"milk","new":"bread"}`)
	if b, _ := os.ReadFile(filepath.Join(ws, "notes", "todo.txt")); string(b) != "buy bread\n" {
		t.Errorf("patched file = %q", b)
	}
	wantCode(t, r, "writefile", `{"path":"notes/todo.txt","old":"milk","new":"x"}`, keel.ToolFailed)
	wantCode(t, r, "writefile", `{"path":"a.txt","content":"x","old":"y","new":"z"}`, keel.ToolInvalidInput)

	for _, in := range []string{
		`{"path":"../escape.txt","content":"x"}`,
		`{"path":"out-link/escape.txt","content":"x"}`,
		`{"path":"secret-link.txt","content":"overwritten"}`,
		`{"path":"secret-link.txt","old":"untouched","new":"patched"}`,
		`{"path":"/workspace/../escape.txt","content":"x"}`,
	} {
		if _, te := call(t, r, "writefile", in); te == nil {
			t.Errorf("writefile(%s) succeeded; it must not leave the workspace", in)
		}
	}
	if b, _ := os.ReadFile(secret); string(b) != "untouched" {
		t.Errorf("file outside the grant changed: %q", b)
	}
	for _, p := range []string{filepath.Join(outside, "escape.txt"), filepath.Join(filepath.Dir(ws), "escape.txt")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s was created outside the grant", p)
		}
	}

	ro := map[string]capabilities.Grants{"writefile": {FS: []capabilities.FSGrant{{HostPath: ws, GuestPath: "/workspace", ReadOnly: true}}}}
	r2 := openRegistry(t, Config{Dir: toolsDir, Grants: ro})
	te := wantCode(t, r2, "writefile", `{"path":"x.txt","content":"x"}`, keel.ToolPermissionDenied)
	if !strings.Contains(te.Message, "read-write") {
		t.Errorf("read-only denial %q does not say read-write is needed", te.Message)
	}
	none := openRegistry(t, Config{Dir: toolsDir})
	wantCode(t, none, "writefile", `{"path":"x.txt","content":"x"}`, keel.ToolPermissionDenied)
	if _, err := os.Stat(filepath.Join(ws, "x.txt")); err == nil {
		t.Error("a refused call wrote a file")
	}
}
