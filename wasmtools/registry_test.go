package wasmtools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

// workspace makes a directory to grant as /workspace, with notes.txt,
// sub/deep.txt and a link to notes.txt that stays inside.
func workspace(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "notes.txt"), "hello from the workspace\n")
	mustWrite(t, filepath.Join(dir, "sub", "deep.txt"), "deep")
	if err := os.Symlink("notes.txt", filepath.Join(dir, "inner-link.txt")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readOnlyWorkspace(host string) map[string]capabilities.Grants {
	return map[string]capabilities.Grants{"readfile": {FS: []capabilities.FSGrant{{HostPath: host, GuestPath: "/workspace", ReadOnly: true}}}}
}

func TestOpenListsTools(t *testing.T) {
	t.Parallel()
	ws := workspace(t)
	r := openRegistry(t, Config{Dir: toolsDir, Grants: readOnlyWorkspace(ws)})

	tools := r.Tools()
	var names []string
	for _, tool := range tools {
		names = append(names, tool.Spec.Name)
	}
	if want := []string{"fetch", "readfile", "wordcount", "writefile"}; !slices.Equal(names, want) {
		t.Fatalf("Tools() names = %q, want %q", names, want)
	}
	for _, tool := range tools {
		if len(tool.Spec.InputSchema) == 0 || len(tool.Spec.OutputSchema) == 0 {
			t.Errorf("%s: schemas input %s output %s, want both", tool.Spec.Name, tool.Spec.InputSchema, tool.Spec.OutputSchema)
		}
		wantSE := keel.SideEffectReadOnly
		if tool.Spec.Name == "writefile" {
			wantSE = keel.SideEffectIdempotentWrite
		}
		if tool.Spec.SideEffects != wantSE {
			t.Errorf("%s: side effects %q, want %s", tool.Spec.Name, tool.Spec.SideEffects, wantSE)
		}
		if se, ok := r.SideEffects(tool.Spec.Name); !ok || se != wantSE {
			t.Errorf("SideEffects(%s) = %q, %v; want %s, true", tool.Spec.Name, se, ok, wantSE)
		}
		if tool.Spec.Description == "" || tool.Spec.Version == "" {
			t.Errorf("%s: description %q version %q, want both", tool.Spec.Name, tool.Spec.Description, tool.Spec.Version)
		}
		bin, err := os.ReadFile(filepath.Join(toolsDir, tool.Spec.Name+".wasm"))
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(bin); tool.SHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: SHA256 %s, want %x", tool.Spec.Name, tool.SHA256, sum)
		}
		if !filepath.IsAbs(tool.Path) || filepath.Base(tool.Path) != tool.Spec.Name+".wasm" {
			t.Errorf("%s: Path %q, want the absolute path of the .wasm", tool.Spec.Name, tool.Path)
		}
	}
	readfile, wordcount := tools[1], tools[2]
	wantReq := capabilities.Grants{FS: []capabilities.FSGrant{{GuestPath: "/workspace", ReadOnly: true}}}
	if diff := cmp.Diff(wantReq, readfile.Requests); diff != "" {
		t.Errorf("readfile Requests mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(readOnlyWorkspace(ws)["readfile"].FS, readfile.Grants.FS); diff != "" {
		t.Errorf("readfile Grants mismatch (-want +got):\n%s", diff)
	}
	if !wordcount.Requests.Empty() || !wordcount.Grants.Empty() {
		t.Errorf("wordcount Requests %+v Grants %+v, want both empty", wordcount.Requests, wordcount.Grants)
	}
	var inputSchema map[string]any
	if err := json.Unmarshal(readfile.Spec.InputSchema, &inputSchema); err != nil || inputSchema["type"] != "object" {
		t.Errorf("readfile input schema = %s, want an object schema", readfile.Spec.InputSchema)
	}

	if se, ok := r.SideEffects("nope"); ok {
		t.Errorf("SideEffects(nope) = %q, true; want false", se)
	}
	specs := r.Specs()
	for i := range tools {
		if diff := cmp.Diff(tools[i].Spec, specs[i]); diff != "" {
			t.Errorf("Specs()[%d] differs from Tools()[%d].Spec:\n%s", i, i, diff)
		}
	}
	// The results are copies: changing them changes nothing inside.
	tools[1].Grants.FS[0].HostPath = "/elsewhere"
	specs[1].InputSchema[0] = 'X'
	if got := r.Tools()[1]; got.Grants.FS[0].HostPath != ws || got.Spec.InputSchema[0] != '{' {
		t.Errorf("Tools() shares memory with the registry")
	}
}

func TestWordcount(t *testing.T) {
	t.Parallel()
	r := plainRegistry(t)
	tests := []struct {
		text string
		want map[string]any
	}{
		{"", map[string]any{"words": 0.0, "lines": 0.0, "chars": 0.0}},
		{"hello world", map[string]any{"words": 2.0, "lines": 1.0, "chars": 11.0}},
		{"one\ntwo three\n\nfour", map[string]any{"words": 4.0, "lines": 4.0, "chars": 19.0}},
		{"héllo wörld ✓\n", map[string]any{"words": 3.0, "lines": 1.0, "chars": 14.0}},
	}
	for _, tt := range tests {
		in, _ := json.Marshal(map[string]string{"text": tt.text})
		got := mustCall(t, r, "wordcount", string(in))
		if diff := cmp.Diff(any(tt.want), got); diff != "" {
			t.Errorf("wordcount(%q) mismatch (-want +got):\n%s", tt.text, diff)
		}
	}
}

func TestReadFile(t *testing.T) {
	t.Parallel()
	ws := workspace(t)
	r := openRegistry(t, Config{Dir: readfileDir, Grants: readOnlyWorkspace(ws)})
	tests := []struct {
		input string
		want  map[string]any
	}{
		{`{"path":"notes.txt"}`, map[string]any{"path": "notes.txt", "content": "hello from the workspace\n", "truncated": false}},
		{`{"path":"/workspace/sub/deep.txt"}`, map[string]any{"path": "sub/deep.txt", "content": "deep", "truncated": false}},
		{`{"path":"notes.txt","max_bytes":5}`, map[string]any{"path": "notes.txt", "content": "hello", "truncated": true}},
		{`{"path":"inner-link.txt"}`, map[string]any{"path": "inner-link.txt", "content": "hello from the workspace\n", "truncated": false}},
	}
	for _, tt := range tests {
		got := mustCall(t, r, "readfile", tt.input)
		if diff := cmp.Diff(any(tt.want), got); diff != "" {
			t.Errorf("readfile(%s) mismatch (-want +got):\n%s", tt.input, diff)
		}
	}
	terr := wantCode(t, r, "readfile", `{"path":"missing.txt"}`, keel.ToolFailed)
	if !strings.Contains(terr.Message, "not_found") {
		t.Errorf("readfile(missing.txt) error = %v, want the tool's not_found", terr)
	}
}

// TestConfinement tries to read a secret outside the granted directory,
// through readfile (which checks paths itself) and through hostile (which
// opens whatever it is given, so only the sandbox stands in the way).
func TestConfinement(t *testing.T) {
	t.Parallel()
	const secret = "TOP-SECRET-8d1f"
	outside := t.TempDir()
	secretFile := filepath.Join(outside, "secret.txt")
	mustWrite(t, secretFile, secret)
	ws := workspace(t)
	if err := os.Symlink(secretFile, filepath.Join(ws, "escape.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(ws, "escape-dir")); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(ws, secretFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(rel, filepath.Join(ws, "escape-rel.txt")); err != nil {
		t.Fatal(err)
	}
	grant := capabilities.Grants{FS: []capabilities.FSGrant{{HostPath: ws, GuestPath: "/workspace", ReadOnly: true}}}
	r := openRegistry(t, Config{Dir: readfileDir, Grants: map[string]capabilities.Grants{"readfile": grant}})
	h := openRegistry(t, Config{Dir: hostileDir, Grants: map[string]capabilities.Grants{"hostile": grant}})

	// The same directory is readable, so a failure below is confinement.
	if got := mustCall(t, h, "hostile", `{"mode":"read","path":"/workspace/notes.txt"}`); !strings.Contains(fmt.Sprint(got), "hello from the workspace") {
		t.Fatalf("hostile read of a granted file = %v", got)
	}
	paths := []string{
		"../../etc/passwd",
		"/etc/passwd",
		secretFile,
		"escape.txt",
		"escape-rel.txt",
		"escape-dir/secret.txt",
		"sub/../../" + rel,
	}
	for _, p := range paths {
		in, _ := json.Marshal(map[string]any{"path": p})
		terr := wantCode(t, r, "readfile", string(in), keel.ToolFailed)
		if strings.Contains(terr.Message, secret) || strings.Contains(terr.Message, "root:") {
			t.Errorf("readfile(%s) leaked: %v", p, terr)
		}
		for _, guest := range []string{p, "/workspace/" + p} {
			in, _ := json.Marshal(map[string]any{"mode": "read", "path": guest})
			v, terr := call(t, h, "hostile", string(in))
			if terr == nil || strings.Contains(terr.Message, secret) {
				t.Errorf("hostile read of %s = %v, %v; want a read error without the secret", guest, v, terr)
			}
		}
	}
}

func TestWriteAccess(t *testing.T) {
	t.Parallel()
	ws := workspace(t)
	for _, readOnly := range []bool{true, false} {
		t.Run(fmt.Sprintf("read_only=%v", readOnly), func(t *testing.T) {
			grant := capabilities.Grants{FS: []capabilities.FSGrant{{HostPath: ws, GuestPath: "/workspace", ReadOnly: readOnly}}}
			h := openRegistry(t, Config{Dir: hostileDir, Grants: map[string]capabilities.Grants{"hostile": grant}})
			name := fmt.Sprintf("written-%v.txt", readOnly)
			in := fmt.Sprintf(`{"mode":"write","path":"/workspace/%s","data":"new"}`, name)
			v, terr := call(t, h, "hostile", in)
			got, err := os.ReadFile(filepath.Join(ws, name))
			if readOnly {
				if terr == nil || err == nil {
					t.Fatalf("write to a read-only grant = %v, %v; host file read err %v; want refused", v, terr, err)
				}
				return
			}
			if terr != nil || string(got) != "new" {
				t.Fatalf("write to a read-write grant = %v, %v; host file %q (%v), want written", v, terr, got, err)
			}
			ls := mustCall(t, h, "hostile", `{"mode":"ls","path":"/workspace"}`)
			want := map[string]any{"names": []any{"inner-link.txt", "notes.txt", "sub", name}}
			if diff := cmp.Diff(any(want), ls); diff != "" {
				t.Errorf("ls /workspace mismatch (-want +got):\n%s", diff)
			}
			// A link the guest makes cannot lead it out either.
			mustCall(t, h, "hostile", `{"mode":"symlink","path":"/workspace/out","data":"../../../../../../etc/passwd"}`)
			if v, terr := call(t, h, "hostile", `{"mode":"read","path":"/workspace/out"}`); terr == nil {
				t.Errorf("read through a guest-made link out of the grant = %v, want refused", v)
			}
		})
	}
}

func TestPermissionDenied(t *testing.T) {
	t.Parallel()
	r := plainRegistry(t) // no grants at all
	terr := wantCode(t, r, "readfile", `{"path":"notes.txt"}`, keel.ToolPermissionDenied)
	if !strings.Contains(terr.Message, "/workspace") {
		t.Errorf("permission error %q does not name the missing grant", terr.Message)
	}
	mustCall(t, r, "wordcount", `{"text":"needs nothing"}`)

	// A read-only request is not met by a grant of another directory.
	other := map[string]capabilities.Grants{"readfile": {FS: []capabilities.FSGrant{{HostPath: t.TempDir(), GuestPath: "/data", ReadOnly: true}}}}
	r = openRegistry(t, Config{Dir: readfileDir, Grants: other})
	wantCode(t, r, "readfile", `{"path":"notes.txt"}`, keel.ToolPermissionDenied)

	// A grant whose host directory does not exist is dropped.
	missing := readOnlyWorkspace(filepath.Join(t.TempDir(), "does-not-exist"))
	r = openRegistry(t, Config{Dir: readfileDir, Grants: missing})
	wantCode(t, r, "readfile", `{"path":"notes.txt"}`, keel.ToolPermissionDenied)
	if g := r.Tools()[0].Grants; !g.Empty() {
		t.Errorf("readfile Grants = %+v after its directory was missing, want none", g)
	}
}

func TestInvalidInput(t *testing.T) {
	t.Parallel()
	r := openRegistry(t, Config{Dir: readfileDir, Grants: readOnlyWorkspace(t.TempDir())})
	tests := []struct {
		tool, input, path string
	}{
		{"readfile", `{"path":5}`, "/path"},
		{"readfile", `{}`, "/path"},
		{"readfile", `{"path":"x","max_bytes":0}`, "/max_bytes"},
		{"readfile", `{"path":"x","max_bytes":"many"}`, "/max_bytes"},
		{"readfile", `{"path":"x","extra":true}`, "/extra"},
		{"readfile", `[]`, ""},
		{"readfile", `not json`, ""},
		{"readfile", ``, "/path"}, // empty is {}
		{"readfile", `{"path":"a"} {"path":"b"}`, ""},
	}
	for _, tt := range tests {
		terr := wantCode(t, r, tt.tool, tt.input, keel.ToolInvalidInput)
		if terr.Path != tt.path || terr.Message == "" {
			t.Errorf("%s(%s) error = %+v, want path %q and a message", tt.tool, tt.input, terr, tt.path)
		}
	}
}

func TestNotFound(t *testing.T) {
	t.Parallel()
	r := plainRegistry(t)
	terr := wantCode(t, r, "nosuchtool", `{}`, keel.ToolNotFound)
	if !strings.Contains(terr.Message, "nosuchtool") {
		t.Errorf("not_found message %q does not name the tool", terr.Message)
	}
}

func TestHostile(t *testing.T) {
	t.Parallel()
	// Only the cases that must time out run with a short limit, so a slow
	// machine cannot turn another failure into a timeout.
	const timeout = 2 * time.Second
	r := openRegistry(t, Config{Dir: hostileDir, CallTimeout: time.Minute, MemoryLimitMiB: 64, MaxOutputBytes: 64 << 10})
	short := openRegistry(t, Config{Dir: hostileDir, CallTimeout: timeout})
	tests := []struct {
		name, tool, input string
		code              keel.ToolErrorCode
		message           string // a part of the error message
	}{
		{"endless loop", "hostile", `{"mode":"loop"}`, keel.ToolTimeout, "time limit"},
		{"sleep", "hostile", `{"mode":"sleep"}`, keel.ToolTimeout, "time limit"},
		{"hand-written loop", "spin", `{}`, keel.ToolTimeout, "time limit"},
		{"memory bomb", "hostile", `{"mode":"oom"}`, keel.ToolResourceExhausted, "memory"},
		{"one huge allocation", "hostile", `{"mode":"bigalloc"}`, keel.ToolResourceExhausted, "memory"},
		{"stack bomb", "hostile", `{"mode":"stackbomb"}`, keel.ToolResourceExhausted, "memory"},
		{"huge stdout", "hostile", `{"mode":"spew"}`, keel.ToolResourceExhausted, "output"},
		{"panic", "hostile", `{"mode":"panic"}`, keel.ToolCrashed, "panic: boom"},
		{"exit code", "hostile", `{"mode":"exit"}`, keel.ToolCrashed, "code 3"},
		{"garbage stdout", "hostile", `{"mode":"garbage"}`, keel.ToolCrashed, "malformed"},
		{"two results", "hostile", `{"mode":"two"}`, keel.ToolCrashed, "more than one"},
		{"output breaks schema", "hostile", `{"mode":"badoutput"}`, keel.ToolFailed, "contract"},
		{"own error", "hostile", `{"mode":"fail"}`, keel.ToolFailed, "on_purpose: failed as asked"},
	}
	t.Run("cases", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				reg := r
				if tt.code == keel.ToolTimeout {
					reg = short
					t.Parallel()
				}
				start := time.Now()
				terr := wantCode(t, reg, tt.tool, tt.input, tt.code)
				if !strings.Contains(terr.Message, tt.message) {
					t.Errorf("%s error = %q, want it to mention %q", tt.name, terr.Message, tt.message)
				}
				if d := time.Since(start); tt.code == keel.ToolTimeout && d > timeout+time.Minute { // the guest loops or sleeps for an hour: only the limit ends it
					t.Errorf("%s took %v; the call timeout is %v", tt.name, d, timeout)
				}
			})
		}
	})
	// The registries still work after all that. t.Run("cases") returns
	// once its parallel subtests are done, so this runs after them.
	t.Run("still works", func(t *testing.T) {
		for _, reg := range []*Registry{r, short} {
			if got := mustCall(t, reg, "hostile", `{"mode":"ok"}`); !cmp.Equal(got, any(map[string]any{"ok": true})) {
				t.Errorf("hostile ok = %v", got)
			}
			if got := mustCall(t, reg, "fixed", `{}`); !cmp.Equal(got, any(map[string]any{"greeting": "hi"})) {
				t.Errorf("fixed = %v", got)
			}
		}
	})
}

