package wasmtools

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

// TestGrantsChangeOnReload grants, then revokes, a directory through
// GrantsFor; each change takes effect at the next Reload and only then.
func TestGrantsChangeOnReload(t *testing.T) {
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "hello.txt"), []byte("hi there"), 0o644); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	grants := map[string]capabilities.Grants{}
	r := openRegistry(t, Config{Dir: readfileDir, GrantsFor: func(name string) capabilities.Grants {
		mu.Lock()
		defer mu.Unlock()
		return grants[name]
	}})
	set := func(g capabilities.Grants) {
		mu.Lock()
		grants["readfile"] = g
		mu.Unlock()
	}
	reload := func(wantChanged bool) {
		t.Helper()
		changed, err := r.Reload(context.Background())
		if err != nil || changed != wantChanged {
			t.Fatalf("Reload = %v, %v; want changed=%v", changed, err, wantChanged)
		}
	}
	te := wantCode(t, r, "readfile", `{"path":"hello.txt"}`, keel.ToolPermissionDenied)
	if !strings.Contains(te.Message, "/workspace") {
		t.Errorf("denial %q does not name the missing grant", te.Message)
	}

	set(capabilities.Grants{FS: []capabilities.FSGrant{{HostPath: work, GuestPath: "/workspace", ReadOnly: true}}})
	wantCode(t, r, "readfile", `{"path":"hello.txt"}`, keel.ToolPermissionDenied) // not before Reload
	reload(true)
	out := mustCall(t, r, "readfile", `{"path":"hello.txt"}`)
	if m, _ := out.(map[string]any); m["content"] != "hi there" {
		t.Errorf("readfile after grant = %v", out)
	}
	if g := r.Tools()[0].Grants; len(g.FS) != 1 || g.FS[0].HostPath != work {
		t.Errorf("Tools().Grants = %+v", g)
	}
	reload(false) // nothing changed: nothing reloaded

	set(capabilities.Grants{})
	reload(true)
	wantCode(t, r, "readfile", `{"path":"hello.txt"}`, keel.ToolPermissionDenied)
}
