package capabilities

import "github.com/keel-runtime/keel"

// The tools of an environment as the protocol shows and changes them
// (ipc/protocol aliases these types): what a tool requests, what it was
// granted, and the requests that install and grant.

// ToolInfo is a tool as tools.list shows it: what its manifest requests
// and what the user granted.
type ToolInfo struct {
	keel.ToolSpec
	Requests Grants `json:"requests"`
	Grants   Grants `json:"grants"`
	// Labels are the labels the tool's manifest declares its output
	// carries, whatever it reads (sorted; none: omitted). A call's result
	// carries them, besides those of the grants it read through.
	Labels []string `json:"labels,omitempty"`
	SHA256 string   `json:"sha256,omitempty"` // of the .wasm file
	// GrantDigest is what the tool's grants are bound to: SHA256 when it
	// has no sidecar manifest, else a digest over SHA256 and the
	// sidecar's bytes, so a new sidecar beside the same module is another
	// tool for grants.
	GrantDigest string `json:"grant_digest,omitempty"`
	// Compiling is set, while the daemon compiles the tools it found at
	// start, for a tool listed from what the last start recorded of its
	// unchanged file: a call of it waits until it has compiled.
	Compiling bool `json:"compiling,omitempty"`
	// PendingGrants is set when the user granted this tool's name
	// something while it was another module or manifest (another
	// GrantDigest): grants belong to a module and its manifest, so this
	// one has none of them until the user confirms them (tools.grant with
	// confirm set to GrantDigest).
	PendingGrants *PendingGrants `json:"pending_grants,omitempty"`
	// Provenance says where a tool that is not installed comes from:
	// "mcp:SERVER/TOOL" for the tool TOOL of the MCP server SERVER
	// (docs/bridges.md). Empty for an installed tool.
	Provenance string `json:"provenance,omitempty"`
}

// InstallRequest installs a .wasm file and grants it what the user
// chose (a subset of what it requests; nothing is granted by default).
type InstallRequest struct {
	Path    string `json:"path"`
	Grants  Grants `json:"grants"`
	Replace bool   `json:"replace,omitempty"` // replace an installed tool of the same name
	// KeepGrants, with Replace, carries the replaced tool's grants to the
	// new module (those it still requests), besides Grants. Without it
	// the new module gets Grants only: grants belong to a module.
	KeepGrants bool `json:"keep_grants,omitempty"`
}

// GrantRequest adds grants to an installed tool, bound to its
// installed module. Confirm, set to the installed tool's GrantDigest, also
// carries its pending grants (ToolInfo.PendingGrants) to it; Grants may
// then be empty.
type GrantRequest struct {
	Name    string `json:"name"`
	Grants  Grants `json:"grants"`
	Confirm string `json:"confirm,omitempty"`
}

// RevokeRequest removes grants from a tool: those listed, or all.
type RevokeRequest struct {
	Name   string `json:"name"`
	Grants Grants `json:"grants"`
	All    bool   `json:"all,omitempty"`
}

// BoundGrants are grants bound to the module they were given to: SHA256
// is its grant digest (the SHA-256 of its .wasm file, covering its
// sidecar manifest when it has one).
type BoundGrants struct {
	SHA256 string `json:"sha256"`
	Grants Grants `json:"grants"`
}
