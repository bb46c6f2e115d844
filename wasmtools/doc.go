// Package wasmtools is keel's tool sandbox. A tool is a WebAssembly
// module (for example Go built with GOOS=wasip1 GOARCH=wasm) run under
// wazero; it sees its own memory, the clocks, randomness and whatever its
// grants give it, and nothing else. [Open] loads a directory of tools
// into a [Registry]; [Registry.Call] runs one call, on a pooled instance
// of a reactor tool or a fresh instance of a command, between the hooks
// of [Config.Interceptors] (package intercept: the audit trail, then
// policy and telemetry), which see who calls (a keel.ToolInvocation) and
// how the call ended. Package toolkit is the author's side of the convention below,
// and package builtin carries the example tools.
//
// # Tool convention
//
// A tool is a file NAME.wasm, where NAME matches ^[a-z][a-z0-9_]{0,63}$.
//
// Manifest. Started with argv [NAME, "--manifest"], the module prints its
// manifest as one JSON object to stdout and exits 0. A sidecar file
// NAME.manifest.json beside NAME.wasm, if present, is used instead, for
// modules from toolchains that cannot easily do that. Fields:
//
//	name           must equal NAME
//	version        free text, optional
//	description    required; written for a model choosing a tool
//	input_schema   required JSON Schema (draft 2020-12 by default)
//	output_schema  optional JSON Schema; enforced on every result
//	side_effects   read_only | idempotent_write | non_idempotent_write | external
//	requests       {"fs": [{"guest_path": "/workspace", "read_only": true}],
//	                "network": ["scheme://host:port"], "env": ["NAME"]}
//
// A top-level string property of input_schema with "format": "path" (keel's
// own format; validation ignores it) names a file, one with "format": "uri"
// or "uri-reference" a URL: the policy's path and url rules match those
// arguments (RunTools.CallTargets). A relative path is relative to the
// guest path of the first fs request, and a path rule sees the host path
// the tool's grant maps it to.
//
// Unknown fields are errors. Schemas must be self-contained: a $ref to
// another document is refused, so a manifest cannot make the host read
// files or fetch URLs.
//
//	isolation      "pooled" (default) or "fresh"; see Reactors below
//	labels         optional labels every result carries, whatever the
//	               tool reads (keel.CheckLabel names); see
//	               What a call touched below
//
// requests may also hold "limits": {"timeout_ms", "memory_mib",
// "output_bytes", "write_quota_bytes"}, the tool's own call limits (see
// Sandbox).
//
// Call. The module is started with argv [NAME], the input JSON on stdin
// and no environment but what is granted. It writes exactly one JSON
// object to stdout, {"output": value} or {"error": {"message": "...",
// "code": "..."}}, and exits 0 either way. Anything else (stdout that is
// not such an object, a non-zero exit, a trap) is a crash. stderr is kept
// for the log only.
//
// # Reactors
//
// A module that exports _initialize, keel_alloc and keel_call is a
// reactor (Go: go build -buildmode=c-shared with toolkit.Register; the
// bundled examples are built so). keel runs _initialize once per
// instance, then calls the same instance many times: keel_alloc(len)
// returns a buffer for the input (valid until the next keel_alloc),
// keel_call(ptr, len) returns the result object as ptr<<32|len. Its
// manifest comes from keel_manifest(), returning ptr<<32|len, unless a
// sidecar is present. Initialized instances are kept in a bounded pool
// per tool ([Config.MaxIdleInstances]), each closed once it has been idle
// for [Config.IdleInstanceTimeout], so a warm call pays neither
// instantiation nor the guest runtime's start-up. An instance goes back
// to the pool only after a clean call or the tool's own error; after a
// timeout, trap, exit, memory or output limit, or a malformed result it
// is closed. A manifest with "isolation": "fresh" gets a new instance for
// every call, so no state survives from one call to the next; with
// pooled isolation, package variables do. What a reactor writes to
// stdout counts toward the output limit and is otherwise dropped.
//
// # Sandbox
//
// Only WASI (wasi_snapshot_preview1) and the keel host module's
// http_request/http_response are offered: a module importing any other
// host function is not loaded. A tool must export its memory as
// "memory", and _start (a command) or the reactor exports; export names
// beginning with "keel." are reserved.
//
// Grants come from [Config.GrantsFor] (or the fixed [Config.Grants]) and
// nothing else: a tool without grants gets no directory, no environment
// variable and no network. GrantsFor is asked with the tool's name and
// its grant digest ([Tool.GrantDigest], [GrantDigest]), so grants can
// belong to one module and manifest: the SHA-256 of its file when it has
// no sidecar, else a SHA-256 over that digest and the sidecar's bytes. The
// sidecar says what the tool is (its side effects, which decide approval)
// and what it requests, so a new sidecar beside the same module is
// another tool for grants; [Tool.SHA256] stays the file's own digest,
// which the audit records and the compilation cache is keyed by. Each
// granted directory is mounted exactly as
// configured. Mounts go through os.Root, which keeps every path, and
// every symbolic link, inside the granted host directory; wazero's own
// directory mounts follow links out of the mount
// (https://github.com/wazero/wazero/issues/2321). A call whose manifest
// requests a directory or environment variable that was not granted, or
// network access with no destination granted, fails with
// permission_denied before the tool starts.
//
// The network is reached only through http_request (netcap.go): each
// request, and each redirect, must match a granted scheme://host:port
// pattern, and the dialer refuses loopback, private and link-local
// addresses after DNS resolution unless [Config.AllowPrivateNetwork]. A
// refused request fails the whole call with permission_denied naming the
// destination, whatever the tool does with the refusal.
// A caller's egress check (keel.ToolInvocation.Egress) is asked about
// each request and redirect the grants allow, and may refuse it the same
// way.
//
// A read-write grant has a disk quota: a write that would take what one
// call wrote (and added to files by truncating or writing past their
// end) through that grant past [Config.WriteQuotaBytes], or leave less
// than [Config.MinFreeDiskBytes] free on the host filesystem, is refused
// and the call fails with resource_exhausted (disk.go).
//
// Each call runs with its own limits: a deadline
// ([Config.CallTimeout]; it stops the guest even in an endless loop,
// through an interrupt keel adds to every module before compiling it, see
// instrument in interrupt.go; guest sleeps and host calls end with the
// context; a start section runs under it too, see instrument), a
// memory cap ([Config.MemoryLimitMiB]) and a stdout cap
// ([Config.MaxOutputBytes]). The memory cap is enforced by a per-instance
// allocator rather than wazero's runtime-wide page limit, because the
// allocator can tell that a grow was refused: a guest that dies after
// hitting the cap is reported as resource_exhausted, not as a crash.
// Those, and the write quota, are the defaults: a manifest's
// requests.limits may lower any of them for its tool, or raise it as far
// as the tool's grants' Limits allow; a raise not granted leaves the tool
// listed, its calls denied with permission_denied (limits.go,
// resolveLimits). docs/tools.md documents the tool ABI for any language.
//
// Every allocation a guest controls is bounded. The cap covers linear
// memory and table entries together, each entry counted at 8 bytes
// (wazero keeps a table as a slice of uintptr): a module whose initial
// memory and tables exceed it is not loaded, and a table.grow past it is
// refused before wazero allocates anything (the rewrite in interrupt.go
// turns each table.grow into a checked call). table.fill, table.copy and
// table.init stay within a table's size. Globals are declared in the
// module, so their number is bounded by its size (and by 2^20). The call
// stack of wasm frames is bounded by wazero, not by the cap: it grows to
// at most about 100 MB, and a pooled instance keeps the stack its
// deepest call grew. Overflowing it is resource_exhausted (see Call).
//
// # What a call touched
//
// A caller that sets keel.ToolInvocation.Touched learns what the call
// reached (touched.go): the host paths it opened through its grants,
// resolved as os.Root resolved them (symbolic links followed, beneath the
// grant's host directory, itself resolved), deduplicated in first-open
// order and capped at keel.MaxTouchedPaths; the host:port of every
// network request it made or tried; and labels: those of each grant it
// opened a file through (capabilities.FSGrant.Labels, and "private") with
// those its manifest declares. A mount's root is recorded when the tool
// lists it, not when it is opened, because wazero opens each root itself
// to tell the guest which directories it has.
//
// Mounts are made once per instance, and a pooled instance serves call
// after call, so the recording cannot live in the mounts: they share a
// per-instance record (fsUse) that the call running on the instance
// points at its own recorder while the guest runs, and clears before the
// instance goes back to the pool. An instance serves one call at a time
// on one goroutine, so calls of one tool on different instances never
// see each other's paths, and a call that asks for nothing pays a nil
// check per open. Which grants an instance ever opened files through is
// kept for its life, initialization included: a reactor may keep what a
// call read in its memory and return it later, so every later call on
// the instance carries those grants' labels. A tool with fresh isolation
// carries only its own call's.
//
// keel.ToolInvocation.Egress, when set, is asked before each request and
// each redirect the grants allow (netcap.go); a refusal is what the
// guest sees for an ungranted destination, a permission_denied network
// error, with the check's reason, and fails the call as a denial does
// (with the check's code when its error is a *keel.ToolError).
//
// # Errors
//
// [Registry.Call] returns only *keel.ToolError values; its documentation
// lists the codes. [Open] logs and skips a file that cannot be loaded
// (not WebAssembly, unknown imports, bad manifest, name mismatch) and
// fails only when the configuration itself is unusable. [Registry.Inspect]
// returns why: an error that is the file's fault matches
// keel.ErrUnusableTool, and one about a feature keel cannot bound (tail
// calls, threads, exception handling, several memories) carries an
// [*UnsupportedError] naming it.
//
// A Registry is safe for concurrent use. [Config.CacheDir] keeps
// compiled code on disk between runs, which matters because a Go module
// takes seconds to compile. With it, a tool not called for
// [Config.IdleToolTimeout] releases its compiled module (tens of MiB for
// a Go tool) and keeps only its description, manifest and grants, as a
// tool listed before it has loaded; the next call loads the module
// again from the cache, by the digest the tool was loaded with (see
// unload.go). Listing, grants and Reload do not see the difference, and
// a call never loses the module it runs on.
//
// # Compiling out of process
//
// Compiling a Go module takes wazero's compiler hundreds of MiB. With
// [Config.Compiler] (and a CacheDir), each tool file is compiled and
// inspected by a short-lived child process instead, one at a time: a
// program whose main calls [CompileChildMain] when [IsCompileChild]
// (keel's own binary), which builds the same runtime as the registry,
// writes the compiled code to the cache and replies with what it found.
// The tool then starts unloaded and its first call loads it from the
// cache, so the registry's process never holds a compile, and a compiler
// that crashes or blows up on a hostile module takes down only the
// child: the load fails with a [*CompileError] ([ErrCompileCrashed],
// [ErrCompileOutOfMemory], [ErrCompileTimeout]) and the other tools are
// served on. See compiler.go.
//
// # Serving the rest of keel
//
// [Admin] installs, grants, revokes, lists and calls tools, and serves
// the protocol's tool methods directly (ipc.Tools, ipc.ToolAdmin); it
// keeps grants through [GrantStore], which the store implements, and
// checks them against what a manifest requests ([CheckGrants]).
// [Registry.RunTools] is the registry as the engine runs it. Every call,
// from either, enters at [Registry.Call], where the interceptors see it.
package wasmtools
