// Package builtin carries keel's example tools (examples/tools/*), built
// for wasip1 and embedded gzipped, so a fresh install has tools to call
// without a Go toolchain. [Install] writes them into a tool directory.
//
// The embedded files are generated: after changing an example tool or
// the toolkit, run
//
//	go generate ./wasmtools/builtin
//
// which runs gen.go and records the Go version in embedded/GOVERSION.
// TestEmbeddedUpToDate rebuilds the tools and fails when the embedded
// ones are stale.
package builtin
