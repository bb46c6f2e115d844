package wasmtools

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

// TestGrantsChangeOnReload grants, then revokes, a directory through
// GrantsFor; each change takes effect at the next Reload and only then.
func TestGrantsChangeOnReload(t *testing.T) {
	t.Parallel()
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "hello.txt"), []byte("hi there"), 0o644); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	grants := map[string]capabilities.Grants{}
	r := openRegistry(t, Config{Dir: readfileDir, GrantsFor: func(name, _ string) capabilities.Grants {
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

// TestBackgroundOpen opens a registry that compiles in the background:
// Open returns before the tools are loaded, a call waits for its tool,
// and Close during the load stops it without leaking its goroutine.
func TestBackgroundOpen(t *testing.T) {
	t.Parallel()
	r := openRegistry(t, Config{Dir: toolsDir, Background: true})
	if _, total, _ := r.Progress(); total != 4 {
		t.Errorf("Progress total = %d, want the 4 bundled tools", total)
	}
	out := mustCall(t, r, "wordcount", `{"text":"waits for the load"}`)
	if m, _ := out.(map[string]any); m["words"] != float64(4) {
		t.Errorf("wordcount = %v", out)
	}
	if err := r.WaitReady(context.Background()); err != nil {
		t.Fatal(err)
	}
	if loaded, total, ready := r.Progress(); !ready || loaded != total || len(r.Specs()) != 4 {
		t.Errorf("after WaitReady: Progress = %d/%d ready=%v, %d specs", loaded, total, ready, len(r.Specs()))
	}
	select {
	case <-r.Ready():
	default:
		t.Error("Ready() is not closed after WaitReady returned")
	}

	// A cold cache makes the load slow; Close must still return promptly.
	cold, err := Open(context.Background(), Config{Dir: toolsDir, CacheDir: t.TempDir(), Background: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ready := cold.Progress(); ready {
		t.Log("the cold load finished before Close; the test still checks Close")
	}
	if err := cold.Close(context.Background()); err != nil {
		t.Fatalf("Close during the background load = %v", err)
	}
	if _, te := call(t, cold, "wordcount", `{"text":"x"}`); te == nil {
		t.Error("a call after Close succeeded")
	}
}

// TestRequestsNetworkAndGrantedPrivate: the two cheap questions the
// daemon asks of a tool answer from its manifest and its grants, and
// say no for a tool that is not there.
func TestRequestsNetworkAndGrantedPrivate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := openRegistry(t, Config{Dir: toolsDir, Grants: map[string]capabilities.Grants{
		"readfile":  {FS: []capabilities.FSGrant{{HostPath: dir, GuestPath: "/workspace", ReadOnly: true, Private: true}}},
		"writefile": {FS: []capabilities.FSGrant{{HostPath: dir, GuestPath: "/workspace"}}},
	}})
	for _, tt := range []struct {
		name             string
		network, private bool
	}{
		{"fetch", true, false},
		{"readfile", false, true},
		{"writefile", false, false},
		{"nosuchtool", false, false},
	} {
		if got := r.RequestsNetwork(tt.name); got != tt.network {
			t.Errorf("RequestsNetwork(%s) = %v, want %v", tt.name, got, tt.network)
		}
		if got := r.GrantedPrivate(tt.name); got != tt.private {
			t.Errorf("GrantedPrivate(%s) = %v, want %v", tt.name, got, tt.private)
		}
	}
}

// TestCallDuringLoadWaitsForItsToolOnly: while the tools found at Open
// load in the background, a call waits for its own tool, which loads at
// once even if every worker is busy with others, and a call of a tool
// that is not there fails at once.
func TestCallDuringLoadWaitsForItsToolOnly(t *testing.T) {
	release := make(chan struct{})
	testHookLoad = func(name string) {
		if name != "wordcount" {
			<-release
		}
	}
	t.Cleanup(func() { testHookLoad = nil })
	r := openRegistry(t, Config{Dir: toolsDir, Background: true})
	defer close(release) // before the Close that openRegistry's cleanup makes

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := r.Call(ctx, keel.ToolInvocation{Name: "wordcount", Args: json.RawMessage(`{"text":"not waiting for the others"}`)})
	if err != nil {
		t.Fatalf("wordcount while the other tools are held: %v", err)
	}
	if string(out) != `{"words":5,"lines":1,"chars":26}` {
		t.Errorf("wordcount = %s", out)
	}
	if loaded, total, ready := r.Progress(); ready || loaded != 1 || total != 4 {
		t.Errorf("Progress = %d/%d ready=%v, want 1/4, not ready", loaded, total, ready)
	}
	if _, ok := r.Tool("wordcount"); !ok {
		t.Error("wordcount is not listed after a call loaded it")
	}
	for _, tool := range r.Tools() { // the others only as the index lists them
		if loaded := !tool.Compiling; loaded != (tool.Spec.Name == "wordcount") {
			t.Errorf("while only wordcount has loaded, %s is listed with Compiling = %v", tool.Spec.Name, tool.Compiling)
		}
	}
	wantCode(t, r, "nosuchtool", `{}`, keel.ToolNotFound)
}

// TestIndexListsToolsBeforeTheyLoad: a restart lists, from the index the
// last load wrote, every tool whose file and sidecar are unchanged, before
// compiling any; each becomes callable as it loads. A changed file or
// sidecar is not listed until it has loaded.
func TestIndexListsToolsBeforeTheyLoad(t *testing.T) {
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(toolsDir)); err != nil {
		t.Fatal(err)
	}
	cache := cloneCache(t, "index-v"+indexVersion) // compiled code only: the index is per cache
	first := openRegistry(t, Config{Dir: dir, CacheDir: cache, testCache: sharedCache})
	if err := first.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	open := func() (*Registry, func()) {
		release := make(chan struct{})
		testHookLoad = func(name string) {
			if name != "wordcount" {
				<-release
			}
		}
		r := openRegistry(t, Config{Dir: dir, CacheDir: cache, testCache: sharedCache, Background: true})
		return r, func() {
			close(release)
			_ = r.WaitReady(context.Background())
			testHookLoad = nil // no load reads it any more
		}
	}
	r, done := open()
	if !r.Listed() {
		t.Error("Listed() = false with every tool in the index")
	}
	tools := r.Tools()
	if len(tools) != 4 {
		t.Fatalf("Tools() before any load = %d tools, want the 4 indexed", len(tools))
	}
	for _, tool := range tools {
		if !tool.Compiling || tool.SHA256 == "" || len(tool.Spec.InputSchema) == 0 {
			t.Errorf("listed %s = %+v, want Compiling, with its hash and schema", tool.Spec.Name, tool)
		}
	}
	mustCall(t, r, "wordcount", `{"text":"listed, then loaded"}`)
	if wc, _ := r.Tool("wordcount"); wc.Compiling {
		t.Error("wordcount still Compiling after a call loaded it")
	}
	if rf, _ := r.Tool("readfile"); !rf.Compiling {
		t.Error("readfile is not Compiling while its load is held")
	}
	done()
	for _, tool := range r.Tools() {
		if tool.Compiling {
			t.Errorf("%s still Compiling after the load", tool.Spec.Name)
		}
	}

	// A file whose stamp changed, and a sidecar that appeared, are not
	// taken from the index.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(dir, "fetch.wasm"), later, later); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "writefile.manifest.json"), []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	r, done = open()
	defer done()
	if r.Listed() {
		t.Error("Listed() = true with two tools changed since the index")
	}
	var names []string
	for _, tool := range r.Tools() {
		names = append(names, tool.Spec.Name)
	}
	if want := []string{"readfile", "wordcount"}; !slices.Equal(names, want) {
		t.Errorf("listed after changes = %v, want %v", names, want)
	}
}

// TestBackgroundLoadNotifies: with Background, OnChange is called as
// each tool of the first load becomes callable and once more when the
// load ends, so a client can wait for the tools instead of polling
// Progress (it was called only by Reload).
func TestBackgroundLoadNotifies(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	calls := 0
	r := openRegistry(t, Config{Dir: toolsDir, Background: true, OnChange: func() {
		mu.Lock()
		calls++
		mu.Unlock()
	}})
	if err := r.WaitReady(context.Background()); err != nil {
		t.Fatal(err)
	}
	// WaitReady returns when the load's goroutine closes ready, which it
	// does after its last OnChange (deferred close).
	mu.Lock()
	defer mu.Unlock()
	if want := len(r.Specs()) + 1; calls < want {
		t.Errorf("OnChange called %d times during a background load of %d tools, want at least %d", calls, len(r.Specs()), want)
	}
}
