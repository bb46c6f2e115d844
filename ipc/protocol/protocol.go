package protocol

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

// Version is the protocol version. It changes when a method or event
// changes incompatibly; additions keep it.
const Version = "keel/1"

// Path is the URL path the daemon serves the WebSocket at.
const Path = "/v1/ws"

// Subprotocol is the WebSocket subprotocol every client offers.
const Subprotocol = "keel.v1"

// TokenSubprotocolPrefix lets browsers, which cannot set headers on a
// WebSocket, present the token: they offer the subprotocols
// [Subprotocol, TokenSubprotocolPrefix+TOKEN]. The server only ever
// selects Subprotocol, so the token is not echoed back.
const TokenSubprotocolPrefix = "keel.token."

// MaxFrameBytes is the largest frame the server reads; a larger one
// closes the connection with status 1009 (message too big).
const MaxFrameBytes = 1 << 20

// DaemonFile is the name of the discovery file in the data directory.
const DaemonFile = "daemon.json"

// DaemonInfo is the content of daemon.json, written by a daemon once it
// accepts connections and removed on clean shutdown.
type DaemonInfo struct {
	URL       string    `json:"url"`
	PID       int       `json:"pid"`
	Protocol  string    `json:"protocol"`
	TokenFile string    `json:"token_file"`
	DataDir   string    `json:"data_dir"`
	Version   string    `json:"version"`
	StartedAt time.Time `json:"started_at"`
}

// Request is a JSON-RPC 2.0 request; a request without ID is a
// notification and gets no response.
type Request struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
}

// Response is a JSON-RPC 2.0 response: exactly one of Result and Error.
type Response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *Error          `json:"error,omitempty"`
}

