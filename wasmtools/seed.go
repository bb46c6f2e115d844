package wasmtools

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/internal/atomicfile"
	"github.com/keel-runtime/keel/wasmtools/builtin"
)

// SeedMarker is the file SeedExamples leaves in a tool directory it has seeded.
const SeedMarker = ".examples-installed"

// SeedExamples installs the bundled example tools (package builtin) into a new tool directory,
// toolsDir, and grants readfile workspace at /workspace, read-only, in
// gs: the one grant keel makes on the user's behalf, recorded like any
// other so it can be revoked. It does so once per directory (SeedMarker):
// a user who removes an example does not get it back at the next start.
func SeedExamples(ctx context.Context, gs GrantStore, toolsDir, workspace string) error {
	marker := filepath.Join(toolsDir, SeedMarker)
	if _, err := os.Stat(marker); err == nil {
		return nil
	}
	if err := builtin.Install(toolsDir); err != nil {
		return err
	}
	_, sum, err := FileDigests(filepath.Join(toolsDir, "readfile.wasm"))
	if err != nil {
		return err
	}
	ro := capabilities.Grants{FS: []capabilities.FSGrant{{HostPath: workspace, GuestPath: "/workspace", ReadOnly: true}}}
	if err := gs.SetToolGrants(ctx, "readfile", capabilities.BoundGrants{SHA256: sum, Grants: ro}, time.Now()); err != nil {
		return err
	}
	return atomicfile.Write(marker, strings.NewReader("the bundled example tools were installed here once\n"), 0o600)
}
