package client

import "github.com/keel-runtime/keel/ipc/datadir"

// DefaultDataDir is where keel keeps its data unless told otherwise:
// $KEEL_DATA_DIR if set, else $XDG_DATA_HOME/keel, else
// ~/.local/share/keel (~/Library/Application Support/keel on macOS).
// See ipc/datadir, which owns the data directory's layout.
func DefaultDataDir() string { return datadir.Default() }
