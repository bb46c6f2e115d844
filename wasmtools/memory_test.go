package wasmtools

import (
	"testing"
	"unsafe"
)

// TestMemoryGrowsByDoubling: a memory grown a page at a time up to
// 16 MiB keeps what was written, gives zeros past it, refuses past its
// limit, and moves (a copy of all it holds) only as often as doubling
// needs: nine times, where growing by append's quarter copied some
// twenty.
func TestMemoryGrowsByDoubling(t *testing.T) {
	t.Parallel()
	const page, limit = 64 << 10, 16 << 20
	m := (&memoryCap{limit: limit}).Allocate(0, 0)
	defer m.Free()
	var moves int
	var last *byte
	for size := uint64(page); size <= limit; size += page {
		buf := m.Reallocate(size)
		if uint64(len(buf)) != size {
			t.Fatalf("Reallocate(%d) has %d bytes", size, len(buf))
		}
		if p := unsafe.SliceData(buf); p != last {
			moves++
			last = p
		}
		for i := size - page; i < size; i += 4096 {
			if buf[i] != 0 {
				t.Fatalf("Reallocate(%d): byte %d of the new page is %d, want 0", size, i, buf[i])
			}
		}
		buf[size-page] = byte(size / page) // the first byte of each page says which page it is
		if buf[0] != 1 || size > page && buf[size-2*page] != byte(size/page-1) {
			t.Fatalf("Reallocate(%d) lost what was written", size)
		}
	}
	if moves > 10 {
		t.Errorf("growing to %d MiB a page at a time moved the memory %d times, want at most 10 (doubling)", limit>>20, moves)
	}
	if buf := m.Reallocate(limit + page); buf != nil {
		t.Errorf("Reallocate past the limit = %d bytes, want nil", len(buf))
	}
}
