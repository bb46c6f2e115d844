//go:build !linux

package wasmtools

import (
	"os"
	"syscall"
)

// memoryWatch would kill a process whose resident memory passes a limit;
// outside Linux it only lets the child's soft limit work.
type memoryWatch struct{}

func newMemoryWatch(*os.Process, int64) *memoryWatch { return &memoryWatch{} }

func (*memoryWatch) stop() bool { return false }

// maxRSS is unknown outside Linux.
func maxRSS(*os.ProcessState) int64 { return 0 }

// childAttr is nil outside Linux: a child outlives a killed daemon until
// its compile ends.
func childAttr() *syscall.SysProcAttr { return nil }
