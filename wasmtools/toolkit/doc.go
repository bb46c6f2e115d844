// Package toolkit is the tool-author kit for keel tools: a keel tool is a
// WebAssembly module (Go built with GOOS=wasip1 GOARCH=wasm) that
// registers its [Manifest] and a handler with [Register] from init, and
// whose main calls [Main] with the same two.
//
// Built with -buildmode=c-shared the module is a reactor: keel starts it
// once and calls the registered handler many times on the same instance
// (see [Register] for the exports), which makes a warm call much cheaper
// than starting the Go runtime per call. Built without it, the module is
// a command and [Main] serves it.
//
// As a command, [Main] speaks the keel tool convention, so the handler only deals with
// its own input and output:
//
//   - argv [name, "--manifest"]: print the manifest as JSON and exit 0.
//   - argv [name]: read the input JSON from stdin, call the handler and
//     write exactly one JSON object to stdout, {"output": value} or
//     {"error": {"message": "...", "code": "..."}}, then exit 0.
//
// The host validates the input against the manifest's input schema before
// the tool starts, so a handler sees only input that matches it. The
// manifest also says what the policy sees of the tool: its side effects,
// which arguments are files or URLs (a string marked "format": "path",
// "uri" or "uri-reference" in the input schema, top-level or nested),
// and the labels its output carries ([Manifest].Labels, such as "pii"),
// which follow the data through the run (docs/policy.md). The
// package needs the standard library only, nothing else of keel or its dependencies, and compiles for every GOOS,
// which keeps handlers testable with a plain go test.
//
// A tool in its own module gets it with
//
//	go get github.com/keel-runtime/keel/wasmtools/toolkit@latest
//
// (no replace directive; TestConsumeFromAnotherModule checks that path).
package toolkit
