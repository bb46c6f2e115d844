package wasmtools_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/wasmtools"
)

// grantLog is a wasmtools.GrantStore that records what is granted.
type grantLog map[string]capabilities.BoundGrants

func (g grantLog) ToolGrants(context.Context) (map[string]capabilities.BoundGrants, error) {
	return g, nil
}

func (g grantLog) SetToolGrants(_ context.Context, tool string, b capabilities.BoundGrants, _ time.Time) error {
	g[tool] = b
	return nil
}

func (g grantLog) DeleteToolGrants(_ context.Context, tool string) error {
	delete(g, tool)
	return nil
}

// TestSeedOnce checks that SeedExamples installs the examples with readfile's
// read-only workspace grant once: an example the user removed stays
// removed.
func TestSeedOnce(t *testing.T) {
	t.Parallel()
	dir, ws := t.TempDir(), t.TempDir()
	g := grantLog{}
	if err := wasmtools.SeedExamples(t.Context(), g, dir, ws); err != nil {
		t.Fatal(err)
	}
	got := g["readfile"]
	want := capabilities.FSGrant{HostPath: ws, GuestPath: "/workspace", ReadOnly: true}
	if got.SHA256 == "" || len(got.Grants.FS) != 1 || !got.Grants.FS[0].Equal(want) {
		t.Fatalf("readfile's grant = %+v, want %+v bound to its digest", got, want)
	}
	readfile := filepath.Join(dir, "readfile.wasm")
	if err := os.Remove(readfile); err != nil {
		t.Fatal(err)
	}
	if err := wasmtools.SeedExamples(t.Context(), g, dir, ws); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(readfile); !os.IsNotExist(err) {
		t.Errorf("second Seed reinstalled readfile (stat: %v), want it left removed", err)
	}
}
