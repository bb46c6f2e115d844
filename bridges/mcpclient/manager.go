package mcpclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/keel-runtime/keel/bridges/mcpclient/mcpfile"
	"log/slog"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/internal/logkey"
)

// Config configures a Manager. File is required; the zero value of every
// other field selects its default.
type Config struct {
	// File is the path of mcp.json (mcpfile.FileName in the data directory).
	File string
	// Watch makes the Manager follow changes of File (fsnotify on its
	// directory) until Close; default false: only Reload reads it again.
	Watch bool
	// Interceptors see every call of a server's tool, as the tool
	// runtime's see its calls (the audit trail first).
	Interceptors intercept.Tools
	// OnChange is called after the servers' tools or states changed (a
	// server connected, went down, was refused for want of a grant,
	// changed its list; the file changed). It must not block.
	OnChange func()
	// Version is keel's version, given to servers in initialize.
	// Default "dev".
	Version string
	// ConnectTimeout bounds a connection (start, initialize, the first
	// tools/list). Default 10 s.
	ConnectTimeout time.Duration
	// CallTimeout bounds a call of a server that sets no
	// timeout_seconds. Default 60 s.
	CallTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before a reconnection,
	// doubling from the first to the second after each failure. Default
	// 500 ms and 30 s.
	MinBackoff, MaxBackoff time.Duration
	// MaxOutputBytes bounds a call's result; a larger one fails the call
	// (resource_exhausted). Default 4 MiB.
	MaxOutputBytes int
	// Logger receives connections, disconnections and refused tools.
	// Default: discarded.
	Logger *slog.Logger
}

// Manager connects to the MCP servers of mcp.json, one goroutine per
// server owning its connection, and serves their tools: listing
// (Specs, Info), classes (SideEffects) and calls (Call). Create it with
// Open, stop it with Close; its methods are safe for concurrent use.
type Manager struct {
	cfg Config
	log *slog.Logger
	// ctx is the Manager's lifetime, cancelled by Close; wg joins every
	// goroutine it started.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	close  sync.Once
	reload sync.Mutex // one reconciliation at a time

	mu      sync.Mutex
	servers map[string]*server
	fileErr error // why File could not be read last time, or nil
}

