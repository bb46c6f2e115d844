package wasmtools

import (
	"cmp"
	"errors"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	wazerosys "github.com/tetratelabs/wazero/sys"
)

// rootFS is the experimentalsys.FS behind every granted directory. It goes
// through os.Root, which resolves each path beneath the granted host
// directory and refuses any symbolic link that leads out of it. wazero's
// own directory mounts hand paths to the host OS as they are, so a link
// inside the grant pointing at /etc would be followed; see
// https://github.com/wazero/wazero/issues/2321. Read-only grants wrap
// rootFS in wazero's sysfs.ReadFS.
//
// Paths arrive from wazero cleaned and relative to the mount. meter,
// set on a read-write grant, counts what the files opened through it
// write (see disk.go). use records what is opened through it (see
// touched.go); nil records nothing.
type rootFS struct {
	experimentalsys.UnimplementedFS
	root  *os.Root
	meter *diskMeter
	use   *mountUse
}

func (r rootFS) String() string { return r.root.Name() }

// rootName maps a wazero path to an os.Root name.
func rootName(p string) string {
	p = strings.TrimPrefix(p, "/")
	if p == "" {
		return "."
	}
	return p
}

// toErrno maps an os error to an errno. os.Root reports a path that
// escapes the root with an error that carries no errno; it becomes EPERM,
// which is what wazero answers for lexical escapes too.
func toErrno(err error) experimentalsys.Errno {
	if err == nil {
		return 0
	}
	errno := experimentalsys.UnwrapOSError(err)
	if errno == experimentalsys.EIO {
		var se syscall.Errno
		if !errors.As(err, &se) {
			return experimentalsys.EPERM
		}
	}
	return errno
}

func (r rootFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	name := rootName(p)
	var osFlag int
	switch flag & (experimentalsys.O_RDONLY | experimentalsys.O_RDWR | experimentalsys.O_WRONLY) {
	case experimentalsys.O_RDWR:
		osFlag = os.O_RDWR
	case experimentalsys.O_WRONLY:
		osFlag = os.O_WRONLY
	default:
		osFlag = os.O_RDONLY
	}
	for _, m := range []struct {
		from experimentalsys.Oflag
		to   int
	}{
		{experimentalsys.O_APPEND, os.O_APPEND},
		{experimentalsys.O_CREAT, os.O_CREATE},
		{experimentalsys.O_EXCL, os.O_EXCL},
		{experimentalsys.O_SYNC, os.O_SYNC},
		{experimentalsys.O_TRUNC, os.O_TRUNC},
	} {
		if flag&m.from != 0 {
			osFlag |= m.to
		}
	}
	if flag&experimentalsys.O_NOFOLLOW != 0 {
		if fi, err := r.root.Lstat(name); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return nil, experimentalsys.ELOOP
		}
	}
	f, err := r.root.OpenFile(name, osFlag, perm&fs.ModePerm)
	if err != nil {
		return nil, toErrno(err)
	}
	file, errno := newRootFile(r.root, name, f, flag&experimentalsys.O_APPEND != 0, r.meter)
	if errno != 0 {
		return nil, errno
	}
	if flag&experimentalsys.O_DIRECTORY != 0 {
		if isDir, errno := file.IsDir(); errno != 0 || !isDir {
			_ = file.Close()
			if errno == 0 {
				errno = experimentalsys.ENOTDIR
			}
			return nil, errno
		}
	}
	if name == "." {
		file.listed = r.use // recorded when read, see mountUse.opened
	} else {
		r.use.opened(name)
	}
	return file, 0
}

func (r rootFS) Lstat(p string) (wazerosys.Stat_t, experimentalsys.Errno) {
	fi, err := r.root.Lstat(rootName(p))
	if err != nil {
		return wazerosys.Stat_t{}, toErrno(err)
	}
	return wazerosys.NewStat_t(fi), 0
}

func (r rootFS) Stat(p string) (wazerosys.Stat_t, experimentalsys.Errno) {
	fi, err := r.root.Stat(rootName(p))
	if err != nil {
		return wazerosys.Stat_t{}, toErrno(err)
	}
	return wazerosys.NewStat_t(fi), 0
}

func (r rootFS) Mkdir(p string, perm fs.FileMode) experimentalsys.Errno {
	errno := toErrno(r.root.Mkdir(rootName(p), perm&fs.ModePerm))
	if errno == experimentalsys.ENOTDIR {
		errno = experimentalsys.ENOENT // as wazero's own directory mounts answer
	}
	return errno
}

func (r rootFS) Chmod(p string, perm fs.FileMode) experimentalsys.Errno {
	return toErrno(r.root.Chmod(rootName(p), perm&fs.ModePerm))
}

func (r rootFS) Rename(from, to string) experimentalsys.Errno {
	return toErrno(r.root.Rename(rootName(from), rootName(to)))
}

func (r rootFS) Rmdir(p string) experimentalsys.Errno {
	name := rootName(p)
	fi, err := r.root.Lstat(name)
	if err != nil {
		return toErrno(err)
	}
	if !fi.IsDir() {
		return experimentalsys.ENOTDIR
	}
	return toErrno(r.root.Remove(name))
}

