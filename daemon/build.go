package daemon

import (
	"context"
	"fmt"
	"github.com/keel-runtime/keel/bridges/mcpclient/mcpfile"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bridges/mcpclient"
	"github.com/keel-runtime/keel/cloud/edge"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/modelsfile"
	"github.com/keel-runtime/keel/models/ollama"
	"github.com/keel-runtime/keel/policy"
	"github.com/keel-runtime/keel/recall"
	"github.com/keel-runtime/keel/store"
	"github.com/keel-runtime/keel/telemetry"
	"github.com/keel-runtime/keel/wasmtools"
)

// layers are what build makes: the parts Serve runs, and what the
// protocol server serves.
type layers struct {
	reg      *wasmtools.Registry
	eng      *engine.Engine
	env      *environment
	services ipc.Services
	// mcpServers are the MCP servers the daemon is a client of.
	mcpServers *mcpclient.Manager
	// closeTools closes the tool runtime, once.
	closeTools func()
	// tel exports spans and serves metrics (routes).
	tel    *telemetry.Exporter
	routes []ipc.Route
	// mcp are the tools MCP clients call (mcpRoute).
	mcp     mcpTools
	mcpRuns mcpRuns
	// know is the knowledge store and what uses it.
	know *knowledgeLayer
	// placer places plan steps in other environments: set when the
	// daemon joins a cloud (joinCloud).
	placer *placerSlot
	// spans reads a run's spans from the store.
	spans func(context.Context, keel.RunID) ([]keel.Span, error)
	// offers keeps the steps other edges hand this one (--join), in
	// the store.
	offers edge.Offers
	// closers undo build, last first (close).
	closers []func()
}

// close releases what build made, in reverse order.
func (l *layers) close() {
	for i := len(l.closers) - 1; i >= 0; i-- {
		l.closers[i]()
	}
}

