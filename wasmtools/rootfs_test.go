package wasmtools

import (
	"os"
	"path/filepath"
	"testing"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/experimental/sysfs"
)

func TestRootFS(t *testing.T) {
	t.Parallel()
	outside := t.TempDir()
	mustWrite(t, filepath.Join(outside, "secret.txt"), "secret")
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "a.txt"), "a")
	mustWrite(t, filepath.Join(dir, "sub", "b.txt"), "b")
	for link, target := range map[string]string{
		"abs-out": filepath.Join(outside, "secret.txt"),
		"rel-out": filepath.Join("..", filepath.Base(outside), "secret.txt"),
		"dir-out": outside,
		"in":      "a.txt",
	} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	fsys := rootFS{root: root}

	read := func(p string) (string, experimentalsys.Errno) {
		f, errno := fsys.OpenFile(p, experimentalsys.O_RDONLY, 0)
		if errno != 0 {
			return "", errno
		}
		defer f.Close()
		buf := make([]byte, 64)
		n, errno := f.Read(buf)
		return string(buf[:n]), errno
	}
	for _, p := range []string{"a.txt", "in", "sub/b.txt", "sub/../a.txt"} {
		if got, errno := read(p); errno != 0 || got == "" {
			t.Errorf("read %s = %q, %v; want its content", p, got, errno)
		}
	}
	for _, p := range []string{"abs-out", "rel-out", "dir-out/secret.txt", "../" + filepath.Base(outside) + "/secret.txt"} {
		if got, errno := read(p); errno == 0 {
			t.Errorf("read %s = %q; want an error, it leaves the root", p, got)
		}
		if _, errno := fsys.Stat(p); errno == 0 {
			t.Errorf("Stat(%s) succeeded; want an error, it leaves the root", p)
		}
	}
	if st, errno := fsys.Lstat("abs-out"); errno != 0 || st.Mode&os.ModeSymlink == 0 {
		t.Errorf("Lstat(abs-out) = %v, %v; want the link itself", st.Mode, errno)
	}

	d, errno := fsys.OpenFile(".", experimentalsys.O_RDONLY|experimentalsys.O_DIRECTORY, 0)
	if errno != 0 {
		t.Fatalf("open root: %v", errno)
	}
	entries, errno := d.Readdir(-1)
	d.Close()
	if errno != 0 || len(entries) != 6 {
		t.Errorf("Readdir(.) = %v, %v; want 6 entries", entries, errno)
	}
	for _, e := range entries {
		if e.Ino == 0 {
			t.Errorf("Readdir entry %s has no inode; Go guests skip such entries", e.Name)
		}
	}
	if _, errno := fsys.OpenFile("a.txt", experimentalsys.O_RDONLY|experimentalsys.O_DIRECTORY, 0); errno != experimentalsys.ENOTDIR {
		t.Errorf("open a.txt as a directory = %v, want ENOTDIR", errno)
	}
	if errno := fsys.Rmdir("a.txt"); errno != experimentalsys.ENOTDIR {
		t.Errorf("Rmdir(a.txt) = %v, want ENOTDIR", errno)
	}
	if errno := fsys.Unlink("sub"); errno != experimentalsys.EISDIR {
		t.Errorf("Unlink(sub) = %v, want EISDIR", errno)
	}
	if errno := fsys.Symlink("/etc/passwd", "new-link"); errno != experimentalsys.EPERM {
		t.Errorf("Symlink to an absolute path = %v, want EPERM", errno)
	}

	// Writing goes through; a read-only wrapper refuses it.
	f, errno := fsys.OpenFile("new.txt", experimentalsys.O_WRONLY|experimentalsys.O_CREAT, 0o644)
	if errno != 0 {
		t.Fatalf("create new.txt: %v", errno)
	}
	if _, errno := f.Write([]byte("hi")); errno != 0 {
		t.Errorf("write new.txt: %v", errno)
	}
	f.Close()
	if b, err := os.ReadFile(filepath.Join(dir, "new.txt")); err != nil || string(b) != "hi" {
		t.Errorf("host new.txt = %q, %v; want hi", b, err)
	}
	ro := &sysfs.ReadFS{FS: fsys}
	if _, errno := ro.OpenFile("other.txt", experimentalsys.O_WRONLY|experimentalsys.O_CREAT, 0o644); errno == 0 {
		t.Error("read-only mount created a file")
	}
	if errno := ro.Unlink("a.txt"); errno == 0 {
		t.Error("read-only mount removed a file")
	}
}
