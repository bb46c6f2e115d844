package client

import (
	"os"
	"path/filepath"
	"runtime"
)

// DefaultDataDir is where keel keeps its data unless told otherwise:
// $KEEL_DATA_DIR if set, else $XDG_DATA_HOME/keel, else
// ~/.local/share/keel (~/Library/Application Support/keel on macOS).
func DefaultDataDir() string {
	if d := os.Getenv("KEEL_DATA_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "keel")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "keel")
	}
	if runtime.GOOS == "darwin" {
		return filepath.Join(home, "Library", "Application Support", "keel")
	}
	return filepath.Join(home, ".local", "share", "keel")
}
