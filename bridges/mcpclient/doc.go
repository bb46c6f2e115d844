// Package mcpclient makes external MCP servers (Model Context Protocol)
// tool sources for keel, with the official Go SDK
// (github.com/modelcontextprotocol/go-sdk) as the client.
//
// The user declares servers in mcp.json in the data directory (package
// mcpfile;
// `keel mcp add`, `keel mcp remove`): a streamable HTTP server by URL
// (with headers), or a stdio server by command. A stdio server is a
// native process, outside keel's WebAssembly sandbox, with the user's own
// permissions: it runs only with an explicit native grant bound to its
// command and environment (mcpfile.ServerConfig.NativeGrant, mcpfile.NativeDigest); any
// change to either needs a new grant. An HTTP server's calls are an
// egress to its URL, decided by the policy like a sandboxed tool's
// requests (keel.ToolInvocation.Egress).
//
// A Manager owns one goroutine per server, which owns its connection:
// it connects (bounded by Config.ConnectTimeout), lists the tools,
// refreshes them on notifications/tools/list_changed, and when the
// connection ends reconnects with a backoff doubling from
// Config.MinBackoff to Config.MaxBackoff. A call of a server that is not
// connected fails at once (crashed), a call whose connection ends under
// it fails when it ends (crashed: it may or may not have taken effect),
// and every call is bounded by the server's timeout (timeout_seconds,
// Config.CallTimeout): a server never hangs a run, and its failures are
// tool errors, never the daemon's.
//
// What it translates:
//
//   - each tool of server S named T is the keel tool "mcp-S-T"
//     (mcpfile.ToolName): installed tools have no '-' in their names, so the
//     two never collide, and models' function names accept it. Its
//     provenance, in tools.list, is "mcp:S/T" (mcpfile.Provenance);
//   - the tool's input schema is its keel input schema, and the
//     arguments of a call are checked against it before anything is
//     sent (invalid_input, with the JSON pointer of the failing field);
//   - its annotations are its side-effect class (Class): readOnlyHint
//     read_only, idempotentHint idempotent_write, otherwise
//     non_idempotent_write, or external when openWorldHint is true or
//     the tool has no annotations at all: the engine asks a person
//     before running such a call again after a crash;
//   - a result is its structuredContent, or {"text": ...} for text, or
//     {"content": [...]}; an error result is a tool_error;
//   - every call runs between Config.Interceptors (the audit trail:
//     the record names the tool, the server's name and version, and its
//     URL or command as the grant), and its result carries the server's
//     labels (mcpfile.ServerConfig.Labels) as a sandboxed tool's carries its
//     grants'.
//
// RunTools and ListedTools put the servers' tools beside the sandbox's
// for the engine and for the protocol's tools.list and tools.call.
package mcpclient
