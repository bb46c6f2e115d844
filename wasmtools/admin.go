package wasmtools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/internal/atomicfile"
	"github.com/keel-runtime/keel/internal/logkey"
)

// GrantStore keeps the grants of tools, each bound to the module it was
// granted to (the store serves it). ToolGrants returns every row by tool
// name.
type GrantStore interface {
	ToolGrants(ctx context.Context) (map[string]capabilities.BoundGrants, error)
	SetToolGrants(ctx context.Context, tool string, g capabilities.BoundGrants, at time.Time) error
	DeleteToolGrants(ctx context.Context, tool string) error
}

// GrantTable is the in-memory copy of the stored grants that the
// registry consults (Config.GrantsFor is its Get). An Admin writes to
// the store first, so the table never holds a grant the database does
// not. Each row is bound to the module it was granted to: Get gives a
// module of another digest nothing. Safe for concurrent use.
type GrantTable struct {
	mu sync.Mutex
	m  map[string]capabilities.BoundGrants
}

// LoadGrants reads the stored grants, binds those stored before grants
// belonged to a grant digest (see BindLegacyGrants) and returns them as a
// table.
func LoadGrants(ctx context.Context, st GrantStore, toolsDir string, log *slog.Logger) (*GrantTable, error) {
	rows, err := st.ToolGrants(ctx)
	if err != nil {
		return nil, fmt.Errorf("load tool grants: %w", err)
	}
	if err := bindLegacyGrants(ctx, st, toolsDir, rows, log); err != nil {
		return nil, fmt.Errorf("bind tool grants to their modules: %w", err)
	}
	return &GrantTable{m: rows}, nil
}

// Get returns what the tool name is granted if its module has digest
// sum, nothing otherwise.
func (g *GrantTable) Get(name, sum string) capabilities.Grants {
	g.mu.Lock()
	defer g.mu.Unlock()
	if row, ok := g.m[name]; ok && row.SHA256 == sum {
		return row.Grants
	}
	return capabilities.Grants{}
}

// row returns the stored grants of name, whatever module they are bound
// to.
func (g *GrantTable) row(name string) (capabilities.BoundGrants, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	row, ok := g.m[name]
	return row, ok
}

func (g *GrantTable) set(name string, v capabilities.BoundGrants) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.m[name] = v
}

func (g *GrantTable) delete(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.m, name)
}

// bindLegacyGrants binds the grants stored before they belonged to a
// tool's grant digest (GrantDigest) to the tool installed under
// that name now, as the user's grant was meant for it:
//   - rows from before grants were bound to a module (no digest) are
//     bound to the installed tool;
//   - rows from before the digest covered the sidecar manifest ("wasm:"
//     and the .wasm digest, marked once by store migration 011) are bound
//     to the installed tool if its .wasm file still has that digest, its
//     sidecar included; else they stay bound to that earlier module.
//
// A row whose tool file is gone stays unbound: it applies to nothing, and
// installing the tool replaces it.
func bindLegacyGrants(ctx context.Context, st GrantStore, toolsDir string, rows map[string]capabilities.BoundGrants, log *slog.Logger) error {
	for name, row := range rows {
		wasmSum, marked := strings.CutPrefix(row.SHA256, legacyWasmPrefix)
		if row.SHA256 != "" && !marked {
			continue
		}
		sum, digest, err := FileDigests(filepath.Join(toolsDir, name+".wasm"))
		switch {
		case err != nil && !marked:
			log.Warn("grants of a tool whose file is missing stay unbound; they apply to no module", logkey.Tool, name, logkey.Err, err)
			continue
		case marked && (err != nil || sum != wasmSum):
			row.SHA256 = wasmSum // pending, for the module it was granted
		default:
			row.SHA256 = digest
		}
		if err := st.SetToolGrants(ctx, name, row, time.Now()); err != nil {
			return err
		}
		rows[name] = row
		log.Info("tool grants bound", logkey.Tool, name, logkey.GrantDigest, row.SHA256)
	}
	return nil
}

// legacyWasmPrefix marks a stored grant bound to a .wasm file's digest
// alone, from before the digest covered the sidecar manifest.
const legacyWasmPrefix = "wasm:"

// Changes fans tool changes out to subscribers (the protocol server,
// which tells every client). Its Notify is the registry's
// Config.OnChange. The zero value is ready; safe for concurrent use.
type Changes struct {
	mu   sync.Mutex
	next int
	subs map[int]func()
}

