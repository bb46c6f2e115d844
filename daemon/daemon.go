package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/datadir"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/modelsfile"
	"github.com/keel-runtime/keel/policy"
	"github.com/keel-runtime/keel/wasmtools"
	"golang.org/x/sync/errgroup"
)

// Version is keel's version (keel.Version), reported in daemon.json and
// initialize.
const Version = keel.Version

// DefaultAddr is where the daemon listens unless told otherwise.
const DefaultAddr = "127.0.0.1:7433"

// Config configures a daemon. The zero value is usable: default data
// directory, DefaultAddr, loopback only, Ollama from OLLAMA_HOST.
type Config struct {
	// DataDir holds the database, tools, token and daemon.json; default
	// datadir.Default().
	DataDir string
	// Addr is the listen address; default DefaultAddr. Port 0 picks a
	// free port.
	Addr string
	// AllowNonLoopback permits a non-loopback Addr. Default false: keel
	// refuses to listen where other machines can reach it.
	AllowNonLoopback bool
	// AllowedOrigins are the origins (or origin patterns, see
	// ipc.Config.AllowedOrigins) of browser pages allowed to connect
	// with a token. Default none: only native clients, the daemon's own
	// console and client tokens' own origins.
	AllowedOrigins []string
	// OllamaHost is the Ollama server; default OLLAMA_HOST or
	// http://127.0.0.1:11434.
	OllamaHost string
	// DefaultModel is used for runs that name none; default: the first
	// local model with tool calling.
	DefaultModel string
	// Workspace is granted read-only to the example tools at /workspace;
	// default DataDir/workspace.
	Workspace string
	// ToolsAllowPrivateNetwork lets tools with a network grant reach
	// loopback and private addresses. Default false.
	ToolsAllowPrivateNetwork bool
	// ToolsWriteQuotaBytes and ToolsMinFreeDiskBytes bound what a tool
	// call may write through a read-write grant, and the free disk it
	// must leave (wasmtools.Config.WriteQuotaBytes, MinFreeDiskBytes);
	// 0: the defaults (1 GiB each), negative: no limit.
	ToolsWriteQuotaBytes, ToolsMinFreeDiskBytes int64
	// ToolsIdleTimeout is how long a tool's compiled code is kept without
	// calls before it is unloaded (wasmtools.Config.IdleToolTimeout); 0:
	// the default (5 minutes), negative: never.
	ToolsIdleTimeout time.Duration
	// ToolsCompiler, when set, compiles tools in child processes
	// (wasmtools.Config.Compiler), so the daemon never holds a compile's
	// memory. Default nil: tools compile in the daemon. Command sets it
	// to the keel binary itself (see CompileChild).
	ToolsCompiler *wasmtools.Compiler
	// RequireApproval lists side-effect classes (keel.SideEffect values)
	// whose tool calls wait for a person's approval; empty: none.
	RequireApproval []keel.SideEffect
	// ManagedPolicyFile is the managed layer's policy file; default
	// policy.DefaultManagedPath() (docs/policy.md). The user layer's is
	// policy.json in DataDir.
	ManagedPolicyFile string
	// OnPolicy, when set, is called after each reload of the policy
	// files, on the watcher's goroutine: with the policy now in force,
	// or with the error that keeps the last good one in force.
	OnPolicy func(policy.Event)
	// Synchronous is the database's synchronous setting
	// (store.Options.Synchronous): "" or "FULL", the default, a committed
	// write survives a power cut; "NORMAL", in WAL mode, a committed write
	// survives a crash of the process but the last ones may be lost in a
	// power cut, for an fsync a checkpoint instead of one a commit. Tests
	// that are not about durability set NORMAL (daemontest.Start does);
	// keel's command line never does.
	Synchronous string
	// CacheDir holds compiled tools (wazero's compilation cache), so a
	// restart does not recompile; default DataDir/cache/wazero.
	CacheDir string
	// EmbedModel, when set, is the local model (Ollama's, or Provider's
	// if it serves embeddings) that embeds the knowledge store's chunks
	// and queries, for hybrid search (BM25 and vectors, fused); its
	// digest is recorded with every vector, so a changed model re-embeds.
	// Default "": BM25 only.
	EmbedModel string
	// Join, when set, is the cloud's leaf node URL(s) this daemon joins
	// as an edge (docs/cloud.md, "Edges"): it declares its capabilities
	// there, syncs its runs' journals as their labels allow and runs the
	// steps the cloud hands it. Default "": the daemon stays alone.
	Join string
	// JoinCredentials is the file of credentials the cloud's leaf node
	// port asks for (edge.Config.Credentials); default none.
	JoinCredentials string
	// EdgeName names this edge in the cloud; default the host name.
	EdgeName string
	// EdgeHeartbeat is how often the edge publishes its declaration;
	// default 5 s.
	EdgeHeartbeat time.Duration
	// EdgeAllowLabels are the labels whose data may cross to the cloud
	// (never private); default none.
	EdgeAllowLabels []string
	// Provider replaces the Ollama provider (tests use a scripted one).
	Provider models.Provider
	// Logger; default text to stderr at info level.
	Logger *slog.Logger
	// Ready, when set, is called once the daemon accepts connections.
	Ready func(protocol.DaemonInfo)
}

