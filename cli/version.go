package cli

import (
	"fmt"
	"runtime/debug"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// versionLine is what `keel version` and `keel --version` print: keel's
// version, the commit it was built from and the protocol it speaks.
func versionLine() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return formatVersion(bi)
}

// formatVersion renders the version line from bi, which may be nil (a
// binary built without module support). The commit comes from the vcs
// settings Go stamps into a build from a checkout; it is "unknown" when
// the build has none (-buildvcs=false, a build outside a checkout),
// followed by "+modified" when the checkout had uncommitted changes.
// The module version is shown too when it is a release ("devel" for a
// build from a checkout).
func formatVersion(bi *debug.BuildInfo) string {
	commit, modified, module := "unknown", false, "devel"
	if bi != nil {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
				if len(commit) > 12 {
					commit = commit[:12]
				}
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			module = v
		}
	}
	if modified {
		commit += "+modified"
	}
	return fmt.Sprintf("keel %s (module %s, commit %s), protocol %s", keel.Version, module, commit, protocol.Version)
}
