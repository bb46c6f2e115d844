package ipc_test

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel/internal/tlstest"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestTLSAndAllowedHosts: a server on a TLS listener speaks wss://, and
// takes the Host names of Config.AllowedHosts beside the loopback ones
// ("HOST" with the listener's port or none, "HOST:PORT" exactly); any
// other Host is refused, and without AllowedHosts only loopback names
// pass.
func TestTLSAndAllowedHosts(t *testing.T) {
	t.Parallel()
	srvTLS, roots, err := tlstest.New()
	if err != nil {
		t.Fatal(err)
	}
	start := func(hosts []string) (url string, port int) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ts := startServerOn(t, ipctest.New(), ipc.Config{AllowedHosts: hosts}, tls.NewListener(ln, srvTLS))
		return strings.Replace(ts.url, "ws://", "wss://", 1), ts.port
	}
	url, port := start([]string{"keel.example", "Other.Example:8443"})
	plain, _ := start(nil)
	p := strconv.Itoa(port)
	for _, tc := range []struct {
		url, host string
		want      int
	}{
		{url, "127.0.0.1:" + p, http.StatusSwitchingProtocols},
		{url, "keel.example:" + p, http.StatusSwitchingProtocols},
		{url, "KEEL.example", http.StatusSwitchingProtocols},
		{url, "other.example:8443", http.StatusSwitchingProtocols},
		{url, "other.example:" + p, http.StatusForbidden},
		{url, "keel.example:1", http.StatusForbidden},
		{url, "evil.example:" + p, http.StatusForbidden},
		{plain, "keel.example", http.StatusForbidden},
	} {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ws, resp, err := websocket.Dial(ctx, tc.url, &websocket.DialOptions{
			HTTPClient:   &http.Client{Transport: tr},
			HTTPHeader:   http.Header{"Authorization": {"Bearer " + testToken}},
			Host:         tc.host,
			Subprotocols: []string{protocol.Subprotocol},
		})
		cancel()
		tr.CloseIdleConnections()
		got := 0
		if resp != nil {
			got = resp.StatusCode
		}
		if err == nil {
			if resp.TLS == nil {
				t.Errorf("Host %q: handshake without TLS", tc.host)
			}
			ws.CloseNow()
		}
		if got != tc.want {
			t.Errorf("dial %s with Host %q: HTTP %d (%v), want %d", tc.url, tc.host, got, err, tc.want)
		}
	}
}

// TestAllowedHostsRefusesPatterns: an allowed host is a name, not a
// pattern or a URL.
func TestAllowedHostsRefusesPatterns(t *testing.T) {
	t.Parallel()
	for _, h := range []string{"", "*.example.com", "https://keel.example", "a b"} {
		if _, err := ipc.NewServer(ipc.Services{}, ipc.Config{Token: testToken, AllowedHosts: []string{h}}); err == nil {
			t.Errorf("NewServer with AllowedHosts %q: nil error, want one", h)
		}
	}
}
