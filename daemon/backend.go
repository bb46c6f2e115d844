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

// Describe declares this environment: every model provider (the local
// one and those of models.json, and whether each answers) with its
// models, the cloud switch, the approval policy, the tool limits, tools
// with their grants, the data dir and URL.
func (b *backend) Describe(ctx context.Context) (capabilities.Environment, error) {
	env := capabilities.Environment{Runtime: "keel", Version: Version, Protocol: protocol.Version,
		DataDir: b.cfg.DataDir, URL: b.url, DefaultModel: b.cfg.DefaultModel, Network: "loopback",
		AllowCloud: b.router.AllowCloud(), RequireApproval: []string{}, ToolLimits: toolLimits(b.cfg)}
	if b.cfg.AllowNonLoopback {
		env.Network = "any"
	}
	for _, se := range b.cfg.RequireApproval {
		env.RequireApproval = append(env.RequireApproval, string(se))
	}
	res, err := b.ListModels(ctx)
	if err != nil {
		return env, err
	}
	for _, p := range res.Providers {
		pd := capabilities.ProviderDecl{Name: p.Name, Kind: "local", Endpoint: p.Endpoint, Reachable: p.Reachable, Error: p.Error, Hint: p.Hint}
		if b.providers[p.Name].Cloud {
			pd.Kind = "cloud"
		}
		if p.Name == localProvider {
			pd.Name = b.provider.Name() // "ollama", unless a test's provider
		}
		for _, m := range res.Models {
			if m.Provider == p.Name {
				pd.Models = append(pd.Models, capabilities.ModelDecl{Name: m.Name, Capabilities: m.Capabilities, ContextLength: m.ContextLength})
			}
		}
		env.Providers = append(env.Providers, pd)
	}
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

// toolLimits declares the limits cfg gives the sandbox, defaults filled
// in as wasmtools fills them.
func toolLimits(cfg Config) capabilities.ToolLimits {
	orDefault := func(v, def int64) int64 {
		switch {
		case v < 0:
			return -1
		case v == 0:
			return def
		}
		return v
	}
	return capabilities.ToolLimits{
		CallTimeoutMS:       wasmtools.DefaultCallTimeout.Milliseconds(),
		MemoryLimitMiB:      wasmtools.DefaultMemoryLimitMiB,
		MaxOutputBytes:      wasmtools.DefaultMaxOutputBytes,
		WriteQuotaBytes:     orDefault(cfg.ToolsWriteQuotaBytes, wasmtools.DefaultWriteQuotaBytes),
		MinFreeDiskBytes:    orDefault(cfg.ToolsMinFreeDiskBytes, wasmtools.DefaultMinFreeDiskBytes),
		IdleUnloadMS:        orDefault(cfg.ToolsIdleTimeout.Milliseconds(), wasmtools.DefaultIdleToolTimeout.Milliseconds()),
		AllowPrivateNetwork: cfg.ToolsAllowPrivateNetwork,
	}
}
