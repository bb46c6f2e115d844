package wasmtools

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// memoryWatchEvery is how often a compile child's resident memory is
// read. Reading /proc/PID/statm costs some microseconds.
const memoryWatchEvery = 10 * time.Millisecond

// memoryWatch kills a process whose resident memory passes a limit.
type memoryWatch struct {
	quit   chan struct{}
	done   sync.WaitGroup
	killed bool // set before done
}

// newMemoryWatch watches p until stop, killing it if its resident memory
// passes limit bytes.
func newMemoryWatch(p *os.Process, limit int64) *memoryWatch {
	w := &memoryWatch{quit: make(chan struct{})}
	statm := fmt.Sprintf("/proc/%d/statm", p.Pid)
	page := int64(os.Getpagesize())
	w.done.Go(func() {
		tick := time.NewTicker(memoryWatchEvery)
		defer tick.Stop()
		for {
			select {
			case <-w.quit:
				return
			case <-tick.C:
			}
			b, err := os.ReadFile(statm)
			if err != nil {
				return // gone, or no /proc: nothing to watch
			}
			// statm: size resident shared ..., in pages.
			f := bytes.Fields(b)
			if len(f) < 2 {
				return
			}
			res, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err == nil && res*page > limit {
				w.killed = true
				_ = p.Kill()
				return
			}
		}
	})
	return w
}

// stop ends the watch, once the process has been waited for, and
// reports whether it killed the process.
func (w *memoryWatch) stop() bool {
	close(w.quit)
	w.done.Wait()
	return w.killed
}

// maxRSS is the peak resident memory, in bytes, of a process that has
// been waited for; 0 if unknown.
func maxRSS(ps *os.ProcessState) int64 {
	if ps == nil {
		return 0
	}
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		return ru.Maxrss << 10 // KiB on Linux
	}
	return 0
}

// childAttr makes a compile child die with the process that started it,
// so a daemon killed mid-compile leaves no child compiling on.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
