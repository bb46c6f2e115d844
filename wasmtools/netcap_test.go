package wasmtools

import (
	"fmt"
	"net"
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

// TestPublicIP: the dialer lets a tool reach globally routable unicast
// addresses only.
func TestPublicIP(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		ip   string
		want bool
	}{
		{"93.184.215.14", true},
		{"2606:4700::1111", true},
		{"100.128.0.1", true}, // just past carrier-grade NAT
		{"127.0.0.1", false},
		{"::1", false},
		{"10.1.2.3", false},
		{"192.168.1.1", false},
		{"172.16.0.1", false},
		{"fd00::1", false},
		{"0.0.0.0", false},
		{"::", false},
		{"0.1.2.3", false},
		{"100.64.0.1", false},
		{"100.127.255.255", false},
		{"169.254.169.254", false}, // cloud metadata
		{"fe80::1", false},
		{"224.0.0.1", false},
		{"ff02::1", false},
		{"ff01::1", false},
		{"::ffff:127.0.0.1", false},
	} {
		if got := publicIP(net.ParseIP(tt.ip)); got != tt.want {
			t.Errorf("publicIP(%s) = %v, want %v", tt.ip, got, tt.want)
		}
	}
}
