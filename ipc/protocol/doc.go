// Package protocol holds keel's wire types: the JSON-RPC 2.0 envelope, the
// method names and their parameters and results, the canonical error
// codes, and the daemon.json discovery file. The server (package ipc),
// the Go client (ipc/client) and docs/protocol.md all follow it; it
// imports nothing of keel but the root vocabulary and capabilities.
package protocol
