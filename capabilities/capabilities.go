package capabilities

import (
	"path"
	"slices"
	"strings"
	"time"

	"github.com/keel-runtime/keel"
)

// FSGrant gives a tool one directory of the host. The tool sees it at
// GuestPath; nothing outside HostPath is reachable through it.
type FSGrant struct {
	HostPath  string `json:"host_path"`
	GuestPath string `json:"guest_path"`
	ReadOnly  bool   `json:"read_only"`
	// Private marks what lies in the directory as private: a run whose
	// context holds the output of a tool with such a grant is treated as
	// a private run from that step on (nothing of it reaches a cloud
	// model). It is the label "private" (keel.LabelPrivate): Labels of a
	// checked grant never hold "private", which sets Private instead.
	// Default false.
	Private bool `json:"private,omitempty"`
	// Labels are the labels the user gives what lies in the directory
	// (docs/policy.md, Labels): "pii", "secret", or names of their own
	// (keel.CheckLabel). A tool call that opens a file through the grant
	// carries them (keel.Touched.Labels). Sorted, without duplicates, once
	// checked; nil: none but Private.
	Labels []string `json:"labels,omitempty"`
}

// Modes names what f allows, in the short words grant listings use:
// "ro" or "rw", then "private" if f is Private, then "label:NAME" for
// each of its Labels. Callers join them with their own separator
// ("rw+private+label:pii", "rw, private, label:pii").
func (f FSGrant) Modes() []string {
	mode := "rw"
	if f.ReadOnly {
		mode = "ro"
	}
	out := []string{mode}
	if f.Private {
		out = append(out, keel.LabelPrivate)
	}
	for _, l := range f.Labels {
		out = append(out, "label:"+l)
	}
	return out
}

// AllLabels returns the labels of what lies in f's directory: its Labels
// and "private" if it is Private, sorted without duplicates. The result
// is a new slice (nil when there are none).
func (f FSGrant) AllLabels() []string {
	if f.Private {
		return keel.UnionLabels(f.Labels, []string{keel.LabelPrivate})
	}
	return keel.UnionLabels(f.Labels, nil)
}

// Equal reports whether f and o grant the same directory the same way.
func (f FSGrant) Equal(o FSGrant) bool {
	return f.HostPath == o.HostPath && f.GuestPath == o.GuestPath && f.ReadOnly == o.ReadOnly &&
		f.Private == o.Private && slices.Equal(f.Labels, o.Labels)
}

// WithLabels returns f with labels added (checked with keel.CheckLabel):
// "private" sets Private, the others join Labels, sorted without
// duplicates. f is not modified.
func (f FSGrant) WithLabels(labels ...string) (FSGrant, error) {
	var more []string
	for _, l := range append(slices.Clone(f.Labels), labels...) {
		if err := keel.CheckLabel(l); err != nil {
			return f, err
		}
		if l == keel.LabelPrivate {
			f.Private = true
			continue
		}
		more = append(more, l)
	}
	f.Labels = keel.UnionLabels(more, nil)
	return f, nil
}

// Grants is everything a tool may touch beyond its own memory, the clock
// and randomness. The zero value grants nothing.
type Grants struct {
	FS      []FSGrant `json:"fs,omitempty"`
	Network []string  `json:"network,omitempty"` // scheme://host:port patterns
	Env     []string  `json:"env,omitempty"`     // names of environment values
	// Limits are per-call limits: in a manifest's requests, what the tool
	// asks for; in grants, the most the user allows above the defaults.
	Limits Limits `json:"limits,omitzero"`
}

// Empty reports whether g grants nothing.
func (g Grants) Empty() bool {
	return len(g.FS) == 0 && len(g.Network) == 0 && len(g.Env) == 0 && g.Limits == Limits{}
}

// Add returns g with more added: network and environment entries not yet
// present, filesystem grants that replace any grant of the same guest
// path, and the limits more sets replacing g's. g is not modified.
func (g Grants) Add(more Grants) Grants {
	out := Grants{FS: cloneFS(g.FS), Network: slices.Clone(g.Network), Env: slices.Clone(g.Env), Limits: g.Limits.Add(more.Limits)}
	for _, f := range more.FS {
		out.FS = slices.DeleteFunc(out.FS, func(e FSGrant) bool { return e.GuestPath == f.GuestPath })
		f.Labels = slices.Clone(f.Labels)
		out.FS = append(out.FS, f)
	}
	for _, n := range more.Network {
		if !slices.Contains(out.Network, n) {
			out.Network = append(out.Network, n)
		}
	}
	for _, e := range more.Env {
		if !slices.Contains(out.Env, e) {
			out.Env = append(out.Env, e)
		}
	}
	return out
}

// cloneFS copies fs deeply enough that no Labels slice is shared.
func cloneFS(fs []FSGrant) []FSGrant {
	out := slices.Clone(fs)
	for i := range out {
		out[i].Labels = slices.Clone(out[i].Labels)
	}
	return out
}

