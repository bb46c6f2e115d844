// Package client is the Go client of the keel protocol, used by the CLI,
// the examples and the end-to-end tests. It finds a running daemon
// through its data directory (DialDataDir), makes JSON-RPC calls over one
// WebSocket (Call and typed helpers such as StartRun) and delivers
// run.event notifications on a channel (Events).
//
// It depends only on keel's root vocabulary and the wire types of
// ipc/protocol; docs/protocol.md describes what goes over the wire.
package client
