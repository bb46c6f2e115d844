package wasmtools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

// realTempDir is a temporary directory with its symbolic links resolved
// (macOS's /var is one), as the sandbox records paths.
func realTempDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// touchedCall calls a tool asking for what it touched, with egress as
// the egress check.
func touchedCall(t *testing.T, r *Registry, name, input string, egress keel.EgressCheck) (keel.Touched, json.RawMessage, *keel.ToolError) {
	t.Helper()
	var touched keel.Touched
	out, err := r.Call(context.Background(), keel.ToolInvocation{Name: name, Args: json.RawMessage(input), Touched: &touched, Egress: egress})
	if err != nil {
		var te *keel.ToolError
		if !errors.As(err, &te) {
			t.Fatalf("Call(%s, %s) error %T %v, want *keel.ToolError", name, input, err, err)
		}
		return touched, nil, te
	}
	return touched, out, nil
}

func writeFile(t *testing.T, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestTouchedPaths: a readfile call records the host path it opened,
// resolved as the sandbox resolved it, under a plain layout and under
// one whose granted directory and file are symbolic links; the next call
// on the same pooled instance records only its own.
func TestTouchedPaths(t *testing.T) {
	t.Parallel()
	base := realTempDir(t)
	plainDir := filepath.Join(base, "plain")
	writeFile(t, filepath.Join(plainDir, "notes", "a.txt"), "alpha")
	// linked: the grant names a link to the directory, and the file read
	// is a link to another file inside it.
	realDir := filepath.Join(base, "real")
	writeFile(t, filepath.Join(realDir, "sub", "target.txt"), "beta")
	if err := os.Symlink(realDir, filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("sub", "target.txt"), filepath.Join(realDir, "alias.txt")); err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		name, host, path, want string
	}{
		{"plain", plainDir, "notes/a.txt", filepath.Join(plainDir, "notes", "a.txt")},
		{"symlinked", filepath.Join(base, "link"), "alias.txt", filepath.Join(realDir, "sub", "target.txt")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := openRegistry(t, Config{Dir: bundledDir["readfile"], Grants: map[string]capabilities.Grants{
				"readfile": {FS: []capabilities.FSGrant{{HostPath: tt.host, GuestPath: "/workspace", ReadOnly: true}}}}})
			touched, _, terr := touchedCall(t, r, "readfile", fmt.Sprintf(`{"path":%q}`, tt.path), nil)
			if terr != nil {
				t.Fatalf("readfile %s: %v", tt.path, terr)
			}
			if want := (keel.Touched{Paths: []string{tt.want}}); !cmp.Equal(touched, want) {
				t.Errorf("Touched = %+v, want %+v", touched, want)
			}
			// The same instance again, opening nothing (the file is
			// missing): nothing of the first call is left.
			touched, _, terr = touchedCall(t, r, "readfile", `{"path":"missing.txt"}`, nil)
			if terr == nil {
				t.Fatal("readfile of a missing file succeeded")
			}
			if !cmp.Equal(touched, keel.Touched{}) {
				t.Errorf("a call that opened nothing: Touched = %+v, want nothing", touched)
			}
			if s, _ := r.PoolStats("readfile"); s.Instantiations != 1 {
				t.Errorf("the calls used %d instances, want 1 (the test is about reuse)", s.Instantiations)
			}
		})
	}
}

