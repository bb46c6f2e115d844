// Package client is the Go client of the keel protocol, used by the CLI,
// the examples and the end-to-end tests. It finds a running daemon
// through its data directory (DialDataDir), makes JSON-RPC calls over one
// WebSocket and delivers run.event notifications on a channel (Events).
//
// Every method of the protocol is a typed Method (RunStart, ToolsList,
// ...) called with Do, or DoStream for a method that streams
// notifications; Client's methods (StartRun, GetRun, ...) are shorthands
// for the common calls. Call takes a method by name with untyped params.
//
// It depends only on keel's root vocabulary, the wire types of
// ipc/protocol and the data directory's layout (ipc/datadir);
// docs/protocol.md describes what goes over the wire.
package client
