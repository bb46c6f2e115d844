package daemon

import (
	"context"

	"github.com/keel-runtime/keel/bridges/mcpclient"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/modelsfile"
	"github.com/keel-runtime/keel/policy"
	"github.com/keel-runtime/keel/telemetry"
	"github.com/keel-runtime/keel/wasmtools"
)

// environment serves env.describe: what the daemon was built with, and
// what its layers declare now.
type environment struct {
	fixed  capabilities.Environment // what does not change while it serves
	models *models.Service
	kinds  map[string]capabilities.ProviderKind
	admin  *wasmtools.Admin
	// policy, when set, is the policy in force (the daemon's watcher).
	policy *policy.Watcher
	// telemetry, when set, is the exporter (its state and counters).
	telemetry *telemetry.Exporter
	// mcp, when set, are the MCP servers keel is a client of.
	mcp *mcpclient.Manager
}

// newEnvironment declares what cfg fixes (the data dir, the network
// stance, the approval policy), the cloud switch of router and the tool
// limits; ms lists the providers, of which the local one is declared
// under localName ("ollama", unless a test's), and admin the tools.
func newEnvironment(cfg Config, ms *models.Service, admin *wasmtools.Admin, router *models.Router, providers map[string]models.ProviderConfig,
	localName string, limits capabilities.ToolLimits) *environment {
	env := capabilities.Environment{Runtime: "keel", Version: Version, Protocol: protocol.Version,
		DataDir: cfg.DataDir, DefaultModel: cfg.DefaultModel, Network: "loopback",
		AllowCloud: router.AllowCloud(), RequireApproval: []string{}, ToolLimits: limits}
	if cfg.AllowNonLoopback {
		env.Network = "any"
	}
	for _, se := range cfg.RequireApproval {
		env.RequireApproval = append(env.RequireApproval, string(se))
	}
	kinds := map[string]capabilities.ProviderKind{}
	for name, pc := range providers {
		kinds[name] = capabilities.ProviderKind{Cloud: pc.Cloud}
	}
	kinds[modelsfile.LocalName] = capabilities.ProviderKind{Name: localName, Cloud: providers[modelsfile.LocalName].Cloud}
	return &environment{fixed: env, models: ms, kinds: kinds, admin: admin}
}

// Describe declares this environment: what newEnvironment fixed, the
// URL, every model provider (the local one and those of models.json, and
// whether each answers) with its models, and the tools with their grants.
func (e *environment) Describe(ctx context.Context) (capabilities.Environment, error) {
	env := e.fixed
	res, err := e.models.ListModels(ctx)
	if err != nil {
		return env, err
	}
	env.Providers = capabilities.DeclareProviders(res, e.kinds)
	env.Tools, env.ToolsCompiling = e.admin.Declare()
	if e.policy != nil {
		env.Policy = policyState(e.policy)
	}
	if e.telemetry != nil {
		env.Telemetry = telemetryState(e.telemetry)
	}
	if e.mcp != nil {
		// The servers with their state, and their tools among the tools.
		env.MCPServers = e.mcp.Servers()
		for _, s := range e.mcp.Specs() {
			env.Tools = append(env.Tools, capabilities.ToolDecl{Name: s.Name, SideEffects: string(s.SideEffects)})
		}
	}
	return env, nil
}