// TestTouchedNothing: a tool without grants records nothing, and a call
// that does not ask records nothing anywhere.
func TestTouchedNothing(t *testing.T) {
	t.Parallel()
	ws := realTempDir(t)
	writeFile(t, filepath.Join(ws, "a.txt"), "alpha")
	r := openRegistry(t, Config{Dir: toolsDir, Grants: readOnlyWorkspace(ws)})
	touched, _, terr := touchedCall(t, r, "wordcount", `{"text":"a b"}`, nil)
	if terr != nil || !cmp.Equal(touched, keel.Touched{}) {
		t.Errorf("wordcount: Touched = %+v, %v; want nothing", touched, terr)
	}
	// A call that does not ask, then one that does on the same
	// instance: the second records its own open only.
	mustCall(t, r, "readfile", `{"path":"a.txt"}`)
	touched, _, terr = touchedCall(t, r, "readfile", `{"path":"a.txt"}`, nil)
	if want := []string{filepath.Join(ws, "a.txt")}; terr != nil || !slices.Equal(touched.Paths, want) {
		t.Errorf("readfile after an unrecorded call: Touched = %+v, %v; want paths %q", touched, terr, want)
	}
}

// TestTouchedConcurrent: calls of one tool running at once, each on its
// own instance, record only their own paths, and so do the calls that
// reuse those instances afterwards.
func TestTouchedConcurrent(t *testing.T) {
	t.Parallel()
	ws := realTempDir(t)
	const n = 4
	for i := range n {
		writeFile(t, filepath.Join(ws, fmt.Sprintf("f%d.txt", i)), strings.Repeat("x", i+1))
	}
	// The first n calls wait, holding their instances, until all n
	// hold one, so they run on n instances at once.
	var arrived sync.WaitGroup
	arrived.Add(n)
	var first atomic.Int32
	all := make(chan struct{})
	go func() { arrived.Wait(); close(all) }()
	hook := func(string) {
		if first.Add(1) <= n {
			arrived.Done()
			select {
			case <-all:
			case <-time.After(time.Minute):
			}
		}
	}
	r := openRegistry(t, Config{Dir: readfileDir, Grants: readOnlyWorkspace(ws), MaxIdleInstances: n, testHookInstance: hook})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for round := range 5 {
				name := fmt.Sprintf("f%d.txt", (i+round)%n)
				touched, _, terr := touchedCall(t, r, "readfile", fmt.Sprintf(`{"path":%q}`, name), nil)
				if want := []string{filepath.Join(ws, name)}; terr != nil || !slices.Equal(touched.Paths, want) {
					t.Errorf("call %d.%d: Touched = %+v, %v; want paths %q", i, round, touched, terr, want)
				}
			}
		})
	}
	wg.Wait()
	if s, _ := r.PoolStats("readfile"); s.Instantiations != n {
		t.Errorf("%d instances for %d concurrent calls, want %[2]d", s.Instantiations, n)
	}
}

// TestTouchedLabels: a call carries the labels of the grant it opened a
// file through and those its manifest declares; the grants and the
// tool show them; a pooled instance keeps the labels of what it read,
// and a tool with fresh isolation does not.
func TestTouchedLabels(t *testing.T) {
	t.Parallel()
	ws := realTempDir(t)
	writeFile(t, filepath.Join(ws, "a.txt"), "alpha")
	bin, err := os.ReadFile(filepath.Join(readfileDir, "readfile.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	sidecar := func(extra string) []byte {
		return []byte(`{"name":"readfile","description":"reads a file","side_effects":"read_only",
			"input_schema":{"type":"object","properties":{"path":{"type":"string","format":"path"}},"required":["path"]},
			"requests":{"fs":[{"guest_path":"/workspace","read_only":true}]},
			"labels":["secret","secret"]` + extra + `}`)
	}
	grants := map[string]capabilities.Grants{"readfile": {FS: []capabilities.FSGrant{
		{HostPath: ws, GuestPath: "/workspace", ReadOnly: true, Private: true, Labels: []string{"pii"}}}}}
	for _, tt := range []struct {
		name, extra   string
		afterNoOpen   []string // labels of a later call that opens nothing
		instantiation int64
	}{
		{"pooled", "", []string{"pii", "private", "secret"}, 1},
		{"fresh", `,"isolation":"fresh"`, []string{"secret"}, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if err := writeFiles(dir, map[string][]byte{"readfile.wasm": bin, "readfile.manifest.json": sidecar(tt.extra)}); err != nil {
				t.Fatal(err)
			}
			r := openRegistry(t, Config{Dir: dir, Grants: grants})
			tool, ok := r.Tool("readfile")
			if !ok {
				t.Fatal("readfile did not load")
			}
			if !slices.Equal(tool.Labels, []string{"secret"}) || len(tool.Grants.FS) != 1 || !slices.Equal(tool.Grants.FS[0].Labels, []string{"pii"}) {
				t.Errorf("Tool: labels %q, grants %+v; want the manifest's [secret] and the grant's [pii]", tool.Labels, tool.Grants.FS)
			}
			touched, _, terr := touchedCall(t, r, "readfile", `{"path":"a.txt"}`, nil)
			want := keel.Touched{Paths: []string{filepath.Join(ws, "a.txt")}, Labels: []string{"pii", "private", "secret"}}
			if terr != nil || !cmp.Equal(touched, want) {
				t.Errorf("readfile: Touched = %+v, %v; want %+v", touched, terr, want)
			}
			touched, _, _ = touchedCall(t, r, "readfile", `{"path":"missing.txt"}`, nil)
			if want := (keel.Touched{Labels: tt.afterNoOpen}); !cmp.Equal(touched, want) {
				t.Errorf("a later call that opened nothing: Touched = %+v, want %+v", touched, want)
			}
			if s, _ := r.PoolStats("readfile"); s.Instantiations != tt.instantiation {
				t.Errorf("%d instances, want %d", s.Instantiations, tt.instantiation)
			}
		})
	}
}