// Clone returns a copy of g that shares no slice with it.
func (g Grants) Clone() Grants {
	return Grants{FS: cloneFS(g.FS), Network: slices.Clone(g.Network), Env: slices.Clone(g.Env), Limits: g.Limits}
}

// HasPrivate reports whether g grants a directory marked private.
func (g Grants) HasPrivate() bool {
	return slices.ContainsFunc(g.FS, func(f FSGrant) bool { return f.Private || slices.Contains(f.Labels, keel.LabelPrivate) })
}

// Equal reports whether g and o grant exactly the same things, in the
// same order.
func (g Grants) Equal(o Grants) bool {
	return slices.EqualFunc(g.FS, o.FS, FSGrant.Equal) && slices.Equal(g.Network, o.Network) &&
		slices.Equal(g.Env, o.Env) && g.Limits == o.Limits
}

// GuestPathAllowed reports whether a guest path lies inside a granted
// root and, if so, whether it may be written. The path is cleaned first,
// so ".." cannot climb out of a root.
func (g Grants) GuestPathAllowed(p string) (allowed, writable bool) {
	clean := path.Clean("/" + p)
	for _, fs := range g.FS {
		root := path.Clean("/" + fs.GuestPath)
		if clean == root || root == "/" || strings.HasPrefix(clean, root+"/") {
			allowed = true
			if !fs.ReadOnly {
				writable = true
			}
		}
	}
	return allowed, writable
}

// ModelDecl is one model an environment offers.
type ModelDecl struct {
	Name          string   `json:"name"`
	Capabilities  []string `json:"capabilities"`
	ContextLength int      `json:"context_length"`
}

// ProviderDecl is one model provider and whether it answered.
type ProviderDecl struct {
	Name      string      `json:"name"`
	Kind      string      `json:"kind"` // "local" or "cloud"
	Endpoint  string      `json:"endpoint"`
	Reachable bool        `json:"reachable"`
	Error     string      `json:"error,omitempty"`
	Hint      string      `json:"hint,omitempty"` // what to do when unreachable
	Models    []ModelDecl `json:"models,omitempty"`
}

// ToolDecl is one installed tool and what it was granted.
type ToolDecl struct {
	Name        string `json:"name"`
	Version     string `json:"version,omitempty"`
	SideEffects string `json:"side_effects"`
	SHA256      string `json:"sha256,omitempty"` // of the .wasm file
	// GrantDigest is what grants are bound to: SHA256, or a digest over it
	// and the sidecar manifest when the tool has one.
	GrantDigest string `json:"grant_digest,omitempty"`
	Grants      Grants `json:"grants"`
	// PendingGrants is set when the tool's name was granted something
	// while it was another module or manifest: see PendingGrants.
	PendingGrants *PendingGrants `json:"pending_grants,omitempty"`
}

// PendingGrants are grants the user gave an earlier module of a tool's
// name. Grants belong to a module and its manifest (the grant digest: the
// SHA-256 of its file, covering its sidecar manifest if any): a tool of
// another digest gets none of them until the user confirms.
type PendingGrants = BoundGrants

// Environment is what a runtime declares about itself: its model
// providers, tools, grants and network stance. A client reads it to learn
// what it can ask for.
type Environment struct {
	Runtime      string         `json:"runtime"` // "keel"
	Version      string         `json:"version"`
	Protocol     string         `json:"protocol"`
	DataDir      string         `json:"data_dir,omitempty"`
	URL          string         `json:"url,omitempty"`
	DefaultModel string         `json:"default_model,omitempty"`
	Providers    []ProviderDecl `json:"providers"`
	Tools        []ToolDecl     `json:"tools"`
	// ToolsCompiling counts the tool files found at start that are still
	// being compiled (not yet in Tools); 0 once every one is loaded.
	ToolsCompiling int `json:"tools_compiling,omitempty"`
	// Network is the daemon's own stance: "loopback" unless configured.
	Network string `json:"network"`
	// AllowCloud is the models configuration's master switch for cloud
	// providers (allow_cloud in models.json). Even when it is on, only a
	// run that asks for cloud models and holds nothing private gets one.
	AllowCloud bool `json:"allow_cloud"`
	// RequireApproval lists the side-effect classes ("external",
	// "non_idempotent_write", ...) whose tool calls wait for a person's
	// approval; empty: none do.
	RequireApproval []string `json:"require_approval"`
	// ToolLimits are the sandbox's limits on every tool call.
	ToolLimits ToolLimits `json:"tool_limits"`
	// Policy is the policy in force (docs/policy.md), when the runtime
	// has one.
	Policy *PolicyState `json:"policy,omitempty"`
	// Telemetry is the state of the trace export and the metrics
	// endpoint (docs/observability.md), when the runtime has them.
	Telemetry *TelemetryState `json:"telemetry,omitempty"`
	// MCPServers are the MCP servers keel is a client of (mcp.json in the
	// data directory, docs/bridges.md), with their state.
	MCPServers []MCPServerDecl `json:"mcp_servers,omitempty"`
}

