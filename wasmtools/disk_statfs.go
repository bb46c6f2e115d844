//go:build linux || darwin || freebsd

package wasmtools

import (
	"os"
	"syscall"
)

// freeDisk reports the bytes available to an unprivileged user on the
// filesystem holding f.
func freeDisk(f *os.File) (int64, bool) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, false
	}
	var st syscall.Statfs_t
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = syscall.Fstatfs(int(fd), &st) }); err != nil || serr != nil {
		return 0, false
	}
	return int64(uint64(st.Bavail) * uint64(st.Bsize)), true
}
