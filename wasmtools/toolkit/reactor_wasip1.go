//go:build wasip1

package toolkit

import (
	"bytes"
	"unsafe"
)

// The exports of a reactor build (go build -buildmode=c-shared); see
// Register. Go's garbage collector does not move objects, so a slice
// kept in a package variable stays where the host was told it is.
var (
	inBuf, result, manifestJSON []byte
)

//go:wasmexport keel_manifest
func keelManifest() uint64 {
	if registered.h == nil {
		return 0 // the host reports that no tool was registered
	}
	manifestJSON = encode(registered.m)
	return pack(manifestJSON)
}

//go:wasmexport keel_alloc
func keelAlloc(size uint32) uint32 {
	if cap(inBuf) < int(size) || cap(inBuf) == 0 {
		inBuf = make([]byte, max(size, 64))
	}
	inBuf = inBuf[:cap(inBuf)]
	return addr(inBuf)
}

//go:wasmexport keel_call
func keelCall(ptr, n uint32) uint64 {
	if registered.h == nil {
		result = encode(errorResult(Errorf("internal", "the tool registered no handler: call toolkit.Register from init")))
		return pack(result)
	}
	if len(inBuf) == 0 || ptr != addr(inBuf) || int(n) > len(inBuf) {
		result = encode(errorResult(Errorf("internal", "keel_call input is not inside the keel_alloc buffer")))
		return pack(result)
	}
	// The handler owns its input, as in a command build.
	result = respond(registered.h, bytes.Clone(inBuf[:n]))
	return pack(result)
}

func addr(b []byte) uint32 { return uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

func pack(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(addr(b))<<32 | uint64(len(b))
}
