package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/internal/atomicfile"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/ollama"
	"github.com/keel-runtime/keel/store"
	"github.com/keel-runtime/keel/wasmtools"
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
	// client.DefaultDataDir().
	DataDir string
	// Addr is the listen address; default DefaultAddr. Port 0 picks a
	// free port.
	Addr string
	// AllowNonLoopback permits a non-loopback Addr. Default false: keel
	// refuses to listen where other machines can reach it.
	AllowNonLoopback bool
	// AllowedOrigins are browser origins allowed to connect, exactly as
	// sent in the Origin header. Default none: only native clients.
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
	// CacheDir holds compiled tools (wazero's compilation cache), so a
	// restart does not recompile; default DataDir/cache/wazero.
	CacheDir string
	// Provider replaces the Ollama provider (tests use a scripted one).
	Provider models.Provider
	// Logger; default text to stderr at info level.
	Logger *slog.Logger
	// Ready, when set, is called once the daemon accepts connections.
	Ready func(protocol.DaemonInfo)
}

// ErrAlreadyRunning is returned when another daemon holds the data dir.
var ErrAlreadyRunning = errors.New("another keel daemon is already running on this data directory")

// Run starts the daemon and serves until ctx is cancelled, then stops
// cleanly: runs in flight are journaled as interrupted, daemon.json is
// removed, the database is closed.
func Run(ctx context.Context, cfg Config) (err error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if cfg.DataDir == "" {
		cfg.DataDir = client.DefaultDataDir()
	}
	if cfg.DataDir, err = filepath.Abs(cfg.DataDir); err != nil {
		return err
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
	// Every check of the configuration, and binding the port, come
	// before any slow work (opening the database, compiling tools), so a
	// mistake is reported at once.
	if err := checkLoopback(cfg.Addr, cfg.AllowNonLoopback); err != nil {
		return err
	}
	if err := ipc.CheckOrigins(cfg.AllowedOrigins); err != nil {
		return fmt.Errorf("--allow-origin: %w", err)
	}
	for _, se := range cfg.RequireApproval {
		switch se {
		case keel.SideEffectReadOnly, keel.SideEffectIdempotentWrite, keel.SideEffectNonIdempotentWrite, keel.SideEffectExternal:
		default:
			return fmt.Errorf("--require-approval %q: want read_only, idempotent_write, non_idempotent_write or external", se)
		}
	}
	for _, d := range []string{cfg.DataDir, filepath.Join(cfg.DataDir, "tools"), filepath.Join(cfg.DataDir, "cache"), cfg.Workspace} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	unlock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	token, tokenFile, err := ensureToken(cfg.DataDir)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (is another program using the port? pick another with --addr 127.0.0.1:PORT, or port 0 for any free port)", cfg.Addr, err)
	}
	// Closed by the server once it runs; until then by this, on an error.
	defer ln.Close()

	st, err := store.Open(ctx, filepath.Join(cfg.DataDir, "keel.db"))
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer st.Close()

	provider := cfg.Provider
	var endpoint string
	if provider == nil {
		op, err := ollama.New(ollama.Config{Host: cfg.OllamaHost, Logger: log.With("component", "ollama")})
		if err != nil {
			return fmt.Errorf("ollama provider: %w", err)
		}
		// Close lets streams cancelled mid-reply drain (see ollama.Config.CancelDrain).
		defer op.Close()
		provider, endpoint = op, op.Endpoint()
	}

	// The engine asks the model layer, which routes to Ollama and to the
	// providers of models.json, enforcing policy, limits and budgets.
	router, providers, err := newRouter(filepath.Join(cfg.DataDir, ModelsConfigFile), provider, st, log)
	if err != nil {
		return err
	}

	toolsDir := filepath.Join(cfg.DataDir, "tools")
	if err := installExamples(ctx, st, toolsDir, cfg.Workspace); err != nil {
		return fmt.Errorf("install example tools: %w", err)
	}
	stored, err := st.ToolGrants(ctx)
	if err != nil {
		return fmt.Errorf("load tool grants: %w", err)
	}
	if err := bindLegacyGrants(ctx, st, toolsDir, stored, log.With("component", "grants")); err != nil {
		return fmt.Errorf("bind tool grants to their modules: %w", err)
	}
	grants := &grantTable{m: stored}
	notifier := &toolsNotifier{}
	toolsConf, err := readToolsFile(filepath.Join(cfg.DataDir, ToolsConfigFile))
	if err != nil {
		return fmt.Errorf("tool limits: %w", err)
	}
	reg, err := wasmtools.Open(ctx, toolsConf.applyToolLimits(wasmtools.Config{
		Dir:       toolsDir,
		CacheDir:  cfg.CacheDir,
		GrantsFor: grants.get,
		// Network grants never reach the local machine unless asked for.
		AllowPrivateNetwork: cfg.ToolsAllowPrivateNetwork,
		WriteQuotaBytes:     cfg.ToolsWriteQuotaBytes,
		MinFreeDiskBytes:    cfg.ToolsMinFreeDiskBytes,
		IdleToolTimeout:     cfg.ToolsIdleTimeout,
		Compiler:            cfg.ToolsCompiler,
		// Accept connections at once; tools compile meanwhile.
		Background: true,
		OnChange:   notifier.notify,
		Logger:     log.With("component", "wasmtools"),
	}))
	if err != nil {
		return fmt.Errorf("load tools: %w", err)
	}
	// Hot reload: tools dropped into, replaced in or deleted from the tools
	// directory take effect without a restart.
	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	watchDone := make(chan error, 1)
	go func() { watchDone <- reg.Watch(watchCtx, 0, nil) }()
	defer func() {
		// Close interrupts every guest and the load of the tools found
		// at start at once; the watch ends after it, as its first rescan
		// waits for that load. The bound only matters if a host step
		// outlives that, and keeps shutdown prompt.
		stopWatch()
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := reg.Close(closeCtx); err != nil {
			log.Error("close the tool runtime", "err", err)
		}
		if err := <-watchDone; err != nil {
			log.Warn("tool directory watch ended", "err", err)
		}
	}()

	tools := &auditedTools{reg: reg, st: st, log: log.With("component", "audit")}
	eng, err := engine.New(engine.Config{Store: st, Model: router, Tools: tools, RequireApproval: cfg.RequireApproval, DefaultModel: cfg.DefaultModel, Logger: log.With("component", "engine")})
	if err != nil {
		return err
	}
	if n, err := eng.Recover(ctx); err != nil {
		return err
	} else if n > 0 {
		log.Info("runs left unfinished by a previous daemon are interrupted; they resume once tools are ready", "runs", n)
	}

	mgr := &toolManager{toolsNotifier: notifier, reg: reg, st: st, calls: tools, grants: grants, dir: toolsDir}
	ms := &modelService{provider: provider, providers: providers, router: router, endpoint: endpoint, file: filepath.Join(cfg.DataDir, ModelsConfigFile)}
	env := &environment{cfg: cfg, models: ms, tools: mgr}
	srv, err := ipc.NewServer(ipc.Services{Runs: eng, History: st, Control: eng, Steering: eng, Tools: mgr, Admin: mgr, Audit: st,
		Models: ms, Chat: ms, Env: env}, ipc.Config{Token: token, AllowedOrigins: cfg.AllowedOrigins, Logger: log.With("component", "ipc"), Version: Version})
	if err != nil {
		return err
	}
	info := protocol.DaemonInfo{URL: srv.URL(ln), PID: os.Getpid(), Protocol: protocol.Version, TokenFile: tokenFile,
		DataDir: cfg.DataDir, Version: Version, StartedAt: time.Now().UTC()}
	env.url = info.URL

	srvCtx, stopSrv := context.WithCancel(context.WithoutCancel(ctx))
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Run(srvCtx, ln) }()

	infoPath := filepath.Join(cfg.DataDir, protocol.DaemonFile)
	if err := writeFileAtomic(infoPath, mustJSON(info), 0o600); err != nil {
		stopSrv()
		<-srvDone
		return fmt.Errorf("write %s: %w", infoPath, err)
	}
	_, total, _ := reg.Progress()
	log.Info("keel daemon ready", "url", info.URL, "data_dir", cfg.DataDir, "tool_files", total)
	if cfg.Ready != nil {
		cfg.Ready(info)
	}

	// Interrupted runs go on from their journals once their tools can
	// run; until then the daemon already serves.
	resumeCtx, stopResume := context.WithCancel(context.WithoutCancel(ctx))
	resumeDone := make(chan struct{})
	go func() {
		defer close(resumeDone)
		if err := reg.WaitReady(resumeCtx); err != nil {
			return
		}
		if n, err := eng.Resume(resumeCtx); err != nil {
			log.Error("resume interrupted runs", "err", err, "resumed", n)
		} else if n > 0 {
			log.Info("resumed interrupted runs from their journals", "runs", n)
		}
	}()
	defer func() { stopResume(); <-resumeDone }()

	select {
	case <-ctx.Done():
	case err := <-srvDone:
		stopSrv()
		os.Remove(infoPath)
		stopResume()
		<-resumeDone
		return errors.Join(fmt.Errorf("server stopped: %w", err), eng.Close(context.WithoutCancel(ctx)))
	}
	log.Info("keel daemon stopping")
	os.Remove(infoPath)
	stopResume()
	<-resumeDone
	closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	engErr := eng.Close(closeCtx)
	stopSrv()
	srvErr := <-srvDone
	if errors.Is(srvErr, context.Canceled) || errors.Is(srvErr, net.ErrClosed) {
		srvErr = nil
	}
	log.Info("keel daemon stopped")
	return errors.Join(engErr, srvErr)
}