func TestDeniedByDefault(t *testing.T) {
	t.Setenv("KEEL_TEST_GRANTED", "yes")
	t.Setenv("KEEL_TEST_SECRET", "no")
	r := openRegistry(t, Config{Dir: hostileDir})
	got := mustCall(t, r, "hostile", `{"mode":"env"}`)
	want := map[string]any{"env": []any{}, "args": []any{"hostile"}}
	if diff := cmp.Diff(any(want), got); diff != "" {
		t.Errorf("env and args without grants mismatch (-want +got):\n%s", diff)
	}
	if v, terr := call(t, r, "hostile", `{"mode":"read","path":"/etc/passwd"}`); terr == nil {
		t.Errorf("read /etc/passwd without grants = %v, want refused", v)
	}

	grants := map[string]capabilities.Grants{"hostile": {Env: []string{"KEEL_TEST_GRANTED"}}}
	r = openRegistry(t, Config{Dir: hostileDir, Grants: grants})
	got = mustCall(t, r, "hostile", `{"mode":"env"}`)
	want = map[string]any{"env": []any{"KEEL_TEST_GRANTED=yes"}, "args": []any{"hostile"}}
	if diff := cmp.Diff(any(want), got); diff != "" {
		t.Errorf("env with one granted name mismatch (-want +got):\n%s", diff)
	}
}

