package wasmtools

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/url"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
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

// Bounds of what schemaTargets follows and CallTargets collects.
const (
	// maxTargetDepth is how deep in the arguments (nested objects and
	// arrays; the top-level properties are at depth 1) a marked value is
	// looked for. A call with a value where the schema marks something
	// deeper is unresolvable.
	maxTargetDepth = 8
	// maxTargets is how many paths and URLs one call may name; a call
	// naming more is unresolvable.
	maxTargets = 256
	// maxSchemaVisits bounds the work of reading one input schema
	// (subschemas visited, local refs unfolded); a schema that needs
	// more makes every call of the tool unresolvable.
	maxSchemaVisits = 1 << 16
)

// argTargets is where a tool's input schema marks paths and URLs in a
// call's arguments: a tree following the schema's properties and items,
// pruned to the branches that lead to a marked value. The zero value
// marks nothing.
type argTargets struct {
	root *targetNode
	// opaque: the schema could not be read within maxSchemaVisits; every
	// call is unresolvable.
	opaque bool
}

// targetNode is one place in the arguments: a value the schema marks
// (format), an object whose properties lead to marked values (props,
// and rest for its other keys), an array whose elements do (items), or,
// past maxTargetDepth, a value holding marked values too deep to follow
// (deep).
type targetNode struct {
	format string // FormatPath, FormatURI, FormatURIReference or ""
	props  map[string]*targetNode
	rest   *targetNode
	items  *targetNode
	deep   bool
}

// schemaTargets reads where an input schema marks the arguments that
// are paths ("format": "path") or URLs ("format": "uri" or
// "uri-reference"): properties of the top-level object and of nested
// objects (properties; additionalProperties and patternProperties for
// the other keys), elements of arrays (items, prefixItems,
// additionalItems: each applies to every element), with every branch of
// allOf, anyOf and oneOf, and local references ("$ref": "#/$defs/x", any
// JSON pointer into the schema) followed; a remote reference is not
// followed, and marks nothing. Marked values deeper than maxTargetDepth
// are not followed: a call that has a value there is unresolvable. A
// schema it cannot parse marks nothing (the registry refuses such a
// tool); one too large to read within maxSchemaVisits makes every call
// unresolvable.
func schemaTargets(schema json.RawMessage) argTargets {
	var doc any
	if json.Unmarshal(schema, &doc) != nil {
		return argTargets{}
	}
	r := &schemaReader{doc: doc}
	root := r.node([]any{doc}, 0)
	if r.visits > maxSchemaVisits {
		return argTargets{opaque: true}
	}
	return argTargets{root: root}
}

// schemaReader reads one input schema (schemaTargets).
type schemaReader struct {
	doc    any // the whole schema, for local references
	visits int // subschemas visited, against maxSchemaVisits
}

// node returns the tree for a value the schemas ss all describe, at
// depth, or nil when nothing in it is marked.
func (r *schemaReader) node(ss []any, depth int) *targetNode {
	subs := r.expand(ss)
	if !r.marked(subs, map[uintptr]bool{}) || r.visits > maxSchemaVisits {
		return nil
	}
	if depth > maxTargetDepth {
		return &targetNode{deep: true}
	}
	n := &targetNode{}
	for _, m := range subs {
		if f, ok := m["format"].(string); ok && isMark(f) && (n.format == "" || f == FormatPath) {
			n.format = f
		}
	}
	props, rest, items := children(subs)
	for _, k := range sortedKeys(props) {
		if c := r.node(props[k], depth+1); c != nil {
			if n.props == nil {
				n.props = map[string]*targetNode{}
			}
			n.props[k] = c
		}
	}
	n.rest = r.node(rest, depth+1)
	n.items = r.node(items, depth+1)
	return n
}

func isMark(format string) bool {
	return format == FormatPath || format == FormatURI || format == FormatURIReference
}

// expand returns the schema objects among ss, with what applies to the
// same value: their local references, followed, and the branches of
// allOf, anyOf and oneOf, recursively; each once.
func (r *schemaReader) expand(ss []any) []map[string]any {
	var out []map[string]any
	seen := map[uintptr]bool{}
	var add func(s any)
	add = func(s any) {
		m, ok := s.(map[string]any)
		if !ok || seen[identity(m)] {
			return
		}
		seen[identity(m)] = true
		r.visits++
		if r.visits > maxSchemaVisits {
			return
		}
		out = append(out, m)
		if ref, ok := m["$ref"].(string); ok {
			if t, ok := r.resolve(ref); ok {
				add(t)
			}
		}
		for _, k := range [...]string{"allOf", "anyOf", "oneOf"} {
			bs, _ := m[k].([]any)
			for _, b := range bs {
				add(b)
			}
		}
	}
	for _, s := range ss {
		add(s)
	}
	return out
}