// Notification is a server-to-client message without ID.
type Notification struct {
	JSONRPC string          `json:"jsonrpc"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
}

// Error is a JSON-RPC error object. Code is one of the Code constants.
type Error struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *Error) Error() string { return fmt.Sprintf("keel: %s (code %d)", e.Message, e.Code) }

// Error codes. The -327xx/-326xx codes are JSON-RPC's own; the -320xx
// codes are keel's. docs/protocol.md documents each.
const (
	CodeParseError     = -32700 // the frame is not JSON
	CodeInvalidRequest = -32600 // JSON, but not a JSON-RPC 2.0 request
	CodeMethodNotFound = -32601 // no such method
	CodeInvalidParams  = -32602 // params missing, of the wrong type or out of range
	CodeInternal       = -32603 // a bug or an unexpected failure; details are in the daemon log

	CodeNotFound         = -32001 // the run or tool named does not exist
	CodeConflict         = -32002 // the request conflicts with the current state
	CodeUnavailable      = -32003 // the daemon is shutting down or a dependency is down
	CodeForbidden        = -32004 // the credential lacks the scope the method needs; data is a ForbiddenData
	CodeToolError        = -32010 // the tool failed; data is a keel.ToolError
	CodeInvalidToolInput = -32011 // tool arguments break its input schema; data is a keel.ToolError
	CodeUnusableTool     = -32012 // the tool file cannot be run as a keel tool (keel.ErrUnusableTool); the message says why
	CodeModelUnavailable = -32020 // the model provider is unreachable or lacks the model
)

// Method names.
const (
	MethodInitialize     = "initialize"
	MethodRunStart       = "run.start"
	MethodRunCancel      = "run.cancel"
	MethodRunList        = "run.list"
	MethodRunGet         = "run.get"
	MethodRunSubscribe   = "run.subscribe"
	MethodRunUnsubscribe = "run.unsubscribe"
	MethodToolsList      = "tools.list"
	MethodToolsCall      = "tools.call"
	MethodToolsAudit     = "tools.audit"
	MethodToolsInspect   = "tools.inspect"
	MethodToolsInstall   = "tools.install"
	MethodToolsRemove    = "tools.remove"
	MethodToolsGrant     = "tools.grant"
	MethodToolsRevoke    = "tools.revoke"
	MethodEnvDescribe    = "env.describe"
	MethodModelsList     = "models.list"
	MethodModelsPull     = "models.pull"
	// MethodRunsSubscribe asks for a runs.changed notification whenever
	// a run is created or changes state (docs/protocol.md#runssubscribe);
	// MethodRunsUnsubscribe stops them.
	MethodRunsSubscribe   = "runs.subscribe"
	MethodRunsUnsubscribe = "runs.unsubscribe"

	// NotifyRunEvent carries one keel.Event to a subscriber.
	NotifyRunEvent = "run.event"
	// NotifyToolsChanged tells every client that the installed tools or
	// their grants changed (no params); clients call tools.list again.
	NotifyToolsChanged = "tools.changed"
	// NotifyModelsPullProgress carries one ModelsPullProgress of a
	// models.pull to the connection that asked for the pull.
	NotifyModelsPullProgress = "models.pull.progress"
	// NotifyRunsChanged carries a run's summary (a keel.Run, as run.list
	// shows it) to a connection subscribed with runs.subscribe, after the
	// run was created or changed state.
	NotifyRunsChanged = "runs.changed"
)

// InitializeParams is sent by a client first; all fields are optional.
type InitializeParams struct {
	Client string `json:"client,omitempty"` // e.g. "keel-cli/0.1", "vscode-keel/1.2"
}

// InitializeResult tells the client what it is talking to.
type InitializeResult struct {
	Protocol string   `json:"protocol"`
	Server   string   `json:"server"`
	Version  string   `json:"version"`
	Methods  []string `json:"methods"`
	// Scopes are what this connection's credential may do
	// (keel.ScopeRead, ...): a method outside them fails with
	// CodeForbidden.
	Scopes []string `json:"scopes,omitempty"`
}

// RunStartParams starts a run.
type RunStartParams = keel.StartRequest

// RunRef names a run.
type RunRef struct {
	RunID keel.RunID `json:"run_id"`
}

// RunListParams filters run.list, which lists runs newest first.
type RunListParams = keel.RunQuery

// RunListResult is the result of run.list.
type RunListResult = keel.RunPage

// RunDetail is the result of run.get: the run, its journal and its trace.
type RunDetail struct {
	Run    keel.Run     `json:"run"`
	Events []keel.Event `json:"events"`
	Spans  []keel.Span  `json:"spans"`
	// Labels are the labels the run's context holds now, sorted; [] when
	// none, null from a server that does not follow labels.
	Labels []string `json:"labels"`
}

// SubscribeParams asks for a run's events after AfterSeq (0 = from the
// start): stored ones first, then live ones, each exactly once, as
// run.event notifications. A client that reconnects passes the last Seq
// it saw.
type SubscribeParams struct {
	RunID    keel.RunID `json:"run_id"`
	AfterSeq int64      `json:"after_seq"`
}

// SubscribeResult acknowledges a subscription.
type SubscribeResult struct {
	RunID  keel.RunID     `json:"run_id"`
	Status keel.RunStatus `json:"status"`
}

// ToolInfo is a tool as tools.list shows it.
type ToolInfo = capabilities.ToolInfo

// PendingGrants are grants given to an earlier module of a tool's name.
type PendingGrants = capabilities.PendingGrants

// ToolsInspectParams names a .wasm file to validate without installing.
type ToolsInspectParams struct {
	Path string `json:"path"` // absolute path of NAME.wasm on the daemon's machine
}

// ToolsInstallParams installs a .wasm file.
type ToolsInstallParams = capabilities.InstallRequest

// ToolRef names an installed tool.
type ToolRef struct {
	Name string `json:"name"`
}

// ToolsGrantParams adds grants to an installed tool.
type ToolsGrantParams = capabilities.GrantRequest

// ToolsRevokeParams removes grants from a tool.
type ToolsRevokeParams = capabilities.RevokeRequest

// ToolsListResult is the result of tools.list.
type ToolsListResult struct {
	Tools []ToolInfo `json:"tools"`
	// Compiling is set while the daemon is still compiling the tools it
	// found at start; Tools then lists those already loaded and those
	// the last start recorded (marked compiling), which may be fewer.
	Compiling *ToolsProgress `json:"compiling,omitempty"`
}

// ToolsProgress counts tool files compiled out of those found.
type ToolsProgress struct {
	Loaded int `json:"loaded"`
	Total  int `json:"total"`
}

// ToolsCallParams calls a tool directly, with no model.
type ToolsCallParams struct {
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
	// Client, when set, names who the call is made for, as that client
	// declared itself (a bridge's client: "mcp:NAME"); the audit record
	// keeps it. At most 200 bytes.
	Client string `json:"client,omitempty"`
}

// ToolsCallResult is the result of tools.call.
type ToolsCallResult struct {
	Output     json.RawMessage `json:"output"`
	DurationMS int64           `json:"duration_ms"`
}

// ToolsAuditParams filters tools.audit.
type ToolsAuditParams struct {
	Tool  string `json:"tool,omitempty"`  // only this tool's calls
	Limit int    `json:"limit,omitempty"` // default 50, newest first, at most 1000
}

// ToolsAuditResult is the result of tools.audit.
type ToolsAuditResult struct {
	Records []keel.ToolAudit `json:"records"`
}

// EnvDescribeResult is the result of env.describe.
type EnvDescribeResult = capabilities.Environment

// ModelInfo is one model as models.list shows it.
type ModelInfo = keel.ModelInfo

// ProviderStatus says whether a model provider answered models.list.
type ProviderStatus = keel.ProviderStatus

// ModelsListResult is the result of models.list: the models of every
// configured provider, and each provider's status. A provider that does
// not answer contributes no models.
type ModelsListResult = keel.ModelList

// ModelsPullParams names the model models.pull downloads, as its
// provider spells it (for Ollama, such as "qwen2.5:0.5b").
type ModelsPullParams struct {
	Name string `json:"name"`
}

// ModelsPullResult is the result of models.pull, sent once the pull has
// completed.
type ModelsPullResult struct {
	Name string `json:"name"`
}

// ModelsPullProgress is the params of a models.pull.progress
// notification: one progress report of a pull in flight.
type ModelsPullProgress struct {
	// ID is the id of the models.pull request, byte for byte.
	ID json.RawMessage `json:"id"`
	// Status is the provider's own text, such as "pulling manifest",
	// "pulling 8eeb52dfb3bb", "verifying sha256 digest" or "success".
	Status string `json:"status"`
	// Digest names the layer being downloaded; empty when none is.
	Digest string `json:"digest,omitempty"`
	// Completed and Total count the bytes of that layer downloaded so far
	// and in all; Total is 0 when no download is under way.
	Completed int64 `json:"completed,omitempty"`
	Total     int64 `json:"total,omitempty"`
}
