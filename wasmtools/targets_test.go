package wasmtools

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/policy"
)

// targetsOf returns the paths and URLs a call with args names under
// schema, as CallTargets collects them.
func targetsOf(t *testing.T, schema, args string) keel.CallTargets {
	t.Helper()
	var in map[string]any
	if err := json.Unmarshal([]byte(args), &in); err != nil {
		t.Fatal(err)
	}
	var out keel.CallTargets
	at := schemaTargets(json.RawMessage(schema))
	if at.opaque {
		return keel.CallTargets{Unresolvable: true}
	}
	collect(in, at.root, &out)
	return out
}

// TestSchemaTargets: the string values marked "format": "path", "uri" or
// "uri-reference" are a call's paths and URLs, at the top level or nested
// in objects and arrays, through allOf/anyOf/oneOf and local $ref; other
// formats and unreadable schemas name none; values too deep, or too
// many, make the call unresolvable.
func TestSchemaTargets(t *testing.T) {
	t.Parallel()
	deep := `{"type":"string","format":"path"}`
	deepArgs := `"/deep"`
	for range maxTargetDepth {
		deep = `{"type":"object","properties":{"d":` + deep + `}}`
		deepArgs = `{"d":` + deepArgs + `}`
	}
	many := make([]string, maxTargets+1)
	for i := range many {
		many[i] = fmt.Sprintf("%q", fmt.Sprintf("/f%d", i))
	}
	for _, tc := range []struct {
		name, schema, args string
		paths, urls        []string
		unresolvable       bool
	}{
		{name: "top level", schema: `{"type":"object","properties":{
			"src":{"type":"string","format":"path"},"dst":{"type":"string","format":"path"},
			"u":{"type":"string","format":"uri"},"r":{"type":"string","format":"uri-reference"},
			"mail":{"type":"string","format":"email"},"n":{"type":"integer"}}}`,
			args:  `{"src":"/a","dst":"/b","u":"https://x.test/","r":"/rel","mail":"/m","n":3}`,
			paths: []string{"/b", "/a"}, urls: []string{"/rel", "https://x.test/"}},
		{name: "broken schema", schema: `[`, args: `{"p":"/a"}`},
		{name: "array items and nested object", schema: nestedSchema,
			args:  `{"files":["/ok","/secret/x"],"target":{"url":"https://api.test/v1"},"other":"/no"}`,
			paths: []string{"/ok", "/secret/x"}, urls: []string{"https://api.test/v1"}},
		{name: "objects in arrays, additionalProperties", schema: `{"type":"object","properties":{
			"ops":{"type":"array","items":{"type":"object","properties":{"from":{"type":"string","format":"path"}},
				"additionalProperties":{"type":"string","format":"uri"}}}}}`,
			args:  `{"ops":[{"from":"/a","x":"https://x.test/"},{"from":"/b"},"not an object"]}`,
			paths: []string{"/a", "/b"}, urls: []string{"https://x.test/"}},
		{name: "local ref and anyOf", schema: `{"$defs":{"file":{"type":"string","format":"path"},
			"node":{"type":"object","properties":{"p":{"$ref":"#/$defs/file"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}}}},
			"type":"object","properties":{"root":{"$ref":"#/$defs/node"},"alt":{"anyOf":[{"type":"integer"},{"type":"string","format":"uri"}]}}}`,
			args:  `{"root":{"p":"/r","kids":[{"p":"/k1"},{"p":"/k2","kids":[]}]},"alt":"https://alt.test/"}`,
			paths: []string{"/r", "/k1", "/k2"}, urls: []string{"https://alt.test/"}},
		{name: "recursive ref past the depth bound",
			schema: `{"$defs":{"node":{"type":"object","properties":{"p":{"type":"string","format":"path"},"next":{"$ref":"#/$defs/node"}}}},"$ref":"#/$defs/node"}`,
			args:   `{"next":{"next":{"next":{"next":{"next":{"next":{"next":{"next":{"p":"/too/deep"}}}}}}}}}`, unresolvable: true},
		{name: "recursive ref within the bound",
			schema: `{"$defs":{"node":{"type":"object","properties":{"p":{"type":"string","format":"path"},"next":{"$ref":"#/$defs/node"}}}},"$ref":"#/$defs/node"}`,
			args:   `{"p":"/0","next":{"next":{"p":"/2"}}}`, paths: []string{"/0", "/2"}},
		{name: "deeper than the bound", schema: `{"type":"object","properties":{"d":` + deep + `}}`,
			args: `{"d":` + deepArgs + `}`, unresolvable: true},
		{name: "deep schema, no value there", schema: `{"type":"object","properties":{"d":` + deep + `,"p":{"type":"string","format":"path"}}}`,
			args: `{"p":"/p"}`, paths: []string{"/p"}},
		{name: "more than the bound", schema: nestedSchema,
			args: `{"files":[` + strings.Join(many, ",") + `]}`, unresolvable: true},
		{name: "exactly the bound", schema: nestedSchema,
			args: `{"files":[` + strings.Join(many[1:], ",") + `]}`, paths: unquote(t, many[1:])},
	} {
		got := targetsOf(t, tc.schema, tc.args)
		if tc.unresolvable {
			if !got.Unresolvable {
				t.Errorf("%s: targets = %d paths, %d urls, want unresolvable", tc.name, len(got.Paths), len(got.URLs))
			}
			continue
		}
		slices.Sort(got.Paths)
		slices.Sort(got.URLs)
		slices.Sort(tc.paths)
		slices.Sort(tc.urls)
		if got.Unresolvable || !slices.Equal(got.Paths, tc.paths) || !slices.Equal(got.URLs, tc.urls) {
			t.Errorf("%s: targets = %q %q (unresolvable %v), want paths %q, urls %q", tc.name, got.Paths, got.URLs, got.Unresolvable, tc.paths, tc.urls)
		}
	}
}

