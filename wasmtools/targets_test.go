package wasmtools

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/keel-runtime/keel/capabilities"
)

// TestSchemaTargets: the top-level properties marked "format": "path",
// "uri" or "uri-reference" are a call's paths and URLs; other formats
// and unreadable schemas name none.
func TestSchemaTargets(t *testing.T) {
	t.Parallel()
	got := schemaTargets(json.RawMessage(`{"type":"object","properties":{
		"src":{"type":"string","format":"path"},"dst":{"type":"string","format":"path"},
		"u":{"type":"string","format":"uri"},"r":{"type":"string","format":"uri-reference"},
		"mail":{"type":"string","format":"email"},"n":{"type":"integer"}}}`))
	slices.Sort(got.paths)
	slices.Sort(got.urls)
	if !slices.Equal(got.paths, []string{"dst", "src"}) || !slices.Equal(got.urls, []string{"r", "u"}) {
		t.Errorf("schemaTargets = %+v, want paths [dst src], urls [r u]", got)
	}
	if got := schemaTargets(json.RawMessage(`[`)); got.paths != nil || got.urls != nil {
		t.Errorf("schemaTargets of a broken schema = %+v, want none", got)
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
