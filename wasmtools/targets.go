package wasmtools

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"strings"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

// Schema formats that mark a tool's arguments as files or URLs, for the
// policy's path and url rules. "path" is keel's own (JSON Schema leaves
// unknown formats to the application; validation ignores it); "uri" and
// "uri-reference" are JSON Schema's.
const (
	FormatPath         = "path"
	FormatURI          = "uri"
	FormatURIReference = "uri-reference"
)

// ErrNotGranted is wrapped by a path resolution that no grant of the
// tool reaches: the sandbox would refuse the call.
var ErrNotGranted = errors.New("no grant reaches the path")

// argTargets are the top-level properties of an input schema whose
// format marks them as a path or a URL.
type argTargets struct {
	paths, urls []string
}

// schemaTargets reads the top-level properties of an input schema that
// are paths or URLs. A schema it cannot read has none.
func schemaTargets(schema json.RawMessage) argTargets {
	var s struct {
		Properties map[string]struct {
			Format string `json:"format"`
		} `json:"properties"`
	}
	var t argTargets
	if json.Unmarshal(schema, &s) != nil {
		return t
	}
	for name, p := range s.Properties {
		switch p.Format {
		case FormatPath:
			t.paths = append(t.paths, name)
		case FormatURI, FormatURIReference:
			t.urls = append(t.urls, name)
		}
	}
	return t
}

// CallTargets returns the files and URLs a call of the tool name with
// args names (engine.CallTargeter): the string arguments its input
// schema marks "format": "path", "uri" or "uri-reference". A relative
// path is relative to the guest directory of the tool's first requested
// grant ("/" if it requests none), as the bundled file tools read it;
// Resolve maps a guest path to the host path under the tool's grant
// that mounts it, following the host's symlinks as the sandbox does, and
// fails (wrapping ErrNotGranted) when no grant mounts it. An unknown
// tool, or arguments that are not a JSON object, name nothing.
func (a RunTools) CallTargets(name string, args json.RawMessage) keel.CallTargets {
	t, ok := a.reg.set.Load().tools[name]
	if !ok || (len(t.targets.paths) == 0 && len(t.targets.urls) == 0) {
		return keel.CallTargets{}
	}
	var in map[string]json.RawMessage
	if json.Unmarshal(args, &in) != nil {
		return keel.CallTargets{}
	}
	str := func(k string) (string, bool) {
		var s string
		raw, ok := in[k]
		return s, ok && json.Unmarshal(raw, &s) == nil
	}
	var out keel.CallTargets
	for _, k := range t.targets.urls {
		if s, ok := str(k); ok {
			out.URLs = append(out.URLs, s)
		}
	}
	for _, k := range t.targets.paths {
		if s, ok := str(k); ok {
			out.Paths = append(out.Paths, s)
		}
	}
	if len(out.Paths) > 0 {
		out.Base = "/"
		if req := t.info.Requests.FS; len(req) > 0 && path.IsAbs(req[0].GuestPath) {
			out.Base = path.Clean(req[0].GuestPath)
		}
		grants := t.info.Grants.FS
		out.Resolve = func(guest string) (string, error) { return resolveGuest(grants, guest) }
	}
	return out
}

// resolveGuest maps the cleaned absolute guest path to the host: under
// the grant with the longest guest path that holds it, with the host's
// symlinks followed as far as the path exists.
func resolveGuest(grants []capabilities.FSGrant, guest string) (string, error) {
	best := -1
	var rel string
	for i, g := range grants {
		gp := path.Clean(g.GuestPath)
		r, ok := underGuest(gp, guest)
		if ok && (best < 0 || len(gp) > len(path.Clean(grants[best].GuestPath))) {
			best, rel = i, r
		}
	}
	if best < 0 {
		return "", fmt.Errorf("%s: %w", guest, ErrNotGranted)
	}
	host, err := filepath.Abs(grants[best].HostPath)
	if err != nil {
		return "", err
	}
	return filepath.ToSlash(evalExisting(filepath.Join(host, filepath.FromSlash(rel)))), nil
}

// underGuest returns p relative to the guest directory dir, if p is dir
// or under it.
func underGuest(dir, p string) (string, bool) {
	if dir == "/" {
		return strings.TrimPrefix(p, "/"), true
	}
	if p == dir {
		return "", true
	}
	if rest, ok := strings.CutPrefix(p, dir+"/"); ok {
		return rest, true
	}
	return "", false
}

// evalExisting follows the symlinks of the longest part of p that
// exists and appends the rest (a file a call is about to create).
func evalExisting(p string) string {
	rest := ""
	for {
		r, err := filepath.EvalSymlinks(p)
		if err == nil {
			return filepath.Join(r, rest)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return filepath.Join(p, rest)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return filepath.Join(p, rest)
		}
		rest = filepath.Join(filepath.Base(p), rest)
		p = parent
	}
}