// Open reads cfg.File and starts a goroutine for each server it
// declares; it does not wait for them to connect (WaitReady does). A
// file that does not read is logged and kept in Errors; Open fails only
// when cfg has no File or the watch cannot start.
func Open(cfg Config) (*Manager, error) {
	if cfg.File == "" {
		return nil, errors.New("mcpclient: Config.File is required")
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = time.Minute
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 500 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(30*time.Second, cfg.MinBackoff)
	}
	if cfg.MaxOutputBytes <= 0 {
		cfg.MaxOutputBytes = 4 << 20
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{cfg: cfg, log: log, servers: map[string]*server{}}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	if cfg.Watch {
		w, err := fsnotify.NewWatcher()
		if err != nil {
			m.cancel()
			return nil, fmt.Errorf("mcpclient: watch %s: %w", cfg.File, err)
		}
		if err := w.Add(filepath.Dir(cfg.File)); err != nil {
			w.Close()
			m.cancel()
			return nil, fmt.Errorf("mcpclient: watch %s: %w", cfg.File, err)
		}
		m.wg.Add(1)
		go m.watch(w)
	}
	m.Reload()
	return m, nil
}

// Close stops every server (a stdio server's process is ended) and the
// watch, and waits for their goroutines. A second Close does nothing.
func (m *Manager) Close() {
	m.close.Do(func() {
		m.cancel()
		m.wg.Wait()
	})
}

// watch reloads the file after it changes, until Close.
func (m *Manager) watch(w *fsnotify.Watcher) {
	defer m.wg.Done()
	defer w.Close()
	name := filepath.Base(m.cfg.File)
	// Editors and atomic writes make several events per change: a reload
	// 100 ms after the last.
	var settle <-chan time.Time
	for {
		select {
		case <-m.ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if filepath.Base(ev.Name) == name {
				settle = time.After(100 * time.Millisecond)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			m.log.Warn("mcp: watch of the servers file", logkey.File, m.cfg.File, logkey.Err, err)
		case <-settle:
			settle = nil
			m.Reload()
		}
	}
}

// Reload reads the file again and makes the running servers those it
// declares: a new server starts, a removed one stops, a changed one
// restarts, the others keep their connections. A file that does not
// read keeps the servers as they are and is returned (and logged).
func (m *Manager) Reload() error {
	m.reload.Lock()
	defer m.reload.Unlock()
	if m.ctx.Err() != nil {
		return nil
	}
	f, err := mcpfile.ReadFile(m.cfg.File)
	m.mu.Lock()
	m.fileErr = err
	m.mu.Unlock()
	if err != nil {
		m.log.Error("mcp: the servers file does not read; the servers stay as they were", logkey.File, m.cfg.File, logkey.Err, err)
		return err
	}
	m.mu.Lock()
	var stop []*server
	for name, s := range m.servers {
		if c, ok := f.Servers[name]; !ok || !reflect.DeepEqual(c, s.cfg) {
			stop = append(stop, s)
			delete(m.servers, name)
		}
	}
	var start []*server
	for _, name := range slices.Sorted(maps.Keys(f.Servers)) {
		if _, ok := m.servers[name]; !ok {
			s := newServer(m, name, f.Servers[name])
			m.servers[name] = s
			start = append(start, s)
		}
	}
	m.mu.Unlock()
	for _, s := range stop {
		s.stop()
	}
	for _, s := range start {
		m.wg.Add(1)
		go s.run()
	}
	if len(stop) > 0 {
		m.changed()
	}
	return nil
}

// changed tells cfg.OnChange.
func (m *Manager) changed() {
	if m.cfg.OnChange != nil {
		m.cfg.OnChange()
	}
}

// list returns the servers, by name.
func (m *Manager) list() []*server {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*server, 0, len(m.servers))
	for _, name := range slices.Sorted(maps.Keys(m.servers)) {
		out = append(out, m.servers[name])
	}
	return out
}

// Loading reports whether a server has not finished its first
// connection attempt yet (WaitReady would wait).
func (m *Manager) Loading() bool {
	for _, s := range m.list() {
		select {
		case <-s.first:
		default:
			return true
		}
	}
	return false
}

// WaitReady waits until every server has made its first connection
// attempt, connected or not (each is bounded by Config.ConnectTimeout),
// or until ctx ends.
func (m *Manager) WaitReady(ctx context.Context) error {
	for _, s := range m.list() {
		select {
		case <-s.first:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// lookup returns the tool name and its server.
func (m *Manager) lookup(name string) (*server, *remoteTool) {
	sname, ok := mcpfile.IsToolName(name)
	if !ok {
		return nil, nil
	}
	m.mu.Lock()
	s := m.servers[sname]
	m.mu.Unlock()
	if s == nil {
		return nil, nil
	}
	return s, s.tool(name)
}

// Specs returns the tools of every server, by server then in the order
// the server listed them. A server that went down keeps its last list,
// so a run sees the same tools and a call gets a clear error.
func (m *Manager) Specs() []keel.ToolSpec {
	var out []keel.ToolSpec
	for _, s := range m.list() {
		for _, t := range s.toolList() {
			out = append(out, t.spec)
		}
	}
	return out
}

// Info returns the tools of every server as tools.list shows them: with
// their provenance ("mcp:SERVER/TOOL") and the server's labels.
func (m *Manager) Info() []capabilities.ToolInfo {
	var out []capabilities.ToolInfo
	for _, s := range m.list() {
		for _, t := range s.toolList() {
			out = append(out, capabilities.ToolInfo{ToolSpec: t.spec, Labels: s.labels, Provenance: mcpfile.Provenance(s.name, t.remote)})
		}
	}
	return out
}

// Has reports whether name is the tool of a server now.
func (m *Manager) Has(name string) bool {
	_, t := m.lookup(name)
	return t != nil
}

// SideEffects returns the class of the tool name from its annotations
// (see Class); false when no server has it now.
func (m *Manager) SideEffects(name string) (keel.SideEffect, bool) {
	_, t := m.lookup(name)
	if t == nil {
		return "", false
	}
	return t.spec.SideEffects, true
}

// Servers declares the servers and their state, for env.describe. It
// never includes a server's headers.
func (m *Manager) Servers() []capabilities.MCPServerDecl {
	var out []capabilities.MCPServerDecl
	for _, s := range m.list() {
		out = append(out, s.decl())
	}
	return out
}

// FileError is why the servers file did not read last time, or nil.
func (m *Manager) FileError() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fileErr
}

// Call calls the tool inv names on its server, between the interceptors
// (Config.Interceptors). Its arguments are checked against the tool's
// input schema first; the call of an HTTP server's tool is an egress to
// its URL, decided by inv.Egress when set; the result carries the
// server's labels (inv.Touched.Labels). It fails only with a
// *keel.ToolError: not_found (no such tool now), invalid_input (the
// arguments break the schema), policy_denied (the egress), crashed (the
// server is down or its connection ended during the call: it may or may
// not have taken effect), timeout (no answer within the server's
// timeout, or ctx ended), tool_error (the server's error result or
// JSON-RPC error), resource_exhausted (a result over MaxOutputBytes).
func (m *Manager) Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	if inv.Touched != nil {
		*inv.Touched = keel.Touched{}
	}
	o := m.cfg.Interceptors.Call(ctx, inv, func(ctx context.Context) intercept.ToolOutcome {
		s, t := m.lookup(inv.Name)
		if t == nil {
			return intercept.ToolOutcome{Err: &keel.ToolError{Code: keel.ToolNotFound, Message: fmt.Sprintf("no tool named %q: no MCP server connected has it", inv.Name)}}
		}
		out, terr := s.call(ctx, t, inv)
		return intercept.ToolOutcome{Output: out, Err: terr, Build: s.build()}
	})
	if o.Err != nil {
		return nil, o.Err
	}
	return o.Output, nil
}