// The configuration files of the data directory: the model layer's
// (docs/models.md) and the default limits of tool calls (docs/tools.md).
// Both are optional.
const (
	ModelsConfigFile = modelsfile.Name
	ToolsConfigFile  = wasmtools.LimitsFile
)

// ErrAlreadyRunning is returned when another daemon holds the data dir.
var ErrAlreadyRunning = datadir.ErrAlreadyRunning

// Daemon is keel's runtime on one data directory. New takes the data
// directory, the caller binds a listener, Serve builds the layers and
// serves until its ctx ends, Close lets the data directory go:
//
//	d, err := daemon.New(cfg)
//	defer d.Close()
//	ln, err := d.Listen()
//	err = d.Serve(ctx, ln)
//
// Run does exactly that.
type Daemon struct {
	cfg              Config
	log              *slog.Logger
	token, tokenFile string
	unlock           func()
	served           atomic.Bool
}

// Run runs a daemon on cfg.Addr until ctx is cancelled, then stops
// cleanly: runs in flight are journaled as interrupted, daemon.json is
// removed, the database is closed.
func Run(ctx context.Context, cfg Config) error {
	d, err := New(cfg)
	if err != nil {
		return err
	}
	defer d.Close()
	ln, err := d.Listen()
	if err != nil {
		return err
	}
	return d.Serve(ctx, ln)
}

// New checks cfg, fills in its defaults, creates the data directory,
// takes its lock (ErrAlreadyRunning if another daemon holds it) and
// reads or makes the client token. It does no slow work, so a mistake
// is reported at once; the caller binds its listener next (Listen) and
// then calls Serve. Close releases the lock.
func New(cfg Config) (*Daemon, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if cfg.DataDir == "" {
		cfg.DataDir = datadir.Default()
	}
	var err error
	if cfg.DataDir, err = filepath.Abs(cfg.DataDir); err != nil {
		return nil, err
	}
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = filepath.Join(cfg.DataDir, "cache", "wazero")
	}
	if cfg.Workspace == "" {
		cfg.Workspace = filepath.Join(cfg.DataDir, "workspace")
	}
	if cfg.ManagedPolicyFile == "" {
		cfg.ManagedPolicyFile = policy.DefaultManagedPath()
	}
	if err := ipc.CheckAddr(cfg.Addr, cfg.AllowNonLoopback); err != nil {
		return nil, err
	}
	if err := ipc.CheckOrigins(cfg.AllowedOrigins); err != nil {
		return nil, fmt.Errorf("--allow-origin: %w", err)
	}
	for _, se := range cfg.RequireApproval {
		switch se {
		case keel.SideEffectReadOnly, keel.SideEffectIdempotentWrite, keel.SideEffectNonIdempotentWrite, keel.SideEffectExternal:
		default:
			return nil, fmt.Errorf("--require-approval %q: want read_only, idempotent_write, non_idempotent_write or external", se)
		}
	}
	for _, dir := range []string{cfg.DataDir, filepath.Join(cfg.DataDir, "tools"), filepath.Join(cfg.DataDir, "cache"), cfg.Workspace} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
	}
	unlock, err := datadir.Lock(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	token, tokenFile, err := datadir.EnsureToken(cfg.DataDir)
	if err != nil {
		unlock()
		return nil, err
	}
	return &Daemon{cfg: cfg, log: log, token: token, tokenFile: tokenFile, unlock: sync.OnceFunc(unlock)}, nil
}

// Listen binds the configured address (Config.Addr), with a hint when
// the port is taken.
func (d *Daemon) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", d.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (is another program using the port? pick another with --addr 127.0.0.1:PORT, or port 0 for any free port)", d.cfg.Addr, err)
	}
	return ln, nil
}

// Close releases the data directory; a second Close does nothing. It
// does not stop a Serve in progress: cancel its ctx and wait for it
// first.
func (d *Daemon) Close() error {
	d.unlock()
	return nil
}