// SubscribeTools calls fn after every change until cancel is called. fn
// must not block.
func (n *Changes) SubscribeTools(fn func()) (cancel func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.subs == nil {
		n.subs = map[int]func(){}
	}
	id := n.next
	n.next++
	n.subs[id] = fn
	return func() {
		n.mu.Lock()
		delete(n.subs, id)
		n.mu.Unlock()
	}
}

// Notify calls every subscriber.
func (n *Changes) Notify() {
	n.mu.Lock()
	fns := make([]func(), 0, len(n.subs))
	for _, fn := range n.subs {
		fns = append(fns, fn)
	}
	n.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

// Admin installs, removes, grants and revokes the tools of a registry,
// and lists and calls them: it serves the protocol's tool
// administration (tools.inspect, install, remove, grant, revoke) and its
// tools (tools.list, tools.call, tools.changed). Every change is stored, then applied by reloading the
// registry. Safe for concurrent use.
type Admin struct {
	*Changes // SubscribeTools: clients hear of tool changes
	reg      *Registry
	st       GrantStore
	grants   *GrantTable
	dir      string

	// DirectEgress, when set, gives the check of the network requests
	// of a direct call (CallTool) of a tool: the policy's egress
	// decision (see keel.ToolInvocation.Egress). Unset, a direct call
	// may make every request its grants allow. Set it before the Admin
	// is used.
	DirectEgress func(tool string) keel.EgressCheck
}

// NewAdmin returns the administration of reg, whose Config.GrantsFor is
// grants.Get and Config.OnChange changes.Notify; grants are stored in
// st.
func NewAdmin(reg *Registry, st GrantStore, grants *GrantTable, changes *Changes) *Admin {
	return &Admin{Changes: changes, reg: reg, st: st, grants: grants, dir: reg.cfg.Dir}
}

// ListTools serves tools.list: the installed tools, with the grants their
// names hold for other modules.
func (m *Admin) ListTools(ctx context.Context) ([]capabilities.ToolInfo, error) {
	tools := m.reg.Tools()
	out := make([]capabilities.ToolInfo, len(tools))
	for i, t := range tools {
		out[i] = m.Info(t)
	}
	return out, nil
}

// CallTool serves tools.call: a direct call, in no run. The registry's
// interceptors (the audit trail first) see it as they see a run's; its
// network requests are checked by DirectEgress, and what it touched
// (keel.ToolInvocation.Touched) is there for the interceptors' After
// hooks: the audit trail records its hosts, labels and refusals.
// client names who asked, as it declared itself (the audit record's
// client; empty: no one named).
func (m *Admin) CallTool(ctx context.Context, name string, input json.RawMessage, client string) (json.RawMessage, error) {
	return m.Call(ctx, keel.ToolInvocation{Name: name, Args: input, Client: client})
}

// Call is CallTool of inv (its Name, Args, Client and Policy, the
// decision that let it run, for the audit trail): a direct call, in no
// run, whose Touched and Egress it sets.
func (m *Admin) Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	inv.Touched = &keel.Touched{}
	inv.Egress = nil
	if m.DirectEgress != nil {
		inv.Egress = m.DirectEgress(inv.Name)
	}
	return m.reg.Call(ctx, inv)
}

// ToolsProgress reports the compilation of the tools found at start.
func (m *Admin) ToolsProgress() (loaded, total int, ready bool) { return m.reg.Progress() }

// info returns the installed tool name. Every manager method starts with
// it (or waitReady), so none acts on the partial set seen while the tools
// found at start are still compiling.
func (m *Admin) info(ctx context.Context, name string) (capabilities.ToolInfo, error) {
	if err := m.reg.WaitReady(ctx); err != nil {
		return capabilities.ToolInfo{}, fmt.Errorf("tools are still compiling: %w", err)
	}
	if t, ok := m.reg.Tool(name); ok {
		return m.Info(t), nil
	}
	return capabilities.ToolInfo{}, fmt.Errorf("no tool named %q is installed: %w", name, keel.ErrNotFound)
}

// Info returns t as the protocol shows it, with the grants its name
// holds for another module (PendingGrants).
func (m *Admin) Info(t Tool) capabilities.ToolInfo {
	return m.grants.withPending(toolInfo(t))
}

func toolInfo(t Tool) capabilities.ToolInfo {
	return capabilities.ToolInfo{ToolSpec: t.Spec, Requests: t.Requests, Grants: t.Grants, Labels: t.Labels, SHA256: t.SHA256, GrantDigest: t.GrantDigest, Compiling: t.Compiling}
}