func checkLoopback(addr string, allow bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--addr %q: %w (want HOST:PORT, e.g. 127.0.0.1:7433)", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	if allow {
		return nil
	}
	return fmt.Errorf("refusing to listen on %s: it is not a loopback address, so other machines could reach keel; use 127.0.0.1, or pass --allow-non-loopback if you really mean it", addr)
}

func lockDataDir(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, "daemon.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			msg := ""
			if info, rerr := client.ReadDaemonInfo(dir); rerr == nil {
				msg = fmt.Sprintf(" (pid %d, %s)", info.PID, info.URL)
			}
			return nil, fmt.Errorf("%w%s; stop it first, or use another --data-dir", ErrAlreadyRunning, msg)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// ensureToken returns the client token, creating it (mode 0600) on first
// start. A token file readable by others is tightened, not trusted blindly.
func ensureToken(dir string) (token, path string, err error) {
	path = filepath.Join(dir, "token")
	b, err := os.ReadFile(path)
	if err == nil {
		token = strings.TrimSpace(string(b))
		if len(token) < 32 {
			return "", "", fmt.Errorf("token file %s is too short; delete it and restart to make a new one", path)
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(path, 0o600); err != nil {
				return "", "", fmt.Errorf("token file %s is readable by others and cannot be fixed: %w", path, err)
			}
		}
		return token, path, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", "", fmt.Errorf("read token: %w", err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", "", err
	}
	token = hex.EncodeToString(raw[:])
	if err := writeFileAtomic(path, []byte(token+"\n"), 0o600); err != nil {
		return "", "", fmt.Errorf("write token: %w", err)
	}
	return token, path, nil
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	return atomicfile.Write(path, bytes.NewReader(data), mode)
}

func mustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(err)
	}
	return append(b, '\n')
}
