package toolkit

import (
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
