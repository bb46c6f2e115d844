package wasmtools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/keel-runtime/keel/capabilities"
)

// grantsFor returns what the configuration grants the tool name, whose
// GrantDigest is sum, now.
func (r *Registry) grantsFor(name, sum string) capabilities.Grants {
	if r.cfg.GrantsFor != nil {
		return r.cfg.GrantsFor(name, sum)
	}
	return r.cfg.Grants[name]
}

// sameGrants reports whether a and b grant exactly the same things.
func sameGrants(a, b capabilities.Grants) bool {
	return a.Equal(b)
}

// Inspect compiles and validates the tool file NAME.wasm (with its
// sidecar manifest, if any) without installing it, and returns what it
// is and what it requests. Its Grants are what the configuration would
// give it now. The compilation lands in the cache, so installing the
// same file afterwards does not compile it again.
func (r *Registry) Inspect(ctx context.Context, file string) (Tool, error) {
	name, ok := strings.CutSuffix(filepath.Base(file), ".wasm")
	if !ok {
		return Tool{}, fmt.Errorf("wasmtools: %s: a tool file is named NAME.wasm", file)
	}
	if !r.begin() {
		return Tool{}, errors.New("wasmtools: inspect: registry closed")
	}
	defer r.calls.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(r.ctx, cancel)() // Close stops it too
	t, err := r.load(ctx, name, file)
	if err != nil {
		return Tool{}, fmt.Errorf("wasmtools: %s: %w", filepath.Base(file), err)
	}
	info := t.info.clone()
	t.close(ctx, true)
	return info, nil
}

// Ready is closed once the tools present at Open are loaded.
func (r *Registry) Ready() <-chan struct{} { return r.ready }

// WaitReady blocks until the tools present at Open are loaded or ctx ends.
func (r *Registry) WaitReady(ctx context.Context) error {
	select {
	case <-r.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Listed reports whether Tools and Specs list every tool found at Open:
// their load has ended, or the index listed each of them (see index.go;
// a listed tool that has not loaded yet is marked Compiling).
func (r *Registry) Listed() bool {
	select {
	case <-r.ready:
		return true
	default:
		return r.listedAll
	}
}

// Progress reports how many of the tool files present at Open have been
// compiled and checked, and whether that first load is finished.
func (r *Registry) Progress() (loaded, total int, ready bool) {
	select {
	case <-r.ready:
		ready = true
	default:
	}
	return int(r.loaded.Load()), int(r.total.Load()), ready
}

// RequestsNetwork reports whether the tool name's manifest requests
// network access. Unlike Tool, it copies nothing.
func (r *Registry) RequestsNetwork(name string) bool {
	t, ok := r.set.Load().tools[name]
	return ok && len(t.info.Requests.Network) > 0
}

// GrantedPrivate reports whether the tool name was given a directory
// marked private (capabilities.FSGrant.Private). Unlike Tool, it copies
// nothing.
func (r *Registry) GrantedPrivate(name string) bool {
	t, ok := r.set.Load().tools[name]
	return ok && t.info.Grants.HasPrivate()
}

// GrantDigest is the identity a tool's grants are bound to: the hex
// SHA-256 of its .wasm file, wasmSHA256, when it has no sidecar manifest
// (sidecar nil); otherwise the hex SHA-256 of a domain tag, that digest
// and the sidecar's bytes, so a sidecar dropped beside an unchanged
// module (relabelling its side effects, requesting more) is another
// identity that has none of the module's grants.
func GrantDigest(wasmSHA256 string, sidecar []byte) string {
	if sidecar == nil {
		return wasmSHA256
	}
	h := sha256.New()
	// The wasm digest has a fixed length, so the encoding is unambiguous.
	io.WriteString(h, "keel grant digest v1\x00")
	io.WriteString(h, wasmSHA256)
	h.Write(sidecar)
	return hex.EncodeToString(h.Sum(nil))
}

// FileDigests returns, for the tool file NAME.wasm, the hex SHA-256 of
// the file (Tool.SHA256) and its GrantDigest with the sidecar
// NAME.manifest.json beside it, if any (Tool.GrantDigest). The error
// wraps fs.ErrNotExist when the .wasm file is missing; a sidecar that
// cannot be read is an error too, as it would not load.
func FileDigests(file string) (sum, grantDigest string, err error) {
	if sum, err = fileSHA256(file); err != nil {
		return "", "", err
	}
	side, err := readSidecar(strings.TrimSuffix(file, ".wasm") + ".manifest.json")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		side = nil
	case err != nil:
		return "", "", err
	case side == nil:
		side = []byte{} // present but empty: still a sidecar
	}
	return sum, GrantDigest(sum, side), nil
}

// grantStrings renders grants as the audit trail and interceptors see
// them (intercept.ToolBuild): "fs:/workspace=ro", "fs:/notes=rw+private",
// "fs:/hr=ro+label:pii",
// "net:https://example.com:443", "env:NAME".
func grantStrings(g capabilities.Grants) []string {
	var out []string
	for _, f := range g.FS {
		out = append(out, "fs:"+f.GuestPath+"="+strings.Join(f.Modes(), "+"))
	}
	for _, n := range g.Network {
		out = append(out, "net:"+n)
	}
	for _, e := range g.Env {
		out = append(out, "env:"+e)
	}
	return out
}
