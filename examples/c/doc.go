// Package c holds keel tools written in C, built with clang for
// wasm32-wasi against wasi-libc. linecount/linecount.c is a reactor that
// implements the tool ABI of docs/tools.md by hand, without keel's Go
// toolkit. The Go code here is only their test, which builds them with
// the system's clang and runs them in a real wasmtools registry.
package c