// build makes the layers in order: store, models, tools, engine (with
// the runs a previous daemon left unfinished journaled as interrupted),
// and the services of the protocol. On an error, what was made is in
// l.closers all the same.
func (d *Daemon) build(ctx context.Context) (l *layers, err error) {
	cfg, log := d.cfg, d.log
	l = &layers{closeTools: func() {}}
	st, err := store.OpenWith(ctx, filepath.Join(cfg.DataDir, "keel.db"), store.Options{Synchronous: cfg.Synchronous})
	if err != nil {
		return l, fmt.Errorf("open database: %w", err)
	}
	l.closers = append(l.closers, func() { st.Close() })

	provider := cfg.Provider
	var endpoint string
	if provider == nil {
		op, err := ollama.New(ollama.Config{Host: cfg.OllamaHost, Logger: log.With(logkey.Component, "ollama")})
		if err != nil {
			return l, fmt.Errorf("ollama provider: %w", err)
		}
		// Close lets streams cancelled mid-reply drain (see ollama.Config.CancelDrain).
		l.closers = append(l.closers, func() { op.Close() })
		provider, endpoint = op, op.Endpoint()
	}
	// The engine asks the model layer, which routes to Ollama and to the
	// providers of models.json, enforcing policy, limits and budgets.
	router, providers, err := modelsfile.Load(filepath.Join(cfg.DataDir, ModelsConfigFile), provider, st, log)
	if err != nil {
		return l, err
	}

	toolsDir := filepath.Join(cfg.DataDir, "tools")
	if err := wasmtools.SeedExamples(ctx, st, toolsDir, cfg.Workspace); err != nil {
		return l, fmt.Errorf("install example tools: %w", err)
	}
	grants, err := wasmtools.LoadGrants(ctx, st, toolsDir, log.With(logkey.Component, "grants"))
	if err != nil {
		return l, err
	}
	changes := &wasmtools.Changes{}
	limits, err := wasmtools.ReadLimitsFile(filepath.Join(cfg.DataDir, ToolsConfigFile))
	if err != nil {
		return l, fmt.Errorf("tool limits: %w", err)
	}
	// The audit trail records every call the registry runs, and the calls
	// the engine's decisions keep from it.
	audit := st.AuditTrail(log.With(logkey.Component, "audit"))
	wc := wasmtools.Config{
		Dir:       toolsDir,
		CacheDir:  cfg.CacheDir,
		GrantsFor: grants.Get,
		// Network grants never reach the local machine unless asked for.
		AllowPrivateNetwork: cfg.ToolsAllowPrivateNetwork,
		WriteQuotaBytes:     cfg.ToolsWriteQuotaBytes,
		MinFreeDiskBytes:    cfg.ToolsMinFreeDiskBytes,
		IdleToolTimeout:     cfg.ToolsIdleTimeout,
		Compiler:            cfg.ToolsCompiler,
		// Accept connections at once; tools compile meanwhile.
		Background: true,
		OnChange:   changes.Notify,
		Logger:     log.With(logkey.Component, "wasmtools"),
		// The audit trail sees every call first (see intercept).
		Interceptors: intercept.Tools{audit},
	}
	wc = wc.WithDefaultLimits(limits)
	reg, err := wasmtools.Open(ctx, wc)
	if err != nil {
		return l, fmt.Errorf("load tools: %w", err)
	}
	l.reg = reg
	l.closeTools = sync.OnceFunc(func() {
		// Close interrupts every guest and the load of the tools found at
		// start at once. The bound only matters if a host step outlives
		// that, and keeps shutdown prompt.
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := reg.Close(closeCtx); err != nil {
			log.Error("close the tool runtime", logkey.Err, err)
		}
	})
	l.closers = append(l.closers, l.closeTools)

	// A reload is journaled in the runs it concerns, by the engine made
	// below (the watcher starts first: the engine needs its policy).
	var engRef atomic.Pointer[engine.Engine]
	pol, err := openPolicy(cfg, log.With(logkey.Component, "policy"), func(ev policy.Event) {
		if e := engRef.Load(); e != nil {
			e.PolicyChanged(context.Background(), ev.Workspace)
		}
	})
	if err != nil {
		return l, err
	}
	l.closers = append(l.closers, func() { pol.Close() })
	// Export: the engine's spans go through the exporter on their way to
	// the store; each run's export is decided by that run's policy.
	tel, err := openTelemetry(cfg, st, &engRef, log.With(logkey.Component, "telemetry"))
	if err != nil {
		return l, err
	}
	l.tel = tel
	l.closers = append(l.closers, func() {
		// Spans still queued get a few seconds to reach the collector.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tel.Close(ctx); err != nil {
			log.Warn("telemetry: stop", logkey.Err, err)
		}
	})
	// External MCP servers (mcp.json) are tool sources beside the
	// sandbox: their calls go through the same audit trail, and their
	// tool changes reach clients as the sandbox's do.
	mcp, err := mcpclient.Open(mcpclient.Config{File: filepath.Join(cfg.DataDir, mcpfile.FileName), Watch: true,
		Interceptors: intercept.Tools{audit}, OnChange: changes.Notify, Version: Version, Logger: log.With(logkey.Component, "mcpclient")})
	if err != nil {
		return l, err
	}
	l.closers = append(l.closers, mcp.Close)
	l.mcpServers = mcp
	// The knowledge store, in the same database file: its search is a
	// built-in tool of the runs whose policy lets them read a scope.
	tracer := tel.Tracer(st)
	know, err := openKnowledge(ctx, cfg, st, provider, tracer, audit, &engRef, log.With(logkey.Component, "knowledge"))
	if err != nil {
		return l, err
	}
	l.closers = append(l.closers, func() { know.close(log) })
	l.know = know
	runTools := recall.RunTools{Next: mcpclient.RunTools{Local: reg.RunTools(), MCP: mcp}, Knowledge: know.tool}
	ecfg := engine.Config{Store: engineStore{tel.Journal(st), tracer}, Model: router, Tools: runTools, Policy: pol, Audit: audit, RequireApproval: cfg.RequireApproval, DefaultModel: cfg.DefaultModel, Logger: log.With(logkey.Component, "engine")}
	if cfg.Join != "" {
		l.placer = &placerSlot{}
		ecfg.Placer = l.placer
	}
	l.spans, l.offers = st.Spans, st
	eng, err := engine.New(ecfg)
	if err != nil {
		return l, err
	}
	if n, err := eng.Recover(ctx); err != nil {
		return l, err
	} else if n > 0 {
		log.Info("runs left unfinished by a previous daemon are interrupted; they resume once tools are ready", logkey.Runs, n)
	}
	l.eng = eng
	engRef.Store(eng)
	unsubscribe := eng.Subscribe(tel.OnEvent)
	l.closers = append(l.closers, unsubscribe)

	admin := wasmtools.NewAdmin(reg, st, grants, changes)
	polSvc := &policy.Service{Watcher: pol, Effective: eng.Policy, RunEffective: eng.PolicyOf, Runs: st, SideEffects: runTools.SideEffects,
		Targets: runTools.CallTargets, IsCloud: router.IsCloud, ContextLabels: eng.ContextLabels}
	// A direct tool call obeys the policy's egress rules too.
	admin.DirectEgress = polSvc.DirectEgress
	ms := models.NewService(models.ServiceConfig{Router: router, Providers: providers, Local: modelsfile.LocalName,
		Endpoint: endpoint, File: filepath.Join(cfg.DataDir, ModelsConfigFile)})
	// The limits declared are those in effect: flags, then tools.json.
	l.env = newEnvironment(cfg, ms, admin, router, providers, provider.Name(), wc.DeclaredLimits())
	l.env.policy = pol
	l.env.mcp = mcp
	l.env.telemetry = tel
	if h := tel.MetricsHandler(); h != nil {
		l.routes = append(l.routes, ipc.Route{Pattern: "GET /metrics", Handler: h})
	}
	l.mcp = mcpTools{admin: admin, pol: mcpPolicy{polSvc}, audit: audit}
	l.mcpRuns = mcpRuns{start: eng.Start, getRun: st.GetRun, spans: st.Spans, pol: mcpPolicy{polSvc}}
	tools := mcpclient.ListedTools{Local: admin, MCP: mcp, DirectEgress: polSvc.DirectEgress}
	l.services = ipc.Services{Runs: eng, History: st, Control: eng, Steering: eng, Tools: tools, Admin: admin, Audit: st,
		Models: ms, Chat: ms, Env: l.env, Policy: polSvc, Labels: eng, Tokens: st, Knowledge: know.service}
	return l, nil
}