// TestTouchedTruncated: a call that opens more than keel.MaxTouchedPaths
// files records the first ones and says it did not record them all.
func TestTouchedTruncated(t *testing.T) {
	t.Parallel()
	var c callTouch
	for i := range keel.MaxTouchedPaths + 10 {
		c.opened(fmt.Sprintf("/p/%d", i%(keel.MaxTouchedPaths+5)))
		c.opened("/p/0") // deduplicated
	}
	var got keel.Touched
	c.fill(&got, nil, nil)
	if len(got.Paths) != keel.MaxTouchedPaths || !got.Truncated || got.Paths[0] != "/p/0" || got.Paths[1] != "/p/1" {
		t.Errorf("fill: %d paths (first %q), truncated %v; want %d in first-open order, truncated", len(got.Paths), got.Paths[:2], got.Truncated, keel.MaxTouchedPaths)
	}
	var few callTouch
	for range 3 {
		few.opened("/a")
		few.opened("/b")
	}
	few.fill(&got, nil, nil)
	if !slices.Equal(got.Paths, []string{"/a", "/b"}) || got.Truncated {
		t.Errorf("fill: %+v, want /a, /b", got)
	}
}

// TestTouchedNetwork drives the bundled fetch tool: a call records the
// host:port it reached; the egress check is asked with the destination
// URL and may refuse the request, which the server never sees, the tool
// gets as a network refusal and the call fails with; a redirect hop is
// checked and recorded too.
func TestTouchedNetwork(t *testing.T) {
	t.Parallel()
	var otherHits atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		otherHits.Add(1)
		fmt.Fprint(w, "other")
	}))
	defer other.Close()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, other.URL+"/x", http.StatusFound)
			return
		}
		fmt.Fprint(w, "hello")
	}))
	defer srv.Close()
	hostport := func(u string) string { return strings.TrimPrefix(u, "http://") }
	var grants []string
	for _, u := range []string{srv.URL, other.URL} {
		d, err := capabilities.ParseDestination(u)
		if err != nil {
			t.Fatal(err)
		}
		grants = append(grants, d.String())
	}
	r := openRegistry(t, Config{Dir: bundledDir["fetch"], Grants: map[string]capabilities.Grants{"fetch": {Network: grants}}, AllowPrivateNetwork: true})

	// Allowed: the host is recorded, the check saw the URL.
	var asked []string
	var mu sync.Mutex
	allowAll := func(ctx context.Context, dest string) error {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, dest)
		return nil
	}
	touched, _, terr := touchedCall(t, r, "fetch", fmt.Sprintf(`{"url":%q}`, srv.URL+"/a"), allowAll)
	if terr != nil || !slices.Equal(touched.Hosts, []string{hostport(srv.URL)}) || len(touched.Paths) != 0 {
		t.Errorf("allowed fetch: Touched = %+v, %v; want hosts [%s]", touched, terr, hostport(srv.URL))
	}
	if !slices.Equal(asked, []string{srv.URL + "/a"}) {
		t.Errorf("egress check asked %q, want [%s/a]", asked, srv.URL)
	}

	// Refused by the check: the server is not reached, the call fails
	// naming the destination and the reason.
	errNo := errors.New("no egress after private data")
	before := hits.Load()
	touched, _, terr = touchedCall(t, r, "fetch", fmt.Sprintf(`{"url":%q}`, srv.URL+"/b"), func(context.Context, string) error { return errNo })
	if terr == nil || terr.Code != keel.ToolPermissionDenied || !strings.Contains(terr.Message, errNo.Error()) || !strings.Contains(terr.Message, hostport(srv.URL)) {
		t.Errorf("refused fetch: error %v, want permission_denied naming %s and the reason", terr, hostport(srv.URL))
	}
	if hits.Load() != before {
		t.Error("the egress check refused the request, but the server received it")
	}
	if !slices.Equal(touched.Hosts, []string{hostport(srv.URL)}) {
		t.Errorf("refused fetch: Touched.Hosts = %q, want the refused host", touched.Hosts)
	}
	// A check that answers with a tool error gives the call its code.
	_, _, terr = touchedCall(t, r, "fetch", fmt.Sprintf(`{"url":%q}`, srv.URL+"/c"), func(context.Context, string) error {
		return &keel.ToolError{Code: keel.ToolPolicyDenied, Message: "deny: rule 1"}
	})
	if terr == nil || terr.Code != keel.ToolPolicyDenied || !strings.Contains(terr.Message, "deny: rule 1") {
		t.Errorf("fetch refused by a policy error: %v, want policy_denied with the explanation", terr)
	}

	// A redirect hop is asked about too: allowed to the first server,
	// refused to the second, which is never reached.
	asked = nil
	refuseOther := func(ctx context.Context, dest string) error {
		mu.Lock()
		asked = append(asked, dest)
		mu.Unlock()
		if strings.HasPrefix(dest, other.URL) {
			return errNo
		}
		return nil
	}
	touched, _, terr = touchedCall(t, r, "fetch", fmt.Sprintf(`{"url":%q}`, srv.URL+"/redirect"), refuseOther)
	if terr == nil || terr.Code != keel.ToolPermissionDenied || !strings.Contains(terr.Message, hostport(other.URL)) {
		t.Errorf("refused redirect: error %v, want permission_denied naming %s", terr, hostport(other.URL))
	}
	if otherHits.Load() != 0 {
		t.Error("the egress check refused the redirect, but its target was reached")
	}
	if want := []string{srv.URL + "/redirect", other.URL + "/x"}; !slices.Equal(asked, want) {
		t.Errorf("egress check asked %q, want %q", asked, want)
	}
	if want := []string{hostport(srv.URL), hostport(other.URL)}; !slices.Equal(touched.Hosts, want) {
		t.Errorf("redirect: Touched.Hosts = %q, want %q", touched.Hosts, want)
	}

	// A destination the grants refuse is recorded; the check is not asked.
	asked = nil
	touched, _, terr = touchedCall(t, r, "fetch", `{"url":"http://127.0.0.1:1/"}`, allowAll)
	if terr == nil || terr.Code != keel.ToolPermissionDenied || !slices.Equal(touched.Hosts, []string{"127.0.0.1:1"}) || len(asked) != 0 {
		t.Errorf("ungranted fetch: %v, Touched = %+v, check asked %q; want permission_denied, the host, no question", terr, touched, asked)
	}
}