// MCPServerDecl declares an MCP server keel uses as a tool source. Its
// headers (credentials) are never declared.
type MCPServerDecl struct {
	Name string `json:"name"`
	// Transport is "http" (streamable HTTP, URL) or "stdio" (Command, a
	// native process outside the sandbox).
	Transport string   `json:"transport"`
	URL       string   `json:"url,omitempty"`
	Command   []string `json:"command,omitempty"`
	// NativeGranted: a stdio server's command, as it is, was granted to
	// run as a native process. A stdio server without it does not run.
	NativeGranted bool `json:"native_granted,omitempty"`
	// Labels are carried by every result of the server's tools.
	Labels []string `json:"labels,omitempty"`
	// State is "connecting", "ready", "down" (keel tries again; Error
	// says why) or "not_granted".
	State string `json:"state"`
	Error string `json:"error,omitempty"`
	// Server is the name and version the server gave in initialize.
	Server string `json:"server,omitempty"`
	// PID is a connected stdio server's process.
	PID int `json:"pid,omitempty"`
	// Tools are the names runs know its tools by (mcp-SERVER-TOOL).
	Tools []string `json:"tools"`
}

// TelemetryState is the state of a runtime's telemetry export.
type TelemetryState struct {
	// Export says spans are exported, to Endpoint over Protocol ("grpc"
	// or "http"), as File (telemetry.json) configures; Content that
	// prompts and outputs go too (on spans holding no label).
	Export   bool   `json:"export"`
	Endpoint string `json:"endpoint,omitempty"`
	Protocol string `json:"protocol,omitempty"`
	File     string `json:"file,omitempty"`
	Content  bool   `json:"content,omitempty"`
	// Metrics says GET /metrics is served.
	Metrics bool `json:"metrics"`
	// Spans since the daemon started: accepted by the collector,
	// dropped (the queue was full), failed (the collector refused them
	// or did not answer in time), denied (the policy kept them).
	Exported uint64 `json:"exported"`
	Dropped  uint64 `json:"dropped"`
	Failed   uint64 `json:"failed"`
	Denied   uint64 `json:"denied"`
	// Queued spans wait for export now, of at most QueueSize.
	Queued    int `json:"queued"`
	QueueSize int `json:"queue_size,omitempty"`
	// LastError is the last failed export's error, at LastErrorAt;
	// LastExport the time of the last accepted batch.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	LastExport  time.Time `json:"last_export,omitzero"`
}

// PolicyState is the policy a runtime has in force.
type PolicyState struct {
	// Version numbers the policies put in force since start, from 1;
	// Digest identifies their files (a decision journals both).
	Version uint64 `json:"version"`
	Digest  string `json:"digest"`
	// Files are the policy files in force, "layer path", in precedence
	// order; empty when there are none.
	Files []string `json:"files"`
	// Error is set while the files on disk do not load: why (with file
	// and line). The last good policy stays in force meanwhile.
	Error string `json:"error,omitempty"`
	// Workspaces are the workspaces live runs name, each with the policy
	// in force for them (its .keel/policy.json with the files above),
	// sorted by Root; omitted when none.
	Workspaces []WorkspacePolicyState `json:"workspaces,omitempty"`
}

// WorkspacePolicyState is the policy in force for the runs of one
// workspace.
type WorkspacePolicyState struct {
	Root    string `json:"root"`
	Version uint64 `json:"version"`
	Digest  string `json:"digest"`
	// Error is set while the workspace's file (or the files above) does
	// not load; the last good policy stays in force meanwhile.
	Error string `json:"error,omitempty"`
}

// ToolLimits are the limits the runtime's sandbox puts on each tool
// call, as in effect (defaults filled in). A negative value means no
// limit.
type ToolLimits struct {
	// CallTimeoutMS bounds a whole call, in milliseconds.
	CallTimeoutMS int64 `json:"call_timeout_ms"`
	// MemoryLimitMiB caps an instance's memory.
	MemoryLimitMiB int `json:"memory_limit_mib"`
	// MaxOutputBytes caps what a call may write to its output.
	MaxOutputBytes int `json:"max_output_bytes"`
	// WriteQuotaBytes caps what a call may write through each read-write
	// grant; -1: no quota.
	WriteQuotaBytes int64 `json:"write_quota_bytes"`
	// MinFreeDiskBytes is the free disk a tool's write must leave; -1: no
	// floor.
	MinFreeDiskBytes int64 `json:"min_free_disk_bytes"`
	// IdleUnloadMS is how long a tool's compiled code is kept without
	// calls, in milliseconds; -1: always kept.
	IdleUnloadMS int64 `json:"idle_unload_ms"`
	// AllowPrivateNetwork: network grants may reach loopback and private
	// addresses. Default false.
	AllowPrivateNetwork bool `json:"allow_private_network"`
}
