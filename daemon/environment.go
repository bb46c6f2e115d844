package daemon

import (
	"context"

	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/modelsfile"
	"github.com/keel-runtime/keel/wasmtools"
)

// environment serves env.describe: what the daemon was built with.
type environment struct {
	cfg       Config
	url       string
	models    *models.Service
	router    *models.Router
	providers map[string]models.ProviderConfig
	reg       *wasmtools.Registry
	admin     *wasmtools.Admin
}

// Describe declares this environment: every model provider (the local
// one and those of models.json, and whether each answers) with its
// models, the cloud switch, the approval policy, the tool limits, tools
// with their grants, the data dir and URL.
func (e *environment) Describe(ctx context.Context) (capabilities.Environment, error) {
	env := capabilities.Environment{Runtime: "keel", Version: Version, Protocol: protocol.Version,
		DataDir: e.cfg.DataDir, URL: e.url, DefaultModel: e.cfg.DefaultModel, Network: "loopback",
		AllowCloud: e.router.AllowCloud(), RequireApproval: []string{}, ToolLimits: toolLimits(e.cfg)}
	if e.cfg.AllowNonLoopback {
		env.Network = "any"
	}
	for _, se := range e.cfg.RequireApproval {
		env.RequireApproval = append(env.RequireApproval, string(se))
	}
	res, err := e.models.ListModels(ctx)
	if err != nil {
		return env, err
	}
	for _, p := range res.Providers {
		pd := capabilities.ProviderDecl{Name: p.Name, Kind: "local", Endpoint: p.Endpoint, Reachable: p.Reachable, Error: p.Error, Hint: p.Hint}
		if e.providers[p.Name].Cloud {
			pd.Kind = "cloud"
		}
		if p.Name == modelsfile.LocalName {
			pd.Name = e.providers[p.Name].Provider.Name() // "ollama", unless a test's provider
		}
		for _, m := range res.Models {
			if m.Provider == p.Name {
				pd.Models = append(pd.Models, capabilities.ModelDecl{Name: m.Name, Capabilities: m.Capabilities, ContextLength: m.ContextLength})
			}
		}
		env.Providers = append(env.Providers, pd)
	}
	for _, t := range e.reg.Tools() {
		env.Tools = append(env.Tools, capabilities.ToolDecl{Name: t.Spec.Name, Version: t.Spec.Version,
			SideEffects: string(t.Spec.SideEffects), SHA256: t.SHA256, GrantDigest: t.GrantDigest, Grants: t.Grants,
			PendingGrants: e.admin.Info(t).PendingGrants})
	}
	if loaded, total, ready := e.reg.Progress(); !ready {
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