// TestEgressSeesRefusal: the tool sees the egress check's refusal as the
// network error a grant's refusal is, with the reason (the fetch tool
// reports it as its own error, which the call's denial then replaces).
func TestEgressSeesRefusal(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the refused request reached the server: %s", r.URL)
	}))
	defer srv.Close()
	d, err := capabilities.ParseDestination(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	nc := &netCall{tool: "fetch", grants: []string{d.String()}, allowPrivate: true,
		egress: func(context.Context, string) error { return errors.New("labelled data in context") }}
	resp := nc.perform(context.Background(), httpRequest{URL: srv.URL + "/"})
	if resp.Error == nil || resp.Error.Code != "permission_denied" || !strings.Contains(resp.Error.Message, "labelled data in context") {
		t.Errorf("guest's response = %+v, want a permission_denied error with the reason", resp)
	}
	if te := nc.denial(); te == nil || te.Code != keel.ToolPermissionDenied {
		t.Errorf("call denial = %v, want permission_denied", te)
	}
}

// TestTouchedListing: listing a directory records it, the granted root
// included, for a command tool (a fresh instance per call, whose guest
// runtime asks for its directories inside the call) and a reactor; a
// call that touches no file records nothing, although wazero opens the
// root to answer that question.
func TestTouchedListing(t *testing.T) {
	t.Parallel()
	ws := realTempDir(t)
	writeFile(t, filepath.Join(ws, "sub", "a.txt"), "alpha")
	grants := map[string]capabilities.Grants{"hostile": {FS: []capabilities.FSGrant{{HostPath: ws, GuestPath: "/data", ReadOnly: true}}}}
	for _, tt := range []struct{ name, dir string }{{"command", hostileDir}, {"reactor", reactorDir}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := openRegistry(t, Config{Dir: tt.dir, Grants: grants})
			for _, c := range []struct {
				input string
				want  []string
			}{
				{`{"mode":"ok"}`, nil},
				{`{"mode":"ls","path":"/data"}`, []string{ws}},
				{`{"mode":"ls","path":"/data/sub"}`, []string{filepath.Join(ws, "sub")}},
				{`{"mode":"read","path":"/data/sub/a.txt"}`, []string{filepath.Join(ws, "sub", "a.txt")}},
				{`{"mode":"ok"}`, nil},
			} {
				touched, _, terr := touchedCall(t, r, "hostile", c.input, nil)
				if terr != nil || !slices.Equal(touched.Paths, c.want) {
					t.Errorf("hostile %s: Touched = %+v, %v; want paths %q", c.input, touched, terr, c.want)
				}
			}
		})
	}
}

// TestToolkitManifestLabels: a Go tool built with the toolkit whose
// Manifest declares Labels ["pii"], loaded without a sidecar (the host
// reads the manifest from its keel_manifest export): the tool shows the
// label, and its call's Touched carries it.
func TestToolkitManifestLabels(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	build := exec.Command("go", "build", "-trimpath", "-buildmode=c-shared", "-o", filepath.Join(dir, "labelled.wasm"), "./testdata/labelled")
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build testdata/labelled: %v\n%s", err, out)
	}
	r := openRegistry(t, Config{Dir: dir})
	tool, ok := r.Tool("labelled")
	if !ok {
		t.Fatal("labelled did not load")
	}
	if !slices.Equal(tool.Labels, []string{"pii"}) {
		t.Errorf("Tool(labelled).Labels = %q, want [pii]", tool.Labels)
	}
	touched, out, terr := touchedCall(t, r, "labelled", `{}`, nil)
	if terr != nil || !slices.Equal(touched.Labels, []string{"pii"}) {
		t.Errorf("labelled: Touched = %+v, %v (output %s); want labels [pii]", touched, terr, out)
	}
}