// marked reports whether a value the schemas subs describe, or anything
// within it, is marked. seen holds the schemas already looked at on
// this search (which ends a cycle of references).
func (r *schemaReader) marked(subs []map[string]any, seen map[uintptr]bool) bool {
	var next []any
	for _, m := range subs {
		if seen[identity(m)] {
			continue
		}
		seen[identity(m)] = true
		if f, ok := m["format"].(string); ok && isMark(f) {
			return true
		}
		props, rest, items := children([]map[string]any{m})
		for _, ps := range props {
			next = append(next, ps...)
		}
		next = append(append(next, rest...), items...)
	}
	if len(next) == 0 || r.visits > maxSchemaVisits {
		return false
	}
	return r.marked(r.expand(next), seen)
}

// children returns the schemas of the properties (by name), of the
// other keys and of the elements of a value the schemas subs describe.
func children(subs []map[string]any) (props map[string][]any, rest, items []any) {
	for _, m := range subs {
		if ps, ok := m["properties"].(map[string]any); ok {
			for k, p := range ps {
				if props == nil {
					props = map[string][]any{}
				}
				props[k] = append(props[k], p)
			}
		}
		if ap, ok := m["additionalProperties"].(map[string]any); ok {
			rest = append(rest, ap)
		}
		pp, _ := m["patternProperties"].(map[string]any)
		for _, k := range sortedKeys(pp) {
			rest = append(rest, pp[k])
		}
		switch it := m["items"].(type) {
		case map[string]any:
			items = append(items, it)
		case []any:
			items = append(items, it...)
		}
		pi, _ := m["prefixItems"].([]any)
		items = append(items, pi...)
		if ai, ok := m["additionalItems"].(map[string]any); ok {
			items = append(items, ai)
		}
	}
	return props, rest, items
}

// identity is a schema object's identity, for the sets of those seen.
func identity(m map[string]any) uintptr { return reflect.ValueOf(m).Pointer() }

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// resolve follows a local reference: "#" and a JSON pointer into the
// schema. Others (remote, anchors) are not followed.
func (r *schemaReader) resolve(ref string) (any, bool) {
	frag, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil, false
	}
	frag, err := url.PathUnescape(frag)
	if err != nil {
		return nil, false
	}
	cur := r.doc
	if frag == "" {
		return cur, true
	}
	if frag[0] != '/' {
		return nil, false
	}
	for _, tok := range strings.Split(frag[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch c := cur.(type) {
		case map[string]any:
			cur, ok = c[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			ok = err == nil && i >= 0 && i < len(c)
			if ok {
				cur = c[i]
			}
		default:
			ok = false
		}
		if !ok {
			return nil, false
		}
	}
	return cur, true
}

// CallTargets returns the files and URLs a call of the tool name with
// args names (engine.CallTargeter): the string values its input schema
// marks "format": "path", "uri" or "uri-reference", at the top level or
// nested in objects and arrays (schemaTargets says which schemas are
// followed). A call that names more than maxTargets (256) of them, or
// has a value where the schema marks something deeper than
// maxTargetDepth (8) levels, or of a tool whose schema is too large to
// read, is Unresolvable: it matches every path and url rule that asks or
// denies and none that allows. A relative path is relative to the guest
// directory of the tool's first requested grant ("/" if it requests
// none), as the bundled file tools read it; Resolve maps a guest path to
// the host path under the tool's grant that mounts it, following the
// host's symlinks as the sandbox does, and fails (wrapping
// ErrNotGranted) when no grant mounts it. An unknown tool, or arguments
// that are not a JSON object, name nothing. Safe for concurrent use.
func (a RunTools) CallTargets(name string, args json.RawMessage) keel.CallTargets {
	t, ok := a.reg.set.Load().tools[name]
	if !ok || (t.targets.root == nil && !t.targets.opaque) {
		return keel.CallTargets{}
	}
	var in map[string]any
	if json.Unmarshal(args, &in) != nil || in == nil {
		return keel.CallTargets{}
	}
	var out keel.CallTargets
	if t.targets.opaque {
		out.Unresolvable = true
	} else {
		collect(in, t.targets.root, &out)
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

// collect appends the paths and URLs that v, at the place n of the
// arguments, holds, up to maxTargets; past it, or with a value at a
// place too deep to follow, the call is unresolvable.
func collect(v any, n *targetNode, out *keel.CallTargets) {
	if n == nil || v == nil || out.Unresolvable {
		return
	}
	if n.deep {
		out.Unresolvable = true
		return
	}
	switch v := v.(type) {
	case string:
		if n.format == "" {
			return
		}
		if len(out.Paths)+len(out.URLs) >= maxTargets {
			out.Unresolvable = true
			return
		}
		if n.format == FormatPath {
			out.Paths = append(out.Paths, v)
		} else {
			out.URLs = append(out.URLs, v)
		}
	case map[string]any:
		if n.props == nil && n.rest == nil {
			return
		}
		for _, k := range sortedKeys(v) {
			c := n.props[k]
			if c == nil {
				c = n.rest
			}
			collect(v[k], c, out)
		}
	case []any:
		for _, e := range v {
			collect(e, n.items, out)
		}
	}
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
