package datadir

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/keel-runtime/keel/internal/atomicfile"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// The files of the data directory this package owns.
const (
	// LockFile is held (flock) by the daemon serving the directory.
	LockFile = "daemon.lock"
	// TokenFile holds the client token, mode 0600.
	TokenFile = "token"
	// InfoFile is the discovery file, protocol.DaemonFile.
	InfoFile = protocol.DaemonFile
)

// ErrAlreadyRunning is returned by Lock when another daemon holds the
// data directory.
var ErrAlreadyRunning = errors.New("another keel daemon is already running on this data directory")

// Default is where keel keeps its data unless told otherwise:
// $KEEL_DATA_DIR if set, else $XDG_DATA_HOME/keel, else
// ~/.local/share/keel (~/Library/Application Support/keel on macOS).
func Default() string {
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

// Lock takes the data directory dir (which must exist) for one daemon,
// until unlock is called or the process ends. When another daemon holds
// it, the error wraps ErrAlreadyRunning and names that daemon's pid and
// URL when its daemon.json says.
func Lock(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			msg := ""
			if info, rerr := ReadInfo(dir); rerr == nil {
				msg = fmt.Sprintf(" (pid %d, %s)", info.PID, info.URL)
			}
			return nil, fmt.Errorf("%w%s; stop it first, or use another --data-dir", ErrAlreadyRunning, msg)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// EnsureToken returns the client token of dir and the file holding it,
// creating it (32 random bytes, hex, mode 0600) on first start. A token
// file readable by others is tightened, not trusted blindly; one too
// short to be a token is an error.
func EnsureToken(dir string) (token, path string, err error) {
	path = filepath.Join(dir, TokenFile)
	b, err := os.ReadFile(path)
	if err == nil {
		token = strings.TrimSpace(string(b))
		if len(token) < 32 {
			return "", "", fmt.Errorf("token file %s is too short; delete it and restart to make a new one", path)
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(path, 0o600); err != nil {
				return "", "", fmt.Errorf("token file %s is readable by others and cannot be fixed: %w", path, err)
			}
		}
		return token, path, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", "", fmt.Errorf("read token: %w", err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", "", err
	}
	token = hex.EncodeToString(raw[:])
	if err := atomicfile.Write(path, strings.NewReader(token+"\n"), 0o600); err != nil {
		return "", "", fmt.Errorf("write token: %w", err)
	}
	return token, path, nil
}

// ReadToken reads the token file that info, read from dir, names (a
// relative name is relative to dir).
func ReadToken(dir string, info protocol.DaemonInfo) (string, error) {
	tokenFile := info.TokenFile
	if tokenFile == "" {
		return "", fmt.Errorf("keel: %s names no token_file", filepath.Join(dir, InfoFile))
	}
	if !filepath.IsAbs(tokenFile) {
		tokenFile = filepath.Join(dir, tokenFile)
	}
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		return "", fmt.Errorf("keel: read daemon token: %w", err)
	}
	return strings.TrimSpace(string(tok)), nil
}

// WriteInfo writes dir/daemon.json (mode 0600), atomically: a client
// reads the old file or the new one, never a part.
func WriteInfo(dir string, info protocol.DaemonInfo) error {
	path := filepath.Join(dir, InfoFile)
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := atomicfile.Write(path, bytes.NewReader(append(b, '\n')), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// RemoveInfo removes dir/daemon.json, if it is there: the daemon no
// longer accepts connections.
func RemoveInfo(dir string) {
	os.Remove(filepath.Join(dir, InfoFile))
}

// ReadInfo reads dir/daemon.json. A missing file gives an error wrapping
// os.ErrNotExist.
func ReadInfo(dir string) (protocol.DaemonInfo, error) {
	path := filepath.Join(dir, InfoFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return protocol.DaemonInfo{}, fmt.Errorf("keel: read daemon info: %w", err)
	}
	var info protocol.DaemonInfo
	if err := json.Unmarshal(data, &info); err != nil {
		return protocol.DaemonInfo{}, fmt.Errorf("keel: parse %s: %w", path, err)
	}
	if info.URL == "" {
		return protocol.DaemonInfo{}, fmt.Errorf("keel: %s has no url", path)
	}
	return info, nil
}
