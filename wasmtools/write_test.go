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
	t.Parallel()
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
	r := openRegistry(t, Config{Dir: bundledDir["writefile"], Grants: rw})

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
	r2 := openRegistry(t, Config{Dir: bundledDir["writefile"], Grants: ro})
	te := wantCode(t, r2, "writefile", `{"path":"x.txt","content":"x"}`, keel.ToolPermissionDenied)
	if !strings.Contains(te.Message, "read-write") {
		t.Errorf("read-only denial %q does not say read-write is needed", te.Message)
	}
	none := openRegistry(t, Config{Dir: bundledDir["writefile"]})
	wantCode(t, none, "writefile", `{"path":"x.txt","content":"x"}`, keel.ToolPermissionDenied)
	if _, err := os.Stat(filepath.Join(ws, "x.txt")); err == nil {
		t.Error("a refused call wrote a file")
	}
}

// TestDiskQuota has the hostile fixture write through a read-write grant
// until refused, and grow files without writing them: every way past the
// per-call quota fails the call with resource_exhausted, though the tool
// ignores the refusal, and leaves at most the quota on disk. The next
// call gets a quota of its own; a free-disk floor above what the disk
// has refuses the first write.
func TestDiskQuota(t *testing.T) {
	t.Parallel()
	const quota = 64 << 10
	for _, dir := range []struct{ name, dir string }{{"command", hostileDir}, {"reactor", reactorDir}} {
		t.Run(dir.name, func(t *testing.T) {
			t.Parallel()
			ws := t.TempDir()
			grant := map[string]capabilities.Grants{"hostile": {FS: []capabilities.FSGrant{{HostPath: ws, GuestPath: "/out"}}}}
			r := openRegistry(t, Config{Dir: dir.dir, Grants: grant, WriteQuotaBytes: quota, MinFreeDiskBytes: -1})
			for _, c := range []struct{ in, file string }{
				{`{"mode":"fill","path":"/out/fill.bin"}`, "fill.bin"},
				{`{"mode":"truncate","path":"/out/fill.bin","size":1099511627776}`, "fill.bin"},
				{`{"mode":"seekwrite","path":"/out/seek.bin","size":1099511627776}`, "seek.bin"},
				{`{"mode":"pwrite","path":"/out/pwrite.bin","size":1099511627776}`, "pwrite.bin"},
			} {
				te := wantCode(t, r, "hostile", c.in, keel.ToolResourceExhausted)
				if !strings.Contains(te.Message, "quota of 65536 bytes per call to /out") {
					t.Errorf("hostile(%s) message %q does not name the quota", c.in, te.Message)
				}
				if fi, err := os.Stat(filepath.Join(ws, c.file)); err != nil || fi.Size() > quota {
					t.Errorf("after hostile(%s), %s: %v, %v; want at most %d bytes", c.in, c.file, fi.Size(), err, quota)
				}
			}
			// A call within the quota, after calls that used it up, passes.
			mustCall(t, r, "hostile", `{"mode":"write","path":"/out/small.txt","data":"fits"}`)

			floor := openRegistry(t, Config{Dir: dir.dir, Grants: grant, MinFreeDiskBytes: 1 << 62})
			te := wantCode(t, floor, "hostile", `{"mode":"write","path":"/out/floor.txt","data":"x"}`, keel.ToolResourceExhausted)
			if !strings.Contains(te.Message, "free disk") {
				t.Errorf("floor refusal %q does not name the free-disk floor", te.Message)
			}
		})
	}
}