func (r rootFS) Unlink(p string) experimentalsys.Errno {
	name := rootName(p)
	fi, err := r.root.Lstat(name)
	if err != nil {
		return toErrno(err)
	}
	if fi.IsDir() {
		return experimentalsys.EISDIR
	}
	return toErrno(r.root.Remove(name))
}

func (r rootFS) Link(oldPath, newPath string) experimentalsys.Errno {
	return toErrno(r.root.Link(rootName(oldPath), rootName(newPath)))
}

// Symlink creates a link; os.Root refuses to follow one that leads out of
// the root, so a guest cannot use links to escape. Absolute targets are
// refused outright, as wazero's directory mounts do.
func (r rootFS) Symlink(oldPath, linkName string) experimentalsys.Errno {
	if path.IsAbs(oldPath) {
		return experimentalsys.EPERM
	}
	return toErrno(r.root.Symlink(oldPath, rootName(linkName)))
}

func (r rootFS) Readlink(p string) (string, experimentalsys.Errno) {
	dst, err := r.root.Readlink(rootName(p))
	if err != nil {
		return "", toErrno(err)
	}
	return dst, 0
}

func (r rootFS) Utimens(p string, atim, mtim int64) experimentalsys.Errno {
	return toErrno(r.root.Chtimes(rootName(p), utime(atim), utime(mtim)))
}

// utime converts a WASI timestamp; the zero time.Time tells Chtimes to
// leave the value as it is.
func utime(ns int64) time.Time {
	if ns == experimentalsys.UTIME_OMIT {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// rootFile is an open file or directory of a rootFS. wazero's fs.FS
// adapter does the reading, seeking, directory listing and writing on the
// *os.File; rootFile adds what fs.FS cannot express, and charges every
// write, and every growth by truncation, to the grant's meter first.
type rootFile struct {
	experimentalsys.File
	f      *os.File // as opened; wazero reopens directories to rewind them
	root   *os.Root
	name   string
	append bool
	meter  *diskMeter // nil: nothing counted (read-only or unlimited)
	// listed, set on the mount's root, records it when it is read.
	listed *mountUse
}

// Readdir lists the directory; listing the mount's root records it.
func (f *rootFile) Readdir(n int) ([]experimentalsys.Dirent, experimentalsys.Errno) {
	f.listed.opened(".")
	return f.File.Readdir(n)
}

// openedFS hands wazero's adapter the file rootFS already opened, and
// reopens the name (read-only, inside the root) when wazero rewinds a
// directory.
type openedFS struct {
	root *os.Root
	file *os.File
}

func (o *openedFS) Open(name string) (fs.File, error) {
	if f := o.file; f != nil {
		o.file = nil
		return f, nil
	}
	return o.root.Open(name)
}

func newRootFile(root *os.Root, name string, f *os.File, appending bool, meter *diskMeter) (*rootFile, experimentalsys.Errno) {
	inner, errno := (&sysfs.AdaptFS{FS: &openedFS{root: root, file: f}}).OpenFile(name, experimentalsys.O_RDONLY, 0)
	if errno != 0 {
		_ = f.Close()
		return nil, errno
	}
	return &rootFile{File: inner, f: f, root: root, name: name, append: appending, meter: meter}, 0
}

func (f *rootFile) Write(buf []byte) (int, experimentalsys.Errno) {
	if f.meter != nil && len(buf) > 0 {
		n := int64(len(buf))
		if !f.append {
			n = growth(f.f, position(f.f), n)
		}
		if errno := f.meter.charge(f.f, n); errno != 0 {
			return 0, errno
		}
	}
	return f.File.Write(buf)
}

func (f *rootFile) Pwrite(buf []byte, off int64) (int, experimentalsys.Errno) {
	if f.meter != nil && len(buf) > 0 {
		if errno := f.meter.charge(f.f, growth(f.f, off, int64(len(buf)))); errno != 0 {
			return 0, errno
		}
	}
	return f.File.Pwrite(buf, off)
}

func (f *rootFile) IsAppend() bool { return f.append }

func (f *rootFile) SetAppend(enable bool) experimentalsys.Errno {
	if enable == f.append {
		return 0
	}
	return experimentalsys.ENOSYS
}

func (f *rootFile) Truncate(size int64) experimentalsys.Errno {
	if isDir, errno := f.IsDir(); errno != 0 || isDir {
		return cmp.Or(errno, experimentalsys.EISDIR)
	}
	if f.meter != nil {
		// Growing a file counts as writing the bytes it gains.
		if errno := f.meter.charge(f.f, growth(f.f, size, 0)); errno != 0 {
			return errno
		}
	}
	return toErrno(f.f.Truncate(size))
}

func (f *rootFile) Sync() experimentalsys.Errno {
	if isDir, errno := f.IsDir(); errno != 0 || isDir {
		return errno
	}
	return toErrno(f.f.Sync())
}

func (f *rootFile) Datasync() experimentalsys.Errno { return f.Sync() }

func (f *rootFile) Utimens(atim, mtim int64) experimentalsys.Errno {
	return toErrno(f.root.Chtimes(f.name, utime(atim), utime(mtim)))
}
