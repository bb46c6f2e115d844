package daemon

import (
	"context"
	"encoding/json"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/store"
	"github.com/keel-runtime/keel/wasmtools"
)

// backend adapts the engine, store and tool registry to ipc.Backend.
type backend struct {
	*toolsNotifier // SubscribeTools: clients hear of tool changes
	st             *store.Store
	eng            *engine.Engine
	reg            *wasmtools.Registry
	tools          *auditedTools
	mgr            *toolManager
	provider       models.Provider                  // the local one, Ollama unless a test's
	providers      map[string]models.ProviderConfig // every configured provider, the local one as localProvider
	router         *models.Router                   // the model layer runs and models.chat use
	endpoint       string
	url            string
	cfg            Config
}

func (b *backend) StartRun(ctx context.Context, p protocol.RunStartParams) (keel.Run, error) {
	return b.eng.Start(ctx, engine.StartRequest{Goal: p.Goal, Model: p.Model, MaxSteps: p.MaxSteps, Policy: p.Policy, IdempotencyKey: p.IdempotencyKey,
		Kind: p.Kind, Plan: p.Plan})
}

func (b *backend) CancelRun(ctx context.Context, id keel.RunID) (keel.Run, error) {
	return b.eng.Cancel(ctx, id)
}

func (b *backend) ListRuns(ctx context.Context, p protocol.RunListParams) (protocol.RunListResult, error) {
	runs, next, err := b.st.ListRunsPage(ctx, store.ListQuery{Limit: p.Limit, Statuses: p.Status, Cursor: p.Cursor})
	return protocol.RunListResult{Runs: runs, NextCursor: next}, err
}

func (b *backend) GetRun(ctx context.Context, id keel.RunID) (keel.Run, error) {
	return b.st.GetRun(ctx, id)
}

func (b *backend) Events(ctx context.Context, id keel.RunID, afterSeq int64) ([]keel.Event, error) {
	return b.st.Events(ctx, id, afterSeq)
}

func (b *backend) Spans(ctx context.Context, id keel.RunID) ([]keel.Span, error) {
	return b.st.Spans(ctx, id)
}

func (b *backend) Subscribe(fn func(keel.Event)) (cancel func()) {
	return b.eng.Subscribe(fn)
}

func (b *backend) ToolsProgress() (loaded, total int, ready bool) { return b.reg.Progress() }

func (b *backend) ListTools(ctx context.Context) ([]protocol.ToolInfo, error) {
	tools := b.reg.Tools()
	out := make([]protocol.ToolInfo, len(tools))
	for i, t := range tools {
		out[i] = b.mgr.grants.withPending(toolInfo(t))
	}
	return out, nil
}

func (b *backend) CallTool(ctx context.Context, name string, input json.RawMessage) (json.RawMessage, error) {
	return b.tools.Call(ctx, name, input)
}

func (b *backend) InspectTool(ctx context.Context, path string) (protocol.ToolInfo, error) {
	return b.mgr.Inspect(ctx, path)
}

func (b *backend) InstallTool(ctx context.Context, p protocol.ToolsInstallParams) (protocol.ToolInfo, error) {
	return b.mgr.Install(ctx, p)
}

func (b *backend) RemoveTool(ctx context.Context, name string) error { return b.mgr.Remove(ctx, name) }

func (b *backend) GrantTool(ctx context.Context, p protocol.ToolsGrantParams) (protocol.ToolInfo, error) {
	return b.mgr.Grant(ctx, p)
}

func (b *backend) RevokeTool(ctx context.Context, p protocol.ToolsRevokeParams) (protocol.ToolInfo, error) {
	return b.mgr.Revoke(ctx, p)
}

func (b *backend) ToolAudit(ctx context.Context, tool string, limit int) ([]keel.ToolAudit, error) {
	return b.st.ToolCalls(ctx, tool, limit)
}

// Describe declares this environment: providers (and whether they
// answer), models, tools with their grants, the data dir and URL.
func (b *backend) Describe(ctx context.Context) (capabilities.Environment, error) {
	env := capabilities.Environment{Runtime: "keel", Version: Version, Protocol: protocol.Version,
		DataDir: b.cfg.DataDir, URL: b.url, DefaultModel: b.cfg.DefaultModel, Network: "loopback"}
	if b.cfg.AllowNonLoopback {
		env.Network = "any"
	}
	list, hint, err := b.askProvider(ctx, b.provider.Name(), b.provider, true)
	pd := capabilities.ProviderDecl{Name: b.provider.Name(), Kind: "local", Endpoint: b.endpoint, Reachable: err == nil, Hint: hint}
	if err != nil {
		pd.Error = err.Error()
	}
	for _, m := range list {
		pd.Models = append(pd.Models, capabilities.ModelDecl{Name: m.Name, Capabilities: capNames(m.Capabilities), ContextLength: m.ContextLength})
	}
	env.Providers = []capabilities.ProviderDecl{pd}
	for _, t := range b.reg.Tools() {
		env.Tools = append(env.Tools, capabilities.ToolDecl{Name: t.Spec.Name, Version: t.Spec.Version,
			SideEffects: string(t.Spec.SideEffects), SHA256: t.SHA256, GrantDigest: t.GrantDigest, Grants: t.Grants,
			PendingGrants: b.mgr.grants.withPending(toolInfo(t)).PendingGrants})
	}
	if loaded, total, ready := b.reg.Progress(); !ready {
		env.ToolsCompiling = total - loaded
	}
	return env, nil
}
