// Package mcpserver serves keel's installed tools to Model Context
// Protocol clients (editors, desktop assistants, agents) with the
// official Go SDK (github.com/modelcontextprotocol/go-sdk).
//
// It is an adapter over one small interface, Tools: list the installed
// tools, call one, hear when they change. The daemon gives it the tool
// runtime's own (the same direct call as keel's tools.call, so grants,
// limits, the policy's egress rules and the audit trail apply
// unchanged), each call first decided by the policy as a tool action,
// and serves it at /mcp over streamable HTTP, behind the same token,
// Origin and Host checks as its WebSocket. `keel mcp` serves the same
// server on stdin/stdout: Relay passes each message, unchanged, to the
// daemon's /mcp and its answers back. In both, the daemon makes every
// decision: this package holds no tool, grant or policy of its own,
// only the translation.
//
// What it translates:
//
//   - each keel.ToolSpec is an MCP tool: its input schema is the
//     inputSchema, its output schema (an object's) the outputSchema,
//     and its side-effect class the annotations (see Annotations);
//   - a call's output is the result's text content, and its
//     structuredContent when it is a JSON object;
//   - a keel tool error (keel.ToolError: invalid input, permission
//     denied, policy denied, timeout, ...) is a result with isError and
//     the error as text and in _meta["keel/error"] ({"code", "message",
//     "path"});
//   - an `ask` of the policy about a call becomes an MCP elicitation
//     (form mode, an empty form: accept or decline) showing the tool,
//     the exact arguments and their SHA-256, when the client declared
//     the elicitation capability (Call.Approve): accept runs that call
//     once, decline refuses it (denied); a client that cannot be asked
//     gets a policy_denied error that says so. Over HTTP the question
//     goes on the session's notification stream (GET), which it waits
//     for (HTTPConfig.StreamWait): responses are single JSON bodies;
//   - every change of the installed tools (install, remove, hot
//     reload, grants) becomes notifications/tools/list_changed;
//   - the audit record of each call names the client as it declared
//     itself in initialize: "mcp:" + clientInfo.name.
//
// Over HTTP a caller needs keel's scopes as for the protocol's methods:
// read for tools/list, run for tools/call (docs/protocol.md).
package mcpserver
