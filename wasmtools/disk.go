package wasmtools

import (
	"fmt"
	"io"
	"os"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
)

// Defaults for the disk limits of Config.
const (
	DefaultWriteQuotaBytes  = 1 << 30
	DefaultMinFreeDiskBytes = 1 << 30
)

// diskMeter counts what one instance writes through one read-write grant
// and refuses a write that would pass the quota or leave less free disk
// than the floor. Registry.Call reads and resets it after each call, so
// the quota is per call. An instance serves one call at a time and its
// guest writes from the goroutine running that call; the pool hands an
// instance from call to call under a lock. So no lock is needed here.
type diskMeter struct {
	guest string // the grant's guest path, for the message
	quota int64  // < 0: no quota
	floor int64  // < 0: no floor
	used  int64
	// refused is the first write refused since the last reset.
	refused *DiskLimitError
}

// DiskLimitError describes a write refused by a disk limit: it would
// have taken the bytes a call wrote through one read-write grant past
// Quota, or left less than Floor bytes free on the host filesystem. A
// call with such a refusal fails with resource_exhausted, whatever the
// tool made of the refused write.
type DiskLimitError struct {
	GuestPath string
	Quota     int64 // set when the quota refused the write
	Floor     int64 // set when the free-disk floor refused it
}

func (e *DiskLimitError) Error() string {
	if e.Floor > 0 {
		return fmt.Sprintf("a write to %s would leave less than the %d bytes of free disk the host keeps (Config.MinFreeDiskBytes)", e.GuestPath, e.Floor)
	}
	return fmt.Sprintf("tool wrote more than its quota of %d bytes per call to %s (Config.WriteQuotaBytes)", e.Quota, e.GuestPath)
}

// charge accounts for n more bytes on the disk holding f, refusing them
// (with EIO, what a failed write gets; WASI in wazero has no ENOSPC) if a
// limit would be passed. A nil meter charges nothing.
func (m *diskMeter) charge(f *os.File, n int64) experimentalsys.Errno {
	if m == nil || n <= 0 {
		return 0
	}
	if m.quota >= 0 && m.used+n > m.quota {
		return m.refuse(&DiskLimitError{GuestPath: m.guest, Quota: m.quota})
	}
	if m.floor >= 0 {
		if free, ok := freeDisk(f); ok && free-n < m.floor {
			return m.refuse(&DiskLimitError{GuestPath: m.guest, Floor: m.floor})
		}
	}
	m.used += n
	return 0
}

func (m *diskMeter) refuse(e *DiskLimitError) experimentalsys.Errno {
	if m.refused == nil {
		m.refused = e
	}
	return experimentalsys.EIO
}

// diskUse is the meters of one instance, one per read-write grant.
type diskUse []*diskMeter

// refusal returns the first write refused since the last reset, nil if
// none.
func (d diskUse) refusal() *DiskLimitError {
	for _, m := range d {
		if m.refused != nil {
			return m.refused
		}
	}
	return nil
}

// reset starts the next call's count.
func (d diskUse) reset() {
	for _, m := range d {
		m.used, m.refused = 0, nil
	}
}

// growth is how many bytes writing n bytes at offset off adds to the
// disk use of f: the bytes written, plus the gap a write past the end of
// the file leaves. Overwritten bytes count too: the quota bounds what a
// call writes, not only what it adds.
func growth(f *os.File, off, n int64) int64 {
	fi, err := f.Stat()
	if err != nil {
		return n
	}
	return n + max(0, off-fi.Size())
}

// position is f's offset, where the next write lands (for a file opened
// to append, its end, which adds no gap).
func position(f *os.File) int64 {
	off, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return 0
	}
	return off
}
