// Package wasmtest builds tiny WebAssembly tool modules by hand for tests
// outside wasmtools: a Go-built tool takes seconds to compile (a minute
// under -race), one of these milliseconds. It imports only the standard
// library.
package wasmtest

import "encoding/binary"

// CannedReactor is the least a keel tool can be: a reactor whose
// keel_alloc hands out the buffer at 1024 and whose keel_call returns
// result, stored at 2048, whatever the input. Its manifest comes from a
// sidecar file.
//
//	(module (memory (export "memory") 1)
//	  (data (i32.const 2048) "<result>")
//	  (func (export "_initialize"))
//	  (func (export "keel_alloc") (param i32) (result i32) (i32.const 1024))
//	  (func (export "keel_call") (param i32 i32) (result i64) (i64.const <2048<<32 | len>)))
func CannedReactor(result string) []byte {
	const (
		secType, secFunc, secMemory, secExport, secCode, secData = 1, 3, 5, 7, 10, 11
		opI32Const, opI64Const, opEnd                            = 0x41, 0x42, 0x0b
		exportFunc, exportMemory                                 = 0x00, 0x02
	)
	vec := func(items ...[]byte) []byte {
		out := leb(len(items))
		for _, it := range items {
			out = append(out, it...)
		}
		return out
	}
	str := func(s string) []byte { return append(leb(len(s)), s...) }
	section := func(id byte, content []byte) []byte {
		return append(append([]byte{id}, leb(len(content))...), content...)
	}
	body := func(code ...byte) []byte {
		b := append([]byte{0x00}, code...) // no locals
		return append(leb(len(b)), b...)
	}
	voidType := []byte{0x60, 0x00, 0x00}
	i32ToI32 := []byte{0x60, 0x01, 0x7f, 0x01, 0x7f}
	i32i32ToI64 := []byte{0x60, 0x02, 0x7f, 0x7f, 0x01, 0x7e}
	out := []byte("\x00asm\x01\x00\x00\x00")
	for _, s := range [][]byte{
		section(secType, vec(voidType, i32ToI32, i32i32ToI64)),
		section(secFunc, vec([]byte{0}, []byte{1}, []byte{2})),
		section(secMemory, vec([]byte{0x00, 0x01})),
		section(secExport, vec(
			append(str("memory"), exportMemory, 0),
			append(str("_initialize"), exportFunc, 0),
			append(str("keel_alloc"), exportFunc, 1),
			append(str("keel_call"), exportFunc, 2))),
		section(secCode, vec(
			body(opEnd),
			body(append(append([]byte{opI32Const}, SLEB(1024)...), opEnd)...),
			body(append(append([]byte{opI64Const}, SLEB(2048<<32|int64(len(result)))...), opEnd)...))),
		section(secData, vec(append(append([]byte{0x00, opI32Const}, SLEB(2048)...), append([]byte{opEnd}, append(leb(len(result)), result...)...)...))),
	} {
		out = append(out, s...)
	}
	return out
}

// leb encodes n as unsigned LEB128.
func leb(n int) []byte { return binary.AppendUvarint(nil, uint64(n)) }

// SLEB encodes v as signed LEB128.
func SLEB(v int64) []byte {
	var out []byte
	for {
		b := byte(v & 0x7f)
		v >>= 7
		if v == 0 && b&0x40 == 0 || v == -1 && b&0x40 != 0 {
			return append(out, b)
		}
		out = append(out, b|0x80)
	}
}
