//go:build unix

package wasmtools

import (
	"os"
	"syscall"
)

// inode is fi's inode number: a file replaced by a rename has a new one
// even with the same size and modification time.
func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino)
	}
	return 0
}
