// Package ipc is keel's loopback WebSocket JSON-RPC 2.0 server: the one
// way clients (the CLI, IDE extensions, browser UIs) talk to a daemon.
//
// It owns the transport and its security (bearer token, Origin and Host
// checks made before the upgrade, a frame size limit; the web console's
// one-time login codes and session cookies, valid only from the daemon's
// own origin; per-client tokens with scopes and origin patterns, and
// which scope each method needs; the status endpoint a page reads), the
// method table,
// the mapping of keel's errors to the canonical error codes of package
// protocol, and one bounded outbound queue per client, so that a slow
// client is dropped instead of stalling the engine.
//
// The server reaches the rest of keel only through Services: small
// interfaces it defines, one per group of methods (Runs, History, Tools,
// Models, ...), each served directly by the package that owns the thing
// (the engine, the store, the tool runtime) and put together by the
// daemon; a nil group is not served. The wire types live
// in ipc/protocol and the protocol is specified in docs/protocol.md.
//
// The same server fronts the cloud (cloud/gateway): on a TLS listener,
// reached by the Host names of Config.AllowedHosts, one Server per tenant
// behind one listener (Server.Handler).
package ipc