func TestOpenSkipsBroken(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	r := openRegistry(t, Config{Dir: brokenDir, Logger: testLogger(t, &logs)})
	var names []string
	for _, tool := range r.Tools() {
		names = append(names, tool.Spec.Name)
	}
	if want := []string{"fixed"}; !slices.Equal(names, want) {
		t.Errorf("Tools() = %q, want %q\nlog:\n%s", names, want, logs.String())
	}
	mustCall(t, r, "fixed", `{}`)
	for file, why := range map[string]string{
		"notwasm.wasm":     "WebAssembly",
		"sneaky.wasm":      "env.sneaky",
		"Bad-Name.wasm":    "not a tool name",
		"badmanifest.wasm": "side_effects",
		"misnamed.wasm":    "does not match",
		"nomanifest.wasm":  "manifest",
		"bigmemory.wasm":   "312 MiB",
		"reactor.wasm":     "_start",
	} {
		var line string
		for l := range strings.Lines(logs.String()) {
			if strings.Contains(l, file) {
				line = l
			}
		}
		if !strings.Contains(line, "tool skipped") || !strings.Contains(line, why) {
			t.Errorf("log line for %s = %q, want it skipped because of %q", file, line, why)
		}
	}
}

func TestCompileCache(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := openRegistry(t, Config{Dir: tinyDir, CacheDir: dir})
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) == 0 {
		t.Fatalf("cache dir after Open: %v, %v; want entries", entries, err)
	}
	r = openRegistry(t, Config{Dir: tinyDir, CacheDir: dir})
	mustCall(t, r, "fixed", `{}`)
}