// Serve builds the layers in order (store, models, tools, engine, ipc),
// serves on ln, which it closes, and writes daemon.json; then it waits
// until ctx is done or the server fails, and stops everything in reverse
// order. A daemon serves once.
//
// The lifetimes (the server, the tool directory watch, the engine with
// the resumption of interrupted runs) run in one errgroup; each stops the
// next, so the order is fixed: the engine closes first (runs in flight
// are journaled as interrupted while clients still hear it), then the
// server (waiting for calls in flight), then the tool runtime and its
// watch.
func (d *Daemon) Serve(ctx context.Context, ln net.Listener) error {
	defer ln.Close()
	if d.served.Swap(true) {
		return errors.New("daemon: Serve called more than once")
	}
	l, err := d.build(ctx)
	defer l.close()
	if err != nil {
		return err
	}
	cfg, log := d.cfg, d.log
	mcp, stopMCP, err := mcpRoute(ctx, l.mcp, l.mcpRuns, log)
	if err != nil {
		return err
	}
	defer stopMCP()
	srv, err := ipc.NewServer(l.services, ipc.Config{Token: d.token, AllowedOrigins: cfg.AllowedOrigins, Logger: log.With(logkey.Component, "ipc"), Version: Version,
		Routes: append(consoleRoutes(), append(l.routes, mcp)...)})
	if err != nil {
		return err
	}
	info := protocol.DaemonInfo{URL: srv.URL(ln), PID: os.Getpid(), Protocol: protocol.Version, TokenFile: d.tokenFile,
		DataDir: cfg.DataDir, Version: Version, StartedAt: time.Now().UTC()}
	l.env.fixed.URL = info.URL
	// An edge joins once its declaration is whole; it leaves after the
	// engine has closed (the runs' last events are in its outbox).
	if cfg.Join != "" {
		leave, err := d.joinCloud(ctx, l)
		defer leave()
		if err != nil {
			return err
		}
	}

	g, gctx := errgroup.WithContext(context.WithoutCancel(ctx))
	// stopping ends when the caller stops the daemon or a lifetime fails.
	stopping, stop := context.WithCancel(gctx)
	defer stop()
	unwatch := context.AfterFunc(ctx, stop)
	defer unwatch()
	srvCtx, stopSrv := context.WithCancel(context.Background())
	// The MCP sessions end as the server stops: their open streams would
	// otherwise hold up its shutdown.
	stopMCPWithSrv := context.AfterFunc(srvCtx, stopMCP)
	defer stopMCPWithSrv()
	watchCtx, stopWatch := context.WithCancel(context.Background())

	// The engine: interrupted runs go on from their journals once their
	// tools can run (until then the daemon already serves); on stop it
	// closes, then stops the server.
	g.Go(func() error {
		defer stopSrv()
		// A resumed call of an MCP server's tool needs its class (may it
		// run again?): the servers make their first connection first.
		if err := l.reg.WaitReady(stopping); err == nil && l.mcpServers.WaitReady(stopping) == nil {
			if n, err := l.eng.Resume(stopping); err != nil {
				log.Error("resume interrupted runs", logkey.Err, err, logkey.Resumed, n)
			} else if n > 0 {
				log.Info("resumed interrupted runs from their journals", logkey.Runs, n)
			}
		}
		<-stopping.Done()
		log.Info("keel daemon stopping")
		datadir.RemoveInfo(cfg.DataDir)
		closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return l.eng.Close(closeCtx)
	})
	// The server; once it has stopped, the tool runtime closes, which
	// ends the watch.
	g.Go(func() error {
		// The watch ends after the runtime closes, as its first rescan
		// waits for the load of the tools found at start.
		defer l.closeTools()
		defer stopWatch()
		if err := srv.Run(srvCtx, ln); err != nil && (srvCtx.Err() == nil || !errors.Is(err, net.ErrClosed)) {
			return fmt.Errorf("server stopped: %w", err)
		}
		return nil
	})
	// Hot reload: tools dropped into, replaced in or deleted from the
	// tools directory take effect without a restart.
	g.Go(func() error {
		if err := l.reg.Watch(watchCtx, 0, nil); err != nil {
			log.Warn("tool directory watch ended", logkey.Err, err)
		}
		return nil
	})

	// Watched directories stay indexed: caught up now, then as they
	// change.
	g.Go(func() error {
		if err := l.know.watcher.Run(watchCtx); err != nil {
			log.Warn("knowledge watch ended", logkey.Err, err)
		}
		return nil
	})

	if err := datadir.WriteInfo(cfg.DataDir, info); err != nil {
		stop()
		return errors.Join(err, g.Wait())
	}
	_, total, _ := l.reg.Progress()
	log.Info("keel daemon ready", logkey.URL, info.URL, logkey.DataDir, cfg.DataDir, logkey.ToolFiles, total)
	if cfg.Ready != nil {
		cfg.Ready(info)
	}
	err = g.Wait()
	log.Info("keel daemon stopped")
	return err
}
