package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/internal/atomicfile"
	"github.com/keel-runtime/keel/store"
	"github.com/keel-runtime/keel/wasmtools"
	"github.com/keel-runtime/keel/wasmtools/builtin"
)

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
	return atomicfile.Write(marker, strings.NewReader("the bundled example tools were installed here once\n"), 0o600)
}
