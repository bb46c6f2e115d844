package daemon

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
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/store"
	"github.com/keel-runtime/keel/wasmtools"
	"github.com/keel-runtime/keel/wasmtools/builtin"
)

// grantTable is the in-memory copy of the stored grants that the
// registry consults (wasmtools.Config.GrantsFor). Writes go to the store
// first, so the table never holds a grant the database does not. Each
// row is bound to the module it was granted to: get gives a module of
// another digest nothing.
type grantTable struct {
	mu sync.Mutex
	m  map[string]store.ToolGrant
}

// get returns what the tool name is granted if its module has digest
// sum, nothing otherwise.
func (g *grantTable) get(name, sum string) capabilities.Grants {
	g.mu.Lock()
	defer g.mu.Unlock()
	if row, ok := g.m[name]; ok && row.SHA256 == sum {
		return row.Grants
	}
	return capabilities.Grants{}
}

// row returns the stored grants of name, whatever module they are bound
// to.
func (g *grantTable) row(name string) (store.ToolGrant, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	row, ok := g.m[name]
	return row, ok
}

func (g *grantTable) set(name string, v store.ToolGrant) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.m[name] = v
}

func (g *grantTable) delete(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.m, name)
}

// bindLegacyGrants binds the grants stored before they belonged to a
// tool's grant digest (wasmtools.GrantDigest) to the tool installed under
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
func bindLegacyGrants(ctx context.Context, st *store.Store, toolsDir string, rows map[string]store.ToolGrant, log *slog.Logger) error {
	for name, row := range rows {
		wasmSum, marked := strings.CutPrefix(row.SHA256, legacyWasmPrefix)
		if row.SHA256 != "" && !marked {
			continue
		}
		sum, digest, err := wasmtools.FileDigests(filepath.Join(toolsDir, name+".wasm"))
		switch {
		case err != nil && !marked:
			log.Warn("grants of a tool whose file is missing stay unbound; they apply to no module", "tool", name, "err", err)
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
		log.Info("tool grants bound", "tool", name, "grant_digest", row.SHA256)
	}
	return nil
}

// legacyWasmPrefix marks a stored grant bound to a .wasm file's digest
// alone, from before the digest covered the sidecar manifest.
const legacyWasmPrefix = "wasm:"

// toolsNotifier fans tool changes out to subscribers (the IPC server).
type toolsNotifier struct {
	mu   sync.Mutex
	next int
	subs map[int]func()
}

func (n *toolsNotifier) SubscribeTools(fn func()) (cancel func()) {
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

func (n *toolsNotifier) notify() {
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

// examplesMarker records that the bundled examples were installed once;
// a user who removes one does not get it back at the next start.
const examplesMarker = ".examples-installed"

// installExamples puts the bundled example tools into a new data dir and
// grants readfile the workspace, read-only: the one grant keel makes on
// the user's behalf, recorded like any other so it can be revoked.
func installExamples(ctx context.Context, st *store.Store, toolsDir, workspace string) error {
	marker := filepath.Join(toolsDir, examplesMarker)
	if _, err := os.Stat(marker); err == nil {
		return nil
	}
	if err := builtin.Install(toolsDir); err != nil {
		return err
	}
	_, sum, err := wasmtools.FileDigests(filepath.Join(toolsDir, "readfile.wasm"))
	if err != nil {
		return err
	}
	ro := capabilities.Grants{FS: []capabilities.FSGrant{{HostPath: workspace, GuestPath: "/workspace", ReadOnly: true}}}
	if err := st.SetToolGrants(ctx, "readfile", store.ToolGrant{SHA256: sum, Grants: ro}, time.Now()); err != nil {
		return err
	}
	return writeFileAtomic(marker, []byte("the bundled example tools were installed here once\n"), 0o600)
}

// toolManager installs, removes, grants and revokes tools. Every change
// is stored, then applied by reloading the registry.
type toolManager struct {
	*toolsNotifier // SubscribeTools: clients hear of tool changes
	reg            *wasmtools.Registry
	st             *store.Store
	grants         *grantTable
	dir            string
}

// ListTools serves tools.list: the installed tools, with the grants their
// names hold for other modules.
func (m *toolManager) ListTools(ctx context.Context) ([]protocol.ToolInfo, error) {
	tools := m.reg.Tools()
	out := make([]protocol.ToolInfo, len(tools))
	for i, t := range tools {
		out[i] = m.grants.withPending(toolInfo(t))
	}
	return out, nil
}

// CallTool serves tools.call: a direct call, no run (the registry's
// interceptors audit it).
func (m *toolManager) CallTool(ctx context.Context, name string, input json.RawMessage) (json.RawMessage, error) {
	return m.reg.Call(ctx, keel.ToolInvocation{Name: name, Args: input})
}

// ToolsProgress reports the compilation of the tools found at start.
func (m *toolManager) ToolsProgress() (loaded, total int, ready bool) { return m.reg.Progress() }

// info returns the installed tool name. Every manager method starts with
// it (or waitReady), so none acts on the partial set seen while the tools
// found at start are still compiling.
func (m *toolManager) info(ctx context.Context, name string) (protocol.ToolInfo, error) {
	if err := m.reg.WaitReady(ctx); err != nil {
		return protocol.ToolInfo{}, fmt.Errorf("tools are still compiling: %w", err)
	}
	if t, ok := m.reg.Tool(name); ok {
		return m.grants.withPending(toolInfo(t)), nil
	}
	return protocol.ToolInfo{}, fmt.Errorf("no tool named %q is installed: %w", name, keel.ErrNotFound)
}

func toolInfo(t wasmtools.Tool) protocol.ToolInfo {
	return protocol.ToolInfo{ToolSpec: t.Spec, Requests: t.Requests, Grants: t.Grants, SHA256: t.SHA256, GrantDigest: t.GrantDigest, Compiling: t.Compiling}
}

// withPending adds to info the grants its name holds for another module.
func (g *grantTable) withPending(info protocol.ToolInfo) protocol.ToolInfo {
	if row, ok := g.row(info.Name); ok && row.SHA256 != info.GrantDigest && info.GrantDigest != "" && !row.Grants.Empty() {
		info.PendingGrants = &protocol.PendingGrants{SHA256: row.SHA256, Grants: row.Grants}
	}
	return info
}

func (m *toolManager) inspect(ctx context.Context, file string) (wasmtools.Tool, error) {
	t, err := m.reg.Inspect(ctx, file)
	if err != nil {
		switch {
		case errors.Is(err, keel.ErrUnusableTool):
			// The file is at fault, not the request: its own error class.
			return wasmtools.Tool{}, err
		case errors.Is(err, os.ErrNotExist):
			return wasmtools.Tool{}, fmt.Errorf("%s does not exist: %w", file, keel.ErrInvalid)
		}
		return wasmtools.Tool{}, fmt.Errorf("%w: %w", keel.ErrInvalid, err)
	}
	return t, nil
}

func (m *toolManager) InspectTool(ctx context.Context, file string) (protocol.ToolInfo, error) {
	t, err := m.inspect(ctx, file)
	if err != nil {
		return protocol.ToolInfo{}, err
	}
	return toolInfo(t), nil
}

// InstallTool validates the file, checks the grants against what it
// requests, stores them bound to the file's digest, copies the module in
// atomically and reloads. With KeepGrants, the replaced tool's grants
// that the new module still requests are carried to it.
func (m *toolManager) InstallTool(ctx context.Context, p protocol.ToolsInstallParams) (protocol.ToolInfo, error) {
	if p.KeepGrants && !p.Replace {
		return protocol.ToolInfo{}, fmt.Errorf("keep_grants carries the grants of a tool being replaced: it needs replace: %w", keel.ErrInvalid)
	}
	t, err := m.inspect(ctx, p.Path)
	if err != nil {
		return protocol.ToolInfo{}, err
	}
	name := t.Spec.Name
	if _, err := m.info(ctx, name); err == nil && !p.Replace {
		return protocol.ToolInfo{}, fmt.Errorf("a tool named %s is already installed; replace it with --replace (the replace parameter of tools.install): %w", name, keel.ErrConflict)
	}
	g, err := wasmtools.CheckGrants(t.Requests, p.Grants)
	if err != nil {
		return protocol.ToolInfo{}, err
	}
	if old, ok := m.grants.row(name); ok && p.KeepGrants {
		g = wasmtools.CarryGrants(t.Requests, old.Grants).Add(g)
	}
	row := store.ToolGrant{SHA256: t.GrantDigest, Grants: g}
	if err := m.st.SetToolGrants(ctx, name, row, time.Now()); err != nil {
		return protocol.ToolInfo{}, err
	}
	m.grants.set(name, row)
	side := strings.TrimSuffix(p.Path, ".wasm") + ".manifest.json"
	dstSide := filepath.Join(m.dir, name+".manifest.json")
	if _, err := os.Stat(side); err == nil {
		if err := copyFile(side, dstSide); err != nil {
			return protocol.ToolInfo{}, err
		}
	} else if err := os.Remove(dstSide); err != nil && !errors.Is(err, os.ErrNotExist) {
		// A sidecar left from the tool being replaced would win over the
		// new module's own manifest.
		return protocol.ToolInfo{}, err
	}
	// Should the file change between the inspection and this copy, the
	// module copied has another digest and the grants do not apply to it.
	if err := copyFile(p.Path, filepath.Join(m.dir, name+".wasm")); err != nil {
		return protocol.ToolInfo{}, err
	}
	if _, err := m.reg.Reload(ctx); err != nil {
		return protocol.ToolInfo{}, err
	}
	return m.info(ctx, name)
}

func (m *toolManager) RemoveTool(ctx context.Context, name string) error {
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
func (m *toolManager) GrantTool(ctx context.Context, p protocol.ToolsGrantParams) (protocol.ToolInfo, error) {
	info, err := m.info(ctx, p.Name)
	if err != nil {
		return protocol.ToolInfo{}, err
	}
	add, err := wasmtools.CheckGrants(info.Requests, p.Grants)
	if err != nil {
		return protocol.ToolInfo{}, err
	}
	next := m.grants.get(p.Name, info.GrantDigest)
	switch {
	case p.Confirm != "" && p.Confirm != info.GrantDigest:
		return protocol.ToolInfo{}, fmt.Errorf("tool %s now has grant digest %s, not %s: look at it again before confirming: %w", p.Name, info.GrantDigest, p.Confirm, keel.ErrConflict)
	case p.Confirm != "" && info.PendingGrants == nil:
		return protocol.ToolInfo{}, fmt.Errorf("tool %s has no grants pending confirmation: %w", p.Name, keel.ErrInvalid)
	case p.Confirm != "":
		next = wasmtools.CarryGrants(info.Requests, info.PendingGrants.Grants)
	case info.PendingGrants != nil:
		return protocol.ToolInfo{}, fmt.Errorf("tool %s was replaced (grant digest %s, granted as %s): confirm its earlier grants with `keel tools grant %s --confirm %s`, or revoke them with `keel tools revoke %s --all`: %w",
			p.Name, info.GrantDigest, info.PendingGrants.SHA256, p.Name, info.GrantDigest, p.Name, keel.ErrConflict)
	}
	return m.store(ctx, p.Name, store.ToolGrant{SHA256: info.GrantDigest, Grants: next.Add(add)})
}

// RevokeTool takes grants back. Entries are taken from the stored grants,
// pending or not, which stay bound to their module; revoking all leaves
// the installed module granted nothing.
func (m *toolManager) RevokeTool(ctx context.Context, p protocol.ToolsRevokeParams) (protocol.ToolInfo, error) {
	info, err := m.info(ctx, p.Name)
	if err != nil {
		return protocol.ToolInfo{}, err
	}
	next := store.ToolGrant{SHA256: info.GrantDigest}
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

func (m *toolManager) store(ctx context.Context, name string, row store.ToolGrant) (protocol.ToolInfo, error) {
	if err := m.st.SetToolGrants(ctx, name, row, time.Now()); err != nil {
		return protocol.ToolInfo{}, err
	}
	m.grants.set(name, row)
	if _, err := m.reg.Reload(ctx); err != nil {
		return protocol.ToolInfo{}, err
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
