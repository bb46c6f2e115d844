package ipc

import (
	"context"
	"encoding/json"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// Services are what a Server serves: one small interface per group of
// protocol methods, each served by the package that owns the thing (the
// engine runs, the store's journal, the tool runtime, the model layer).
// A nil group is not served: its methods answer CodeMethodNotFound and
// initialize does not list them (docs/protocol.md).
//
// Every ctx passed to a method is cancelled when the client's connection
// ends or the server stops; methods must honour it, because Server.Run
// waits for every call in flight before it returns. Errors are mapped to
// protocol error codes with errors.Is/As (see docs/protocol.md): wrap
// keel.ErrNotFound, keel.ErrConflict, keel.ErrInvalid,
// keel.ErrUnavailable, keel.ErrUnusableTool or keel.ErrModelUnavailable,
// or return a *keel.ToolError from a tool call or a
// *keel.AlreadyDecidedError from a decision. Any other error is reported
// to the client as an internal error and logged.
type Services struct {
	Runs     Runs        // run.start, run.cancel; with History, run.subscribe and run.unsubscribe
	History  History     // run.list, run.get
	Control  RunControl  // run.decide, run.approve, run.say, run.pause, run.resume, run.replay
	Steering RunSteering // run.takeover, run.handback, run.tool, run.fork
	Tools    Tools       // tools.list, tools.call and the tools.changed notification
	Admin    ToolAdmin   // tools.inspect, tools.install, tools.remove, tools.grant, tools.revoke
	Audit    ToolAudit   // tools.audit
	Models   Models      // models.list, models.pull
	Chat     Chat        // models.chat
	Env      Environment // env.describe
	Policy   Policy      // policy.show, policy.explain
	Labels   RunLabels   // run.declassify, and the labels of run.get
	// Knowledge: knowledge.add, knowledge.remember, knowledge.search,
	// knowledge.list, knowledge.forget, knowledge.watch,
	// knowledge.unwatch, knowledge.labels.
	Knowledge Knowledge
	// Tokens: token.create, token.list, token.revoke, and the client
	// tokens the server accepts. Without it only the daemon's own token
	// and console sessions authenticate.
	Tokens ClientTokens
}

// Runs starts, cancels and follows runs.
type Runs interface {
	// Start creates a run and starts it in the background; the run
	// outlives ctx. The returned Run is its state right after creation.
	Start(ctx context.Context, req keel.StartRequest) (keel.Run, error)
	// Cancel asks a run to stop and returns its state.
	Cancel(ctx context.Context, id keel.RunID) (keel.Run, error)
	// Subscribe calls fn for every event of every run as it happens:
	// persisted events (Seq > 0) after they are stored, and live-only
	// events (Seq == 0, such as model.delta). For one run, fn is called
	// in Seq order, never concurrently. fn does not block. After cancel
	// returns, fn is not called again.
	Subscribe(fn func(keel.Event)) (cancel func())
}

// History reads what runs recorded.
type History interface {
	// RunPage returns a page of runs, newest first, as q selects
	// (q.Limit is between 1 and 1000, q.Status known states). A bad
	// cursor wraps keel.ErrInvalid.
	RunPage(ctx context.Context, q keel.RunQuery) (keel.RunPage, error)
	// GetRun returns one run.
	GetRun(ctx context.Context, id keel.RunID) (keel.Run, error)
	// Events returns the persisted events of a run with Seq > afterSeq,
	// in Seq order.
	Events(ctx context.Context, id keel.RunID, afterSeq int64) ([]keel.Event, error)
	// Spans returns the trace spans of a run.
	Spans(ctx context.Context, id keel.RunID) ([]keel.Span, error)
}

// RunControl serves the decisions a run can wait for, pausing and
// replay.
type RunControl interface {
	// Decide answers a failed tool call's wait: decision is
	// keel.DecisionRetry, DecisionSkip or DecisionDone (with output).
	Decide(ctx context.Context, id keel.RunID, callID, decision string, output json.RawMessage, note string) (keel.Run, error)
	// Approve answers an approval request.
	Approve(ctx context.Context, id keel.RunID, d keel.ApprovalData) (keel.Run, error)
	// SayLabeled gives a run a person's message with the labels the
	// person gave it (checked label names, sorted, no duplicates; nil is
	// no label).
	SayLabeled(ctx context.Context, id keel.RunID, text string, labels []string) (keel.Run, error)
	// Pause stops a run at its next step boundary; Unpause lets it go on.
	Pause(ctx context.Context, id keel.RunID) (keel.Run, error)
	Unpause(ctx context.Context, id keel.RunID) (keel.Run, error)
	// CheckReplay replays a finished run from its journal and compares.
	CheckReplay(ctx context.Context, id keel.RunID) (keel.ReplayCheck, error)
}

// RunSteering serves a person taking a run over, and forks.
type RunSteering interface {
	TakeOver(ctx context.Context, id keel.RunID, note string) (keel.Run, error)
	HandBack(ctx context.Context, id keel.RunID, note string) (keel.Run, error)
	// RunTool calls a tool on behalf of a run a person has taken over;
	// a failed tool is a result, not an error.
	RunTool(ctx context.Context, id keel.RunID, name string, args json.RawMessage) (keel.HumanToolData, error)
	// ForkRun starts a new run from another's journal.
	ForkRun(ctx context.Context, req keel.ForkRequest) (keel.Run, error)
}

// Tools lists and calls the installed tools.
type Tools interface {
	// ListTools returns the installed tools.
	ListTools(ctx context.Context) ([]protocol.ToolInfo, error)
	// CallTool runs one tool with input, asked for by client (as the
	// client declared itself, for the audit trail; may be empty). A
	// tool failure is a *keel.ToolError.
	CallTool(ctx context.Context, name string, input json.RawMessage, client string) (json.RawMessage, error)
	// ToolsProgress reports the compilation of the tools found at start;
	// tools.list shows it while ready is false.
	ToolsProgress() (loaded, total int, ready bool)
	// SubscribeTools calls fn after every change of the installed tools
	// or their grants; every client is then sent tools.changed. fn does
	// not block.
	SubscribeTools(fn func()) (cancel func())
}

// ToolAdmin installs, removes and grants tools.
type ToolAdmin interface {
	// InspectTool validates and compiles a .wasm file without installing
	// it and returns what it is and what it requests.
	InspectTool(ctx context.Context, path string) (protocol.ToolInfo, error)
	// InstallTool installs a .wasm file with the given grants.
	InstallTool(ctx context.Context, p protocol.ToolsInstallParams) (protocol.ToolInfo, error)
	// RemoveTool uninstalls a tool and forgets its grants.
	RemoveTool(ctx context.Context, name string) error
	// GrantTool adds grants to a tool; RevokeTool removes some or all.
	GrantTool(ctx context.Context, p protocol.ToolsGrantParams) (protocol.ToolInfo, error)
	RevokeTool(ctx context.Context, p protocol.ToolsRevokeParams) (protocol.ToolInfo, error)
}

// ToolAudit reads the tool-call audit.
type ToolAudit interface {
	// ToolCalls returns up to limit tool-call audit records, newest
	// first, only tool's when tool is not empty.
	ToolCalls(ctx context.Context, tool string, limit int) ([]keel.ToolAudit, error)
}

// Models lists and downloads models.
type Models interface {
	// ListModels returns the models of every configured provider and
	// each provider's status. A provider that cannot be reached is
	// reported in the result (Reachable false, with Error and Hint), not
	// as an error.
	ListModels(ctx context.Context) (keel.ModelList, error)
	// PullModel downloads the model name and returns once it is
	// complete. It calls progress from the calling goroutine, in order,
	// with each progress report (the server sets their ID); progress may
	// block while the client's queue is full. Cancelling ctx cancels the
	// pull. A name the provider refuses or does not know wraps
	// keel.ErrInvalid; an unreachable provider keel.ErrModelUnavailable.
	PullModel(ctx context.Context, name string, progress func(keel.PullProgress)) error
}

// Chat is one call of the model layer.
type Chat interface {
	// Chat calls onDelta (nil unless the request asked to stream) from
	// the calling goroutine, in order.
	Chat(ctx context.Context, req keel.ChatRequest, onDelta func(keel.ChatDelta)) (keel.ChatReply, error)
}

// Environment describes this environment.
type Environment interface {
	// Describe returns what this environment declares about itself.
	Describe(ctx context.Context) (capabilities.Environment, error)
}

// Policy shows and explains the policy in force.
type Policy interface {
	// ShowPolicy returns the effective policy (of p.Workspace's runs, if
	// set): every rule and lock with where it is written. A workspace
	// that is not an absolute path wraps keel.ErrInvalid.
	ShowPolicy(ctx context.Context, p protocol.PolicyShowParams) (protocol.PolicyShowResult, error)
	// ExplainPolicy decides the action p names without doing it, and
	// says why. p.Kind is checked to be "tool" (with a tool name) or
	// "model" (with provider and model) before it is called. A run
	// that does not exist wraps keel.ErrNotFound; arguments that are
	// not a JSON object keel.ErrInvalid.
	ExplainPolicy(ctx context.Context, p protocol.PolicyExplainParams) (protocol.PolicyExplainResult, error)
}

// RunLabels serves the labels that follow data through a run: what a
// run's context holds, and a person clearing one of them.
type RunLabels interface {
	// ContextLabels returns the labels run id's context holds now,
	// sorted (nil or empty: none). An unknown run wraps keel.ErrNotFound.
	ContextLabels(ctx context.Context, id keel.RunID) ([]string, error)
	// Declassify clears req.Label from what run req.RunID's context holds
	// and journals it (labels.declassified) with req.By and req.Reason,
	// which the server has checked: a well-formed label, a reason that
	// is not blank, who decided. An unknown run wraps keel.ErrNotFound;
	// a label the context does not hold keel.ErrInvalid (saying what it
	// holds); a run that has ended keel.ErrConflict.
	Declassify(ctx context.Context, req keel.DeclassifyRequest) (keel.DeclassifyData, error)
}

// ClientTokens keeps the per-client tokens (token.create, token.list,
// token.revoke) that the server accepts beside its own. Only the hex
// SHA-256 of a secret is given to it.
type ClientTokens interface {
	// CreateClientToken stores a new token; a name (or secret) in use
	// wraps keel.ErrConflict.
	CreateClientToken(ctx context.Context, t keel.ClientToken) error
	// ClientTokenBySHA256 returns the token whose secret has the hex
	// SHA-256 sum; none wraps keel.ErrNotFound.
	ClientTokenBySHA256(ctx context.Context, sum string) (keel.ClientToken, error)
	// ClientTokens returns every token, by name.
	ClientTokens(ctx context.Context) ([]keel.ClientToken, error)
	// DeleteClientToken forgets a token; an unknown name wraps
	// keel.ErrNotFound.
	DeleteClientToken(ctx context.Context, name string) error
	// TouchClientToken records that a token was used at at.
	TouchClientToken(ctx context.Context, name string, at time.Time) error
}

// Knowledge serves the knowledge store (docs/knowledge.md). The server
// has checked what each method's params must hold (non-empty paths,
// query, dir, run_id; one forget selector); scopes and labels are the
// service's to check. by names who asks, for the provenance of what is
// added: "client:NAME", or "client" for one that named none. Errors:
// keel.ErrInvalid (a malformed scope or label, a relative path),
// keel.ErrNotFound (nothing to forget, no such run or watch),
// keel.ErrConflict (remembering a run that has not ended).
type Knowledge interface {
	// AddKnowledge indexes p.Paths into p.Scope, calling progress (from
	// the calling goroutine, in order; it may block while the client's
	// queue is full) as it goes.
	AddKnowledge(ctx context.Context, p protocol.KnowledgeAddParams, by string, progress func(protocol.KnowledgeProgress)) (protocol.KnowledgeAddResult, error)
	// RememberRun saves an ended run's outcome into a scope.
	RememberRun(ctx context.Context, p protocol.KnowledgeRememberParams, by string) (protocol.KnowledgeDoc, error)
	SearchKnowledge(ctx context.Context, p protocol.KnowledgeSearchParams) (protocol.KnowledgeSearchResult, error)
	ListKnowledge(ctx context.Context, p protocol.KnowledgeListParams) (protocol.KnowledgeListResult, error)
	ForgetKnowledge(ctx context.Context, p protocol.KnowledgeForgetParams) (protocol.KnowledgeForgetResult, error)
	// WatchKnowledge indexes p.Dir now and keeps it indexed, also after
	// a restart, until UnwatchKnowledge.
	WatchKnowledge(ctx context.Context, p protocol.KnowledgeWatchParams, by string) (protocol.KnowledgeWatch, error)
	UnwatchKnowledge(ctx context.Context, p protocol.KnowledgeUnwatchParams) error
	// LabelScope sets a scope's labels.
	LabelScope(ctx context.Context, p protocol.KnowledgeLabelsParams) (protocol.KnowledgeScope, error)
}
