package toolkit

import (
	"errors"
	"io/fs"
	"path"
	"strings"
)

// RootPath turns p, relative to the granted directory root (such as
// "/workspace") or absolute inside it, into a clean relative name usable
// with os.DirFS(root) or path.Join(root, name). A path that leaves root
// is an *Error with code outside_workspace; root itself is is_directory.
// The host enforces the same boundary; this gives the caller a clear
// message instead of a bare permission error.
func RootPath(root, p string) (string, error) {
	if path.IsAbs(p) {
		rel, ok := strings.CutPrefix(path.Clean(p), root)
		if !ok || (rel != "" && rel[0] != '/') {
			return "", Errorf("outside_workspace", "%s is outside the workspace; use a path relative to it", p)
		}
		p = strings.TrimPrefix(rel, "/")
	}
	name := path.Clean(p)
	if name == "" || name == "." {
		return "", Errorf("is_directory", "%q names the workspace itself, not a file", p)
	}
	if !fs.ValidPath(name) {
		return "", Errorf("outside_workspace", "%s is outside the workspace", p)
	}
	return name, nil
}

// FSError turns a filesystem error on the workspace path p into a tool
// error a model can act on: not_found, permission_denied or io_error,
// without the host path (which means nothing to the caller). writing
// selects the wording of the operation.
func FSError(p string, err error, writing bool) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Errorf("not_found", "%s does not exist in the workspace", p)
	case errors.Is(err, fs.ErrPermission):
		if writing {
			return Errorf("permission_denied", "%s cannot be written (is the workspace granted read-write?)", p)
		}
		return Errorf("permission_denied", "%s cannot be read", p)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	if writing {
		return Errorf("io_error", "writing %s: %v", p, err)
	}
	return Errorf("io_error", "reading %s: %v", p, err)
}
