package wasmtools

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/experimental/sysfs"
)

// openRootFS returns a rootFS on dir, closed when the test ends.
func openRootFS(t *testing.T, dir string) rootFS {
	t.Helper()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return rootFS{root: root}
}

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
	fsys := openRootFS(t, dir)

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

// TestRootFSChanges: what a read-write grant lets a guest change
// (rename, link, mode, times) happens inside the root and never reaches
// beyond it; a read-only grant changes nothing.
func TestRootFSChanges(t *testing.T) {
	t.Parallel()
	outside := t.TempDir()
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "a.txt"), "a")
	mustWrite(t, filepath.Join(dir, "sub", "b.txt"), "b")
	if err := os.Symlink("a.txt", filepath.Join(dir, "in")); err != nil {
		t.Fatal(err)
	}
	fsys := openRootFS(t, dir)
	escape := "../" + filepath.Base(outside) + "/x.txt"

	if got := fsys.String(); got != dir {
		t.Errorf("String() = %q, want %q", got, dir)
	}
	if errno := fsys.Rename("sub/b.txt", "c.txt"); errno != 0 {
		t.Errorf("Rename(sub/b.txt, c.txt) = %v", errno)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "c.txt")); err != nil || string(b) != "b" {
		t.Errorf("after the rename host c.txt = %q, %v; want b", b, err)
	}
	if errno := fsys.Rename("c.txt", escape); errno != experimentalsys.EPERM {
		t.Errorf("Rename out of the root = %v, want EPERM", errno)
	}
	if errno := fsys.Link("a.txt", "hard.txt"); errno != 0 {
		t.Errorf("Link(a.txt, hard.txt) = %v", errno)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "hard.txt")); err != nil || string(b) != "a" {
		t.Errorf("host hard.txt = %q, %v; want a", b, err)
	}
	if errno := fsys.Link("a.txt", escape); errno != experimentalsys.EPERM {
		t.Errorf("Link out of the root = %v, want EPERM", errno)
	}
	if _, err := os.Lstat(filepath.Join(outside, "x.txt")); !os.IsNotExist(err) {
		t.Errorf("a file appeared outside the root (%v)", err)
	}
	if got, errno := fsys.Readlink("in"); errno != 0 || got != "a.txt" {
		t.Errorf("Readlink(in) = %q, %v; want a.txt", got, errno)
	}
	if _, errno := fsys.Readlink("missing"); errno != experimentalsys.ENOENT {
		t.Errorf("Readlink(missing) = %v, want ENOENT", errno)
	}
	if errno := fsys.Rmdir("missing"); errno != experimentalsys.ENOENT {
		t.Errorf("Rmdir(missing) = %v, want ENOENT", errno)
	}
	if errno := fsys.Unlink("missing"); errno != experimentalsys.ENOENT {
		t.Errorf("Unlink(missing) = %v, want ENOENT", errno)
	}
	if errno := fsys.Chmod("a.txt", 0o600|os.ModeSetuid); errno != 0 {
		t.Errorf("Chmod(a.txt) = %v", errno)
	}
	if fi, err := os.Stat(filepath.Join(dir, "a.txt")); err != nil || fi.Mode() != 0o600 {
		t.Errorf("host a.txt mode = %v, %v; want -rw------- (no setuid)", fi.Mode(), err)
	}

	// Utimens on a path and on an open file; UTIME_OMIT keeps a time.
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if errno := fsys.Utimens("a.txt", experimentalsys.UTIME_OMIT, mtime.UnixNano()); errno != 0 {
		t.Errorf("Utimens(a.txt) = %v", errno)
	}
	if fi, err := os.Stat(filepath.Join(dir, "a.txt")); err != nil || !fi.ModTime().Equal(mtime) {
		t.Errorf("host a.txt mtime = %v, %v; want %v", fi.ModTime(), err, mtime)
	}
	f, errno := fsys.OpenFile("hard.txt", experimentalsys.O_RDWR, 0)
	if errno != 0 {
		t.Fatalf("open hard.txt: %v", errno)
	}
	defer f.Close()
	later := mtime.Add(time.Hour)
	if errno := f.Utimens(experimentalsys.UTIME_OMIT, later.UnixNano()); errno != 0 {
		t.Errorf("file Utimens = %v", errno)
	}
	if fi, err := os.Stat(filepath.Join(dir, "hard.txt")); err != nil || !fi.ModTime().Equal(later) {
		t.Errorf("host hard.txt mtime = %v, %v; want %v", fi.ModTime(), err, later)
	}
	if errno := f.Sync(); errno != 0 {
		t.Errorf("Sync = %v", errno)
	}
	if errno := f.Datasync(); errno != 0 {
		t.Errorf("Datasync = %v", errno)
	}
	if errno := f.SetAppend(false); errno != 0 {
		t.Errorf("SetAppend(false) on a file opened without append = %v, want 0", errno)
	}
	if errno := f.SetAppend(true); errno != experimentalsys.ENOSYS {
		t.Errorf("SetAppend(true) = %v, want ENOSYS (not supported after open)", errno)
	}
	d, errno := fsys.OpenFile("sub", experimentalsys.O_RDONLY|experimentalsys.O_DIRECTORY, 0)
	if errno != 0 {
		t.Fatalf("open sub: %v", errno)
	}
	defer d.Close()
	if errno := d.Sync(); errno != 0 {
		t.Errorf("Sync of a directory = %v, want 0", errno)
	}
	if errno := d.Truncate(0); errno != experimentalsys.EISDIR {
		t.Errorf("Truncate of a directory = %v, want EISDIR", errno)
	}

	ro := &sysfs.ReadFS{FS: fsys}
	for name, errno := range map[string]experimentalsys.Errno{
		"Rename":  ro.Rename("a.txt", "z.txt"),
		"Link":    ro.Link("a.txt", "z.txt"),
		"Chmod":   ro.Chmod("a.txt", 0o777),
		"Utimens": ro.Utimens("a.txt", 0, 0),
	} {
		if errno == 0 {
			t.Errorf("read-only %s succeeded", name)
		}
	}
	// a.txt and hard.txt are one file: its time is the one set last.
	if fi, err := os.Stat(filepath.Join(dir, "a.txt")); err != nil || fi.Mode() != 0o600 || !fi.ModTime().Equal(later) {
		t.Errorf("a read-only mount changed a.txt: %v %v, %v", fi.Mode(), fi.ModTime(), err)
	}
}