// withPending adds to info the grants its name holds for another module.
func (g *GrantTable) withPending(info capabilities.ToolInfo) capabilities.ToolInfo {
	if row, ok := g.row(info.Name); ok && row.SHA256 != info.GrantDigest && info.GrantDigest != "" && !row.Grants.Empty() {
		info.PendingGrants = &capabilities.PendingGrants{SHA256: row.SHA256, Grants: row.Grants}
	}
	return info
}

func (m *Admin) inspect(ctx context.Context, file string) (Tool, error) {
	t, err := m.reg.Inspect(ctx, file)
	if err != nil {
		switch {
		case errors.Is(err, keel.ErrUnusableTool):
			// The file is at fault, not the request: its own error class.
			return Tool{}, err
		case errors.Is(err, os.ErrNotExist):
			return Tool{}, fmt.Errorf("%s does not exist: %w", file, keel.ErrInvalid)
		}
		return Tool{}, fmt.Errorf("%w: %w", keel.ErrInvalid, err)
	}
	return t, nil
}

func (m *Admin) InspectTool(ctx context.Context, file string) (capabilities.ToolInfo, error) {
	t, err := m.inspect(ctx, file)
	if err != nil {
		return capabilities.ToolInfo{}, err
	}
	return toolInfo(t), nil
}

// InstallTool validates the file, checks the grants against what it
// requests, stores them bound to the file's digest, copies the module in
// atomically and reloads. With KeepGrants, the replaced tool's grants
// that the new module still requests are carried to it.
func (m *Admin) InstallTool(ctx context.Context, p capabilities.InstallRequest) (capabilities.ToolInfo, error) {
	if p.KeepGrants && !p.Replace {
		return capabilities.ToolInfo{}, fmt.Errorf("keep_grants carries the grants of a tool being replaced: it needs replace: %w", keel.ErrInvalid)
	}
	t, err := m.inspect(ctx, p.Path)
	if err != nil {
		return capabilities.ToolInfo{}, err
	}
	name := t.Spec.Name
	if _, err := m.info(ctx, name); err == nil && !p.Replace {
		return capabilities.ToolInfo{}, fmt.Errorf("a tool named %s is already installed; replace it with --replace (the replace parameter of tools.install): %w", name, keel.ErrConflict)
	}
	g, err := CheckGrants(t.Requests, p.Grants)
	if err != nil {
		return capabilities.ToolInfo{}, err
	}
	if old, ok := m.grants.row(name); ok && p.KeepGrants {
		g = CarryGrants(t.Requests, old.Grants).Add(g)
	}
	row := capabilities.BoundGrants{SHA256: t.GrantDigest, Grants: g}
	if err := m.st.SetToolGrants(ctx, name, row, time.Now()); err != nil {
		return capabilities.ToolInfo{}, err
	}
	m.grants.set(name, row)
	side := strings.TrimSuffix(p.Path, ".wasm") + ".manifest.json"
	dstSide := filepath.Join(m.dir, name+".manifest.json")
	if _, err := os.Stat(side); err == nil {
		if err := copyFile(side, dstSide); err != nil {
			return capabilities.ToolInfo{}, err
		}
	} else if err := os.Remove(dstSide); err != nil && !errors.Is(err, os.ErrNotExist) {
		// A sidecar left from the tool being replaced would win over the
		// new module's own manifest.
		return capabilities.ToolInfo{}, err
	}
	// Should the file change between the inspection and this copy, the
	// module copied has another digest and the grants do not apply to it.
	if err := copyFile(p.Path, filepath.Join(m.dir, name+".wasm")); err != nil {
		return capabilities.ToolInfo{}, err
	}
	if _, err := m.reg.Reload(ctx); err != nil {
		return capabilities.ToolInfo{}, err
	}
	return m.info(ctx, name)
}