func TestConcurrentCalls(t *testing.T) {
	t.Parallel()
	r := plainRegistry(t)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 3 {
				text := strings.Repeat("w ", i+j)
				out, err := r.Call(context.Background(), keel.ToolInvocation{Name: "wordcount", Args: json.RawMessage(fmt.Sprintf(`{"text":%q}`, text))})
				if err != nil {
					t.Errorf("Call: %v", err)
					return
				}
				var got struct{ Words int }
				if err := json.Unmarshal(out, &got); err != nil || got.Words != i+j {
					t.Errorf("wordcount(%q) = %s, want %d words", text, out, i+j)
				}
			}
		})
	}
	wg.Wait()
}

func TestCallContext(t *testing.T) {
	t.Parallel()
	r := openRegistry(t, Config{Dir: hostileDir, CallTimeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := r.Call(ctx, keel.ToolInvocation{Name: "hostile", Args: json.RawMessage(`{"mode":"loop"}`)})
	if te, ok := err.(*keel.ToolError); !ok || te.Code != keel.ToolTimeout || !strings.Contains(te.Message, "caller's deadline") {
		t.Fatalf("Call with a 500ms context = %v, want a timeout at the caller's deadline", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Call with a 500ms context took %v", d)
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	inFlight := make(chan struct{})
	r, err := Open(context.Background(), shared(Config{Dir: hostileDir, CallTimeout: time.Minute,
		testHookCall: func(string) { close(inFlight) }}))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.Call(context.Background(), keel.ToolInvocation{Name: "spin", Args: json.RawMessage(`{}`)})
		done <- err
	}()
	<-inFlight
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-done:
		if te, ok := err.(*keel.ToolError); !ok || te.Code != keel.ToolTimeout {
			t.Errorf("call in flight at Close = %v, want a timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close returned but the call in flight did not")
	}
	if _, err := r.Call(context.Background(), keel.ToolInvocation{Name: "spin", Args: json.RawMessage(`{}`)}); err == nil {
		t.Error("Call after Close succeeded")
	}
	if err := r.Close(context.Background()); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestOpenConfig(t *testing.T) {
	t.Parallel()
	if _, err := Open(context.Background(), Config{}); err == nil {
		t.Error("Open without Dir succeeded")
	}
	if _, err := Open(context.Background(), Config{Dir: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Error("Open of a missing Dir succeeded")
	}
	r := openRegistry(t, Config{Dir: t.TempDir()})
	if got := r.Tools(); len(got) != 0 {
		t.Errorf("Tools() of an empty dir = %v", got)
	}
}

// TestModuleManifestIsCached: a manifest a module reports is kept in the
// cache under the module's hash and its name, and a restart reads it from
// there instead of starting an instance to ask again.
func TestModuleManifestIsCached(t *testing.T) {
	t.Parallel()
	cache := cloneCache(t, "manifests") // the compiled code, so the test compiles nothing
	r := openRegistry(t, Config{Dir: bundledDir["wordcount"], CacheDir: cache, testCache: sharedCache})
	wc, ok := r.Tool("wordcount")
	if !ok {
		t.Fatal("no wordcount")
	}
	file := filepath.Join(cache, "manifests", wc.SHA256+"-wordcount-v"+manifestCacheVersion+".json")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("the manifest was not cached: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil || m["description"] != wc.Spec.Description {
		t.Fatalf("cached manifest = %s (%v), want wordcount's", data, err)
	}
	m["description"] = "read back from the cache"
	data, _ = json.Marshal(m)
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	again := openRegistry(t, Config{Dir: bundledDir["wordcount"], CacheDir: cache, testCache: sharedCache})
	if got, _ := again.Tool("wordcount"); got.Spec.Description != "read back from the cache" {
		t.Errorf("after a restart the description is %q; the cached manifest was not used", got.Spec.Description)
	}
}