func unquote(t *testing.T, qs []string) []string {
	t.Helper()
	out := make([]string, len(qs))
	for i, q := range qs {
		var err error
		if out[i], err = strconv.Unquote(q); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// nestedSchema marks paths in an array and a URL in a nested object.
const nestedSchema = `{"type":"object","properties":{
	"files":{"type":"array","items":{"type":"string","format":"path"}},
	"target":{"type":"object","properties":{"url":{"type":"string","format":"uri"}}},
	"other":{"type":"string"}}}`

// TestCallTargetsNested: a real module whose manifest marks paths in an
// array and a URL in a nested object: the policy's path rule denies the
// call that names the denied path as the second element, its url rule
// matches the nested URL, and a call naming more than maxTargets paths
// is denied by the deny rule and not allowed by the allow rule.
func TestCallTargetsNested(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := writeFiles(dir, map[string][]byte{
		"nested.wasm": fixedModule(`{"name":"nested","description":"Names files and a URL.","input_schema":` + nestedSchema +
			`,"side_effects":"read_only","requests":{"fs":[{"guest_path":"/workspace","read_only":true}]}}`),
	}); err != nil {
		t.Fatal(err)
	}
	host, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	host = filepath.ToSlash(host)
	r := openRegistry(t, Config{Dir: dir, Grants: map[string]capabilities.Grants{
		"nested": {FS: []capabilities.FSGrant{{HostPath: host, GuestPath: "/workspace", ReadOnly: true}}},
	}})
	p, err := policy.Compile(policy.Options{}, policy.LayerFile{Layer: policy.LayerUser, Name: "policy.json", Data: []byte(`{"rules":[
		{"action":"tool","path":"` + host + `/secret/**","decision":"deny"},
		{"action":"tool","url":"https://api.test/v1/**","decision":"ask"},
		{"action":"tool","tool":"nested","path":"` + host + `/ok/**","decision":"allow"}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	many := make([]string, maxTargets+1)
	for i := range many {
		many[i] = fmt.Sprintf("%q", fmt.Sprintf("ok/f%d", i))
	}
	for _, tc := range []struct {
		args string
		want policy.Outcome
		rule int // the rule that decides, 0 none
	}{
		{`{"files":["ok/a","secret/b"]}`, policy.Deny, 1},
		{`{"files":["/workspace/ok/a","ok/b"]}`, policy.Allow, 3},
		{`{"target":{"url":"https://API.api.test:443/v1/x"}}`, policy.Allow, 0},
		{`{"target":{"url":"https://api.test:443/v1/x"}}`, policy.Ask, 2},
		{`{"files":[` + strings.Join(many[1:], ",") + `]}`, policy.Allow, 3},
		{`{"files":[` + strings.Join(many, ",") + `]}`, policy.Deny, 1},
	} {
		ct := r.RunTools().CallTargets("nested", json.RawMessage(tc.args))
		a := policy.Action{Kind: policy.KindTool, Tool: "nested", Args: json.RawMessage(tc.args),
			Paths: ct.Paths, Base: ct.Base, Resolve: ct.Resolve, URLs: ct.URLs, Unresolvable: ct.Unresolvable}
		d := p.Decide(&a)
		rule := 0
		if d.Rule() != nil {
			rule = d.Rule().N
		}
		if d.Outcome != tc.want || rule != tc.rule {
			t.Errorf("decide nested %.60s = %s by rule %d, want %s by rule %d", tc.args, d.Outcome, rule, tc.want, tc.rule)
		}
	}
}

// TestResolveGuest: a guest path maps to the host under the grant with
// the longest guest path holding it, following host symlinks as far as
// the path exists; a path no grant mounts is ErrNotGranted.
func TestResolveGuest(t *testing.T) {
	t.Parallel()
	a, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(b, filepath.Join(a, "toB")); err != nil {
		t.Fatal(err)
	}
	grants := []capabilities.FSGrant{{HostPath: a, GuestPath: "/w"}, {HostPath: b, GuestPath: "/w/inner"}}
	for guest, want := range map[string]string{
		"/w/x.txt":           a + "/x.txt",
		"/w":                 a,
		"/w/inner/y/z.txt":   b + "/y/z.txt",
		"/w/toB/new/dir.txt": b + "/new/dir.txt",
	} {
		if got, err := resolveGuest(grants, guest); err != nil || got != filepath.ToSlash(want) {
			t.Errorf("resolveGuest(%q) = %q, %v; want %q", guest, got, err, want)
		}
	}
	for _, guest := range []string{"/etc/passwd", "/wx/y", "/"} {
		if got, err := resolveGuest(grants, guest); !errors.Is(err, ErrNotGranted) {
			t.Errorf("resolveGuest(%q) = %q, %v; want ErrNotGranted", guest, got, err)
		}
	}
}