func (m *Admin) RemoveTool(ctx context.Context, name string) error {
	if _, err := m.info(ctx, name); err != nil {
		return err
	}
	for _, f := range []string{name + ".wasm", name + ".manifest.json"} {
		if err := os.Remove(filepath.Join(m.dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := m.st.DeleteToolGrants(ctx, name); err != nil {
		return err
	}
	m.grants.delete(name)
	_, err := m.reg.Reload(ctx)
	return err
}

// GrantTool adds grants to the installed module of a tool. While the tool has
// grants pending (given to a module of another digest), a grant must
// confirm them (p.Confirm, the installed digest), which carries those the
// module requests to it; a plain grant is refused, so none is lost
// unnoticed.
func (m *Admin) GrantTool(ctx context.Context, p capabilities.GrantRequest) (capabilities.ToolInfo, error) {
	info, err := m.info(ctx, p.Name)
	if err != nil {
		return capabilities.ToolInfo{}, err
	}
	add, err := CheckGrants(info.Requests, p.Grants)
	if err != nil {
		return capabilities.ToolInfo{}, err
	}
	next := m.grants.Get(p.Name, info.GrantDigest)
	switch {
	case p.Confirm != "" && p.Confirm != info.GrantDigest:
		return capabilities.ToolInfo{}, fmt.Errorf("tool %s now has grant digest %s, not %s: look at it again before confirming: %w", p.Name, info.GrantDigest, p.Confirm, keel.ErrConflict)
	case p.Confirm != "" && info.PendingGrants == nil:
		return capabilities.ToolInfo{}, fmt.Errorf("tool %s has no grants pending confirmation: %w", p.Name, keel.ErrInvalid)
	case p.Confirm != "":
		next = CarryGrants(info.Requests, info.PendingGrants.Grants)
	case info.PendingGrants != nil:
		return capabilities.ToolInfo{}, fmt.Errorf("tool %s was replaced (grant digest %s, granted as %s): confirm its earlier grants with `keel tools grant %s --confirm %s`, or revoke them with `keel tools revoke %s --all`: %w",
			p.Name, info.GrantDigest, info.PendingGrants.SHA256, p.Name, info.GrantDigest, p.Name, keel.ErrConflict)
	}
	return m.store(ctx, p.Name, capabilities.BoundGrants{SHA256: info.GrantDigest, Grants: next.Add(add)})
}

// RevokeTool takes grants back. Entries are taken from the stored grants,
// pending or not, which stay bound to their module; revoking all leaves
// the installed module granted nothing.
func (m *Admin) RevokeTool(ctx context.Context, p capabilities.RevokeRequest) (capabilities.ToolInfo, error) {
	info, err := m.info(ctx, p.Name)
	if err != nil {
		return capabilities.ToolInfo{}, err
	}
	next := capabilities.BoundGrants{SHA256: info.GrantDigest}
	if cur, ok := m.grants.row(p.Name); ok && !p.All {
		next.SHA256 = cur.SHA256
		next.Grants.FS = slices.DeleteFunc(slices.Clone(cur.Grants.FS), func(e capabilities.FSGrant) bool {
			return slices.ContainsFunc(p.Grants.FS, func(r capabilities.FSGrant) bool { return path.Clean(r.GuestPath) == e.GuestPath })
		})
		next.Grants.Network = slices.DeleteFunc(slices.Clone(cur.Grants.Network), func(n string) bool { return slices.Contains(p.Grants.Network, n) })
		next.Grants.Env = slices.DeleteFunc(slices.Clone(cur.Grants.Env), func(n string) bool { return slices.Contains(p.Grants.Env, n) })
		next.Grants.Limits = cur.Grants.Limits.Without(p.Grants.Limits)
	}
	return m.store(ctx, p.Name, next)
}

func (m *Admin) store(ctx context.Context, name string, row capabilities.BoundGrants) (capabilities.ToolInfo, error) {
	if err := m.st.SetToolGrants(ctx, name, row, time.Now()); err != nil {
		return capabilities.ToolInfo{}, err
	}
	m.grants.set(name, row)
	if _, err := m.reg.Reload(ctx); err != nil {
		return capabilities.ToolInfo{}, err
	}
	return m.info(ctx, name)
}

// copyFile copies src to dst atomically (temp file, fsync, rename), so a
// watcher never loads half a module.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return atomicfile.Write(dst, in, 0o600)
}

// Declare declares the tools loaded now, with their grants and the
// grants their names hold for other modules, and counts the tool files
// found at start that are still compiling (env.describe).
func (m *Admin) Declare() (tools []capabilities.ToolDecl, compiling int) {
	for _, t := range m.reg.Tools() {
		tools = append(tools, capabilities.ToolDecl{Name: t.Spec.Name, Version: t.Spec.Version,
			SideEffects: string(t.Spec.SideEffects), SHA256: t.SHA256, GrantDigest: t.GrantDigest, Grants: t.Grants,
			PendingGrants: m.Info(t).PendingGrants})
	}
	if loaded, total, ready := m.reg.Progress(); !ready {
		compiling = total - loaded
	}
	return tools, compiling
}
