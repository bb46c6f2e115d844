package wasmtools

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

// TestNetworkGrants drives the bundled fetch tool against a real HTTP
// server on loopback: only granted destinations are reached, redirects
// are checked too, and loopback is refused unless the host allows it.
func TestNetworkGrants(t *testing.T) {
	t.Parallel()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the ungranted server was reached: %s", r.URL)
	}))
	defer other.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, other.URL+"/x", http.StatusFound)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprint(w, "hello from the granted server")
	}))
	defer srv.Close()
	d, err := capabilities.ParseDestination(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	granted := map[string]capabilities.Grants{"fetch": {Network: []string{d.String()}}}

	open := openRegistry(t, Config{Dir: bundledDir["fetch"], Grants: granted, AllowPrivateNetwork: true})
	out := mustCall(t, open, "fetch", fmt.Sprintf(`{"url":%q}`, srv.URL+"/"))
	if m, _ := out.(map[string]any); m["body"] != "hello from the granted server" || m["status"] != float64(200) {
		t.Errorf("fetch of a granted URL = %v", out)
	}
	te := wantCode(t, open, "fetch", fmt.Sprintf(`{"url":%q}`, other.URL+"/"), keel.ToolPermissionDenied)
	if !strings.Contains(te.Message, "network") || !strings.Contains(te.Message, strings.TrimPrefix(other.URL, "http://")) {
		t.Errorf("denial %q does not name the destination", te.Message)
	}
	te = wantCode(t, open, "fetch", fmt.Sprintf(`{"url":%q}`, srv.URL+"/redirect"), keel.ToolPermissionDenied)
	if !strings.Contains(te.Message, "redirect") {
		t.Errorf("redirect denial %q", te.Message)
	}
	// The registry still works after the denials.
	mustCall(t, open, "fetch", fmt.Sprintf(`{"url":%q}`, srv.URL+"/again"))

	// By default loopback is out of reach even when granted, by IP or by name.
	strict := openRegistry(t, Config{Dir: bundledDir["fetch"], Grants: map[string]capabilities.Grants{"fetch": {Network: []string{d.String(), "http://localhost:" + fmt.Sprint(d.Port)}}}})
	for _, u := range []string{srv.URL + "/", fmt.Sprintf("http://localhost:%d/", d.Port)} {
		te = wantCode(t, strict, "fetch", fmt.Sprintf(`{"url":%q}`, u), keel.ToolPermissionDenied)
		if !strings.Contains(te.Message, "private") {
			t.Errorf("fetch %s with loopback refused: %q does not say why", u, te.Message)
		}
	}

	// Without any network grant the call is refused before the tool runs.
	none := openRegistry(t, Config{Dir: bundledDir["fetch"]})
	te = wantCode(t, none, "fetch", fmt.Sprintf(`{"url":%q}`, srv.URL+"/"), keel.ToolPermissionDenied)
	if !strings.Contains(te.Message, "network") {
		t.Errorf("ungranted fetch: %q does not name the network", te.Message)
	}
}
