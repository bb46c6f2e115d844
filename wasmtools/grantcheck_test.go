package wasmtools_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/wasmtools"
)

// TestCheckGrantsHostDirectory checks what a filesystem grant says of its
// host directory: one that does not exist is named as such (the README's
// tour grants ~/notes, which a fresh machine lacks), a file is not a
// directory, and an existing directory is granted.
func TestCheckGrantsHostDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "file.txt")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	req := capabilities.Grants{FS: []capabilities.FSGrant{{GuestPath: "/workspace"}}}
	for _, tc := range []struct {
		name, host, want string // want: "" for granted
	}{
		{"missing", filepath.Join(dir, "notes"), "does not exist"},
		{"file", file, "is not a directory"},
		{"directory", dir, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := capabilities.Grants{FS: []capabilities.FSGrant{{GuestPath: "/workspace", HostPath: tc.host}}}
			out, err := wasmtools.CheckGrants(req, g)
			if tc.want == "" {
				if err != nil || len(out.FS) != 1 || out.FS[0].HostPath != tc.host {
					t.Fatalf("wasmtools.CheckGrants(%s) = %+v, %v; want it granted", tc.host, out, err)
				}
				return
			}
			if !errors.Is(err, keel.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("wasmtools.CheckGrants(%s) error = %v, want keel.ErrInvalid saying %q", tc.host, err, tc.want)
			}
		})
	}
}

// TestCheckGrantsLimits: a limit may be granted only where the manifest
// asks for one.
func TestCheckGrantsLimits(t *testing.T) {
	t.Parallel()
	req := capabilities.Grants{Limits: capabilities.Limits{MemoryMiB: 512}}
	out, err := wasmtools.CheckGrants(req, capabilities.Grants{Limits: capabilities.Limits{MemoryMiB: 1024}})
	if err != nil || out.Limits.MemoryMiB != 1024 {
		t.Fatalf("wasmtools.CheckGrants(memory) = %+v, %v; want 1024 MiB granted", out, err)
	}
	if _, err := wasmtools.CheckGrants(req, capabilities.Grants{Limits: capabilities.Limits{TimeoutMS: 60000}}); !errors.Is(err, keel.ErrInvalid) || !strings.Contains(err.Error(), "limit:timeout") {
		t.Fatalf("wasmtools.CheckGrants(timeout) error = %v, want keel.ErrInvalid naming limit:timeout", err)
	}
	if got := wasmtools.CarryGrants(capabilities.Grants{}, capabilities.Grants{Limits: capabilities.Limits{MemoryMiB: 1024}}); got.Limits != (capabilities.Limits{}) {
		t.Fatalf("carryGrants to a module that asks for no limit = %+v, want none", got.Limits)
	}
}

// TestCheckGrantsLabels: a filesystem grant's labels are checked and
// kept sorted without duplicates, "private" as Private.
func TestCheckGrantsLabels(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	req := capabilities.Grants{FS: []capabilities.FSGrant{{GuestPath: "/workspace"}}}
	g := capabilities.Grants{FS: []capabilities.FSGrant{{GuestPath: "/workspace", HostPath: dir, Labels: []string{"secret", "private", "pii", "pii"}}}}
	out, err := wasmtools.CheckGrants(req, g)
	want := capabilities.FSGrant{GuestPath: "/workspace", HostPath: dir, Private: true, Labels: []string{"pii", "secret"}}
	if err != nil || len(out.FS) != 1 || !out.FS[0].Equal(want) {
		t.Fatalf("CheckGrants(labels) = %+v, %v; want %+v", out.FS, err, want)
	}
	g.FS[0].Labels = []string{"pii", "Bad Label"}
	if _, err := wasmtools.CheckGrants(req, g); !errors.Is(err, keel.ErrInvalid) || !errors.Is(err, keel.ErrLabel) || !strings.Contains(err.Error(), "Bad Label") {
		t.Errorf("CheckGrants(bad label) = %v, want ErrInvalid and ErrLabel naming it", err)
	}
}
