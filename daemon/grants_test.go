package daemon_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
	"github.com/keel-runtime/keel/wasmtools"
)

// withCustomSection returns the module bin with a custom section
// appended: another digest, the same behaviour. (It has a payload:
// wazero fails to read an empty custom section at the end of a module.)
func withCustomSection(bin []byte) []byte {
	name := "keel-test"
	sec := append([]byte{byte(len(name))}, name+"!"...)
	return append(append(slices.Clone(bin), 0, byte(len(sec))), sec...)
}

func hexSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// toolInfo returns what tools.list says of name, if it lists it.
func toolInfo(t *testing.T, c *client.Client, name string) protocol.ToolInfo {
	t.Helper()
	tools, err := c.ListTools(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range tools {
		if tl.Name == name {
			return tl
		}
	}
	return protocol.ToolInfo{}
}

// waitTool waits until tools.list has the tool name loaded (not
// compiling) and ok holds of it, and returns what it says of the tool;
// see waitTools.
func waitTool(t *testing.T, c *client.Client, name, what string, ok func(protocol.ToolInfo) bool) protocol.ToolInfo {
	t.Helper()
	var info protocol.ToolInfo
	waitTools(t, c, what, func(tools []protocol.ToolInfo) bool {
		i := slices.IndexFunc(tools, func(tl protocol.ToolInfo) bool { return tl.Name == name })
		if i < 0 || tools[i].Compiling || !ok(tools[i]) {
			return false
		}
		info = tools[i]
		return true
	})
	return info
}

// waitDigest waits until the tool name is the module of digest sum.
func waitDigest(t *testing.T, c *client.Client, name, sum string) protocol.ToolInfo {
	t.Helper()
	return waitTool(t, c, name, name+" the module of sha256 "+sum, func(info protocol.ToolInfo) bool { return info.SHA256 == sum })
}

// TestGrantsBoundToDigest: grants belong to a module. A writefile of
// another digest dropped into the tools directory writes nothing until
// the user confirms, seeing both digests; `tools install --replace`
// carries grants only with --keep-grants; the audit names the digest
// that used each grant; grants stored by name before are bound to the
// installed module at the next start.
func TestGrantsBoundToDigest(t *testing.T) {
	t.Parallel()
	d, c, keelCLI, toolFile, orig := writefileDaemon(t)
	ctx := context.Background()
	origSum := hexSHA256(orig)
	waitDigest(t, c, "writefile", origSum)
	out := t.TempDir()
	write := func(file string) error {
		_, err := c.CallTool(ctx, "writefile", json.RawMessage(`{"path":"`+file+`","content":"x"}`))
		return err
	}
	written := func(file string) bool {
		_, err := os.Stat(filepath.Join(out, file))
		return err == nil
	}
	lastAudit := func() (sum string, grants []string) {
		t.Helper()
		recs, err := c.ToolAudit(ctx, "writefile", 1)
		if err != nil || len(recs) != 1 {
			t.Fatalf("audit = %v, %v", recs, err)
		}
		return recs[0].SHA256, recs[0].Grants
	}

	if s, code := keelCLI("tools", "grant", "writefile", "fs:/workspace="+out); code != 0 {
		t.Fatalf("grant: code %d\n%s", code, s)
	}
	if err := write("a.txt"); err != nil || !written("a.txt") {
		t.Fatalf("write with the grant: %v", err)
	}
	if sum, grants := lastAudit(); sum != origSum || !slices.Equal(grants, []string{"fs:/workspace=rw"}) {
		t.Errorf("audit of the granted call = %s %v, want %s [fs:/workspace=rw]", sum, grants, origSum)
	}

	// A module of another digest dropped in gets nothing.
	other := writefileVariant
	otherSum := hexSHA256(other)
	if err := os.WriteFile(toolFile+".tmp", other, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(toolFile+".tmp", toolFile); err != nil {
		t.Fatal(err)
	}
	info := waitDigest(t, c, "writefile", otherSum)
	if !info.Grants.Empty() {
		t.Errorf("replaced writefile has grants %+v, want none", info.Grants)
	}
	want := &protocol.PendingGrants{SHA256: origSum, Grants: capabilities.Grants{FS: []capabilities.FSGrant{{HostPath: out, GuestPath: "/workspace"}}}}
	if p := info.PendingGrants; p == nil || p.SHA256 != want.SHA256 || !slices.EqualFunc(p.Grants.FS, want.Grants.FS, capabilities.FSGrant.Equal) {
		t.Errorf("pending grants = %+v, want %+v", p, want)
	}
	if err := write("b.txt"); err == nil || !strings.Contains(err.Error(), "permission_denied") || written("b.txt") {
		t.Fatalf("write by the replaced module = %v (file written: %v), want permission_denied and nothing written", err, written("b.txt"))
	}
	for _, cmd := range [][]string{{"tools", "list"}, {"doctor"}} {
		s, _ := keelCLI(cmd...)
		if !strings.Contains(s, origSum) || !strings.Contains(s, otherSum) || !strings.Contains(s, "--confirm "+otherSum) {
			t.Errorf("keel %s does not show both digests and how to confirm:\n%s", strings.Join(cmd, " "), s)
		}
	}
	// A plain grant does not silently drop or carry the pending ones; a
	// confirmation must name the module installed now.
	if s, code := keelCLI("tools", "grant", "writefile", "fs:/workspace="+out); code == 0 || !strings.Contains(s, "--confirm") {
		t.Errorf("plain grant with grants pending: code %d\n%s", code, s)
	}
	if s, code := keelCLI("tools", "grant", "writefile", "--confirm", origSum); code == 0 {
		t.Errorf("confirm naming the old digest: code %d\n%s", code, s)
	}
	if err := write("b.txt"); err == nil {
		t.Fatal("refused grants gave the replaced module its grants")
	}
	if s, code := keelCLI("tools", "grant", "writefile", "--confirm", otherSum); code != 0 || !strings.Contains(s, out) {
		t.Fatalf("confirm: code %d\n%s", code, s)
	}
	if err := write("b.txt"); err != nil || !written("b.txt") {
		t.Fatalf("write after confirming: %v", err)
	}
	if sum, _ := lastAudit(); sum != otherSum {
		t.Errorf("audit of the confirmed call names sha256 %s, want %s", sum, otherSum)
	}
	if toolInfo(t, c, "writefile").PendingGrants != nil {
		t.Error("grants still pending after confirming")
	}

	// install --replace keeps grants only when told to.
	src := filepath.Join(t.TempDir(), "writefile.wasm")
	if err := os.WriteFile(src, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if s, code := keelCLI("tools", "install", "--replace", "--keep-grants", src); code != 0 {
		t.Fatalf("install --replace --keep-grants: code %d\n%s", code, s)
	}
	waitDigest(t, c, "writefile", origSum)
	if err := write("c.txt"); err != nil {
		t.Fatalf("write after install --keep-grants: %v", err)
	}
	if err := os.WriteFile(src, other, 0o600); err != nil {
		t.Fatal(err)
	}
	if s, code := keelCLI("tools", "install", "--replace", src); code != 0 || !strings.Contains(s, "granted: nothing") {
		t.Fatalf("install --replace: code %d\n%s", code, s)
	}
	info = waitDigest(t, c, "writefile", otherSum)
	if err := write("d.txt"); err == nil || written("d.txt") || info.PendingGrants != nil {
		t.Fatalf("after install --replace without --keep-grants: write %v, pending %+v; want refused, none pending", err, info.PendingGrants)
	}

	// Grants stored by name alone (before this schema) are bound to the
	// module installed at the next start.
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(d.dir, "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	legacy := store.ToolGrant{Grants: capabilities.Grants{FS: []capabilities.FSGrant{{HostPath: out, GuestPath: "/workspace"}}}}
	if err := st.SetToolGrants(ctx, "writefile", legacy, time.Now()); err != nil {
		t.Fatal(err)
	}
	st.Close()
	d2 := startDaemon(t, daemon.Config{DataDir: d.dir, Provider: scripted.New(nil)})
	c = dial(t, d2.dir)
	waitDigest(t, c, "writefile", otherSum)
	if err := write("e.txt"); err != nil || !written("e.txt") {
		t.Fatalf("write with a grant stored by name before: %v", err)
	}
	if err := d2.stop(); err != nil {
		t.Fatal(err)
	}
	st, err = store.Open(ctx, filepath.Join(d.dir, "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rows, err := st.ToolGrants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rows["writefile"].SHA256 != otherSum {
		t.Errorf("stored grant of writefile bound to %q, want %s", rows["writefile"].SHA256, otherSum)
	}
}

// TestToolsWriteQuota: the daemon passes its write quota to the tools:
// writefile may write 8 bytes in a call, not 100.
func TestToolsWriteQuota(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemon.Config{DataDir: withTools(t, "writefile"), Provider: scripted.New(nil), ToolsWriteQuotaBytes: 16})
	c := dial(t, d.dir)
	ctx := context.Background()
	out := t.TempDir()
	if s, _, code := runCLI(ctx, d.dir, "tools", "grant", "writefile", "fs:/workspace="+out); code != 0 {
		t.Fatalf("grant: code %d\n%s", code, s)
	}
	if _, err := c.CallTool(ctx, "writefile", json.RawMessage(`{"path":"small.txt","content":"8 bytes!"}`)); err != nil {
		t.Fatalf("a write within the quota: %v", err)
	}
	_, err := c.CallTool(ctx, "writefile", json.RawMessage(`{"path":"big.txt","content":"`+strings.Repeat("x", 100)+`"}`))
	if err == nil || !strings.Contains(err.Error(), "resource_exhausted") || !strings.Contains(err.Error(), "16 bytes") {
		t.Errorf("a write of 100 bytes with a quota of 16 = %v, want resource_exhausted naming the quota", err)
	}
	if fi, err := os.Stat(filepath.Join(out, "big.txt")); err == nil && fi.Size() > 16 {
		t.Errorf("big.txt has %d bytes, over the quota", fi.Size())
	}
}

// TestGrantsCoverSidecar: grants belong to a module and its sidecar
// manifest. A new sidecar beside the same writefile module (relabelled
// read_only, which would dodge approval) gets none of its grants until
// the user confirms its grant digest; grants stored bound to the module's
// digest alone, before the digest covered the sidecar, are bound to the
// installed module and sidecar at the next start.
func TestGrantsCoverSidecar(t *testing.T) {
	t.Parallel()
	d, c, keelCLI, _, orig := writefileDaemon(t)
	ctx := context.Background()
	origSum := hexSHA256(orig)
	info := waitDigest(t, c, "writefile", origSum)
	out := t.TempDir()
	write := func(file string) error {
		_, err := c.CallTool(ctx, "writefile", json.RawMessage(`{"path":"`+file+`","content":"x"}`))
		return err
	}
	written := func(file string) bool {
		_, err := os.Stat(filepath.Join(out, file))
		return err == nil
	}
	// putSidecar writes writefile's own manifest as a sidecar, with
	// another description and side_effects, and waits until it is loaded.
	putSidecar := func(desc string, effects keel.SideEffect) (protocol.ToolInfo, []byte) {
		t.Helper()
		m := map[string]any{
			"name": "writefile", "version": info.Version, "description": desc,
			"input_schema": info.InputSchema, "side_effects": effects,
			"requests": map[string]any{"fs": []map[string]any{{"guest_path": "/workspace", "read_only": false}}},
		}
		if len(info.OutputSchema) > 0 {
			m["output_schema"] = info.OutputSchema
		}
		side, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(d.dir, "tools", "writefile.manifest.json")
		if err := os.WriteFile(file+".tmp", side, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
		got := waitTool(t, c, "writefile", "writefile with the sidecar describing it as "+desc, func(info protocol.ToolInfo) bool { return info.Description == desc })
		return got, side
	}

	first, side := putSidecar("writes a file (first sidecar)", keel.SideEffectIdempotentWrite)
	if want := wasmtools.GrantDigest(origSum, side); first.SHA256 != origSum || first.GrantDigest != want {
		t.Errorf("with a sidecar: sha256 %s, grant digest %s; want %s, %s", first.SHA256, first.GrantDigest, origSum, want)
	}
	if s, code := keelCLI("tools", "grant", "writefile", "fs:/workspace="+out); code != 0 {
		t.Fatalf("grant: code %d\n%s", code, s)
	}
	if err := write("a.txt"); err != nil || !written("a.txt") {
		t.Fatalf("write with the grant: %v", err)
	}

	// Only the sidecar changes: the same module, relabelled read_only.
	second, side := putSidecar("writes a file (second sidecar)", keel.SideEffectReadOnly)
	if second.SHA256 != origSum {
		t.Fatalf("module sha256 = %s after a new sidecar, want %s (unchanged)", second.SHA256, origSum)
	}
	if !second.Grants.Empty() {
		t.Errorf("writefile with a new sidecar has grants %+v, want none", second.Grants)
	}
	if p := second.PendingGrants; p == nil || p.SHA256 != first.GrantDigest || len(p.Grants.FS) != 1 || p.Grants.FS[0].HostPath != out {
		t.Errorf("pending grants = %+v, want fs:/workspace=%s given to %s", p, out, first.GrantDigest)
	}
	if err := write("b.txt"); err == nil || !strings.Contains(err.Error(), "permission_denied") || written("b.txt") {
		t.Fatalf("write under a new sidecar = %v (file written: %v), want permission_denied and nothing written", err, written("b.txt"))
	}
	if want := wasmtools.GrantDigest(origSum, side); second.GrantDigest != want || want == first.GrantDigest || want == origSum {
		t.Fatalf("grant digest with the second sidecar = %s, want %s (neither the first's %s nor the module's)", second.GrantDigest, want, first.GrantDigest)
	}
	if s, _ := keelCLI("tools", "list"); !strings.Contains(s, "--confirm "+second.GrantDigest) {
		t.Errorf("keel tools list does not show how to confirm the new grant digest:\n%s", s)
	}
	if s, code := keelCLI("tools", "grant", "writefile", "--confirm", origSum); code == 0 {
		t.Errorf("confirm naming the module's sha256, not the grant digest: code %d\n%s", code, s)
	}
	if s, code := keelCLI("tools", "grant", "writefile", "--confirm", second.GrantDigest); code != 0 || !strings.Contains(s, out) {
		t.Fatalf("confirm: code %d\n%s", code, s)
	}
	if err := write("b.txt"); err != nil || !written("b.txt") {
		t.Fatalf("write after confirming: %v", err)
	}

	// A row bound to the module's digest alone (store migration 011 marks
	// it "wasm:") is bound to the module and sidecar installed at the next
	// start.
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(d.dir, "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	old := store.ToolGrant{SHA256: "wasm:" + origSum, Grants: capabilities.Grants{FS: []capabilities.FSGrant{{HostPath: out, GuestPath: "/workspace"}}}}
	if err := st.SetToolGrants(ctx, "writefile", old, time.Now()); err != nil {
		t.Fatal(err)
	}
	st.Close()
	d2 := startDaemon(t, daemon.Config{DataDir: d.dir, Provider: scripted.New(nil)})
	c = dial(t, d2.dir)
	if got := waitDigest(t, c, "writefile", origSum); got.GrantDigest != second.GrantDigest || got.PendingGrants != nil {
		t.Errorf("after the restart: grant digest %s, pending %+v; want %s, none", got.GrantDigest, got.PendingGrants, second.GrantDigest)
	}
	if err := write("c.txt"); err != nil || !written("c.txt") {
		t.Fatalf("write with a grant bound to the module alone before: %v", err)
	}
}

// writefileDaemon starts a daemon holding only writefile and returns it,
// a client, a way to run the CLI against it, the tool's file and its
// bytes as installed.
func writefileDaemon(t *testing.T) (d *started, c *client.Client, keelCLI func(args ...string) (string, int), toolFile string, orig []byte) {
	t.Helper()
	d = startDaemon(t, daemon.Config{DataDir: withTools(t, "writefile"), Provider: scripted.New(nil)})
	c = dial(t, d.dir)
	keelCLI = func(args ...string) (string, int) {
		var out bytes.Buffer
		code := cli.Main(context.Background(), append(args, "--data-dir", d.dir), &out, &out)
		return out.String(), code
	}
	toolFile = filepath.Join(d.dir, "tools", "writefile.wasm")
	orig, err := os.ReadFile(toolFile)
	if err != nil {
		t.Fatal(err)
	}
	return d, c, keelCLI, toolFile, orig
}
