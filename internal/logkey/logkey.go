// Package logkey holds the attribute keys of keel's structured logs: one
// set for every package, so that a key means the same thing in every
// record and a query such as run=… or tool=… finds every record about
// it, whichever package logged it.
//
// A record's message says what happened; its attributes use these keys
// and no others. A new key is added here, with what its value is.
package logkey

// Who and what a record is about.
const (
	Component = "component" // the part of the daemon that logs: engine, ipc, wasmtools, ...
	Run       = "run"       // a keel.RunID
	Child     = "child"     // the keel.RunID of a sub-agent run
	Step      = "step"      // a run's step number
	Span      = "span"      // a trace span's ID
	Event     = "event"     // a keel.EventType
	Status    = "status"    // a run's status
	Kind      = "kind"      // a run's kind (agent, plan, dag)
	Tool      = "tool"      // a tool's name
	Version   = "version"   // a tool's version
	SHA256    = "sha256"    // a tool module's SHA-256, hex
	Provider  = "provider"  // a model provider's name
	Model     = "model"     // a model's name
	Target    = "target"    // a provider/model pair the router calls
	Client    = "client"    // what a protocol client calls itself (initialize)
	Remote    = "remote"    // a protocol client's address
	Method    = "method"    // a protocol method
	Server    = "server"    // an MCP server keel is a client of (its configured name)
	Call      = "call"      // a tool call's ID (keel.ToolCall.ID)
	Worker    = "worker"    // a cloud worker's name
	Tenant    = "tenant"    // a cloud tenant's name
	RunKey    = "run_key"   // a run's idempotency key (keel.StartRequest.IdempotencyKey)
)

// Outcomes and errors.
const (
	Err     = "err"      // an error
	ErrKind = "err_kind" // the models.Kind of a model error
	Cause   = "cause"    // what lies behind a tool's failure, beyond its error
	Reason  = "reason"   // why something was refused or ended, in words
	Stack   = "stack"    // a goroutine stack, after a panic
	Stderr  = "stderr"   // what a tool wrote to stderr (bounded)
	Missing = "missing"  // grants a tool requests and was not given
	Warning = "warning"  // a warning about a loaded file, in words
)

// Counts, sizes and durations.
const (
	Duration         = "duration"          // how long it took, a time.Duration
	After            = "after"             // the wait before a retry, a time.Duration
	Attempt          = "attempt"           // which try this is, from 1
	Retry            = "retry"             // retries so far
	Runs             = "runs"              // a number of runs
	Resumed          = "resumed"           // a number of runs resumed
	Left             = "left"              // a number of sub-agents still running
	Tools            = "tools"             // a number of tools
	ToolFiles        = "tool_files"        // a number of tool files found
	ToolCalls        = "tool_calls"        // a number of tool calls a model asked for
	ToolMode         = "tool_mode"         // how a model is offered tools (none, native, schema)
	Inputs           = "inputs"            // a number of embedding inputs
	PromptTokens     = "prompt_tokens"     // tokens of a model call's prompt
	CompletionTokens = "completion_tokens" // tokens of a model call's reply
	FinishReason     = "finish_reason"     // why a model's reply ended
	Stream           = "stream"            // whether a model call streamed
	PeakRSSKiB       = "peak_rss_kib"      // a process's peak resident memory, KiB
	Spans            = "spans"             // a number of trace spans
	Events           = "events"            // a number of journal events
	Servers          = "servers"           // a number of MCP servers
	Tenants          = "tenants"           // a number of cloud tenants
	Content          = "content"           // whether exported spans carry prompts and outputs
)

// Places.
const (
	Edge        = "edge"         // a cloud edge daemon's name (cloud/edge)
	URL         = "url"          // the daemon's WebSocket URL
	Addr        = "addr"         // a listening address
	DataDir     = "data_dir"     // keel's data directory
	Dir         = "dir"          // a directory
	File        = "file"         // a file
	GuestPath   = "guest_path"   // a directory as a tool sees it
	GrantDigest = "grant_digest" // the digest grants are bound to
	Digest      = "digest"       // the digest of what was loaded (a policy)
	Workspace   = "workspace"    // a run's workspace directory ("" none)
	Env         = "env"          // an environment variable's name
	Endpoint    = "endpoint"     // a telemetry collector's address
	Protocol    = "protocol"     // the protocol spoken to it (grpc, http)
	What        = "what"         // what is retried: a model step, a tool call
)
