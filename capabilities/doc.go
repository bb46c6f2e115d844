// Package capabilities describes what this environment declares and what
// can be granted to a tool: filesystem roots (read-only or read-write),
// network destinations, model providers and installed tools. It is pure
// data and matching, with no I/O, so the daemon, the sandbox and a future
// cloud runtime can share one vocabulary. Grants start empty: whatever is
// not granted is denied.
package capabilities
