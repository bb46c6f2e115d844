package cloud_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud/gateway"
	"github.com/keel-runtime/keel/internal/tlstest"
	keelclient "github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// startGateway serves keel/1 for the package's tenants on namespace ns
// over TLS on loopback, known also as host, and returns its wss:// URL
// and the roots that trust its certificate.
func startGateway(t *testing.T, ns, host string) (string, *x509.CertPool) {
	t.Helper()
	srvTLS, roots, err := tlstest.New()
	if err != nil {
		t.Fatal(err)
	}
	var ts []gateway.Tenant
	for i := range tenants {
		nc := connect(t, nil, &tenants[i])
		t.Cleanup(nc.Close)
		ts = append(ts, gateway.Tenant{Name: tenants[i].Name, Token: tenants[i].Token, Conn: nc})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := gateway.New(ctx, gateway.Config{Namespace: ns, Tenants: ts, AllowedHosts: []string{host}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(rctx, tls.NewListener(ln, srvTLS)) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("gateway Run = %v, want nil", err)
		}
	})
	return "wss://" + ln.Addr().String() + protocol.Path, roots
}

// handshake opens a WebSocket to url with token and Host host (the
// URL's if empty) and returns the HTTP status of the handshake.
func handshake(t *testing.T, url, token, host string, roots *x509.CertPool) int {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: tr},
		HTTPHeader:   http.Header{"Authorization": {"Bearer " + token}},
		Host:         host,
		Subprotocols: []string{protocol.Subprotocol},
	})
	if err == nil {
		ws.CloseNow()
	}
	if resp == nil {
		t.Fatalf("handshake with Host %q: %v", host, err)
	}
	return resp.StatusCode
}

// TestGateway: clients speak keel/1 to the cloud over WebSocket with
// TLS, each tenant with its token. acme's client starts a run (a worker
// of acme's runs it to its end: three calls of bump, then an answer)
// and follows it to run.succeeded; globex's client lists runs and finds
// none of acme's, nor acme's run by its ID; methods the cloud does not
// serve answer method not found; a wrong token is refused (401), as is
// a Host that is not allowed (403), while an allowed name passes.
func TestGateway(t *testing.T) {
	t.Parallel()
	ns := namespace("gateway")
	acme, globex := &tenants[0], &tenants[1]
	c := &calls{}
	startWorker(t, ns, "gw-acme-1", toolsDir(t), c, workerOpts{as: acme})
	url, roots := startGateway(t, ns, "keel.example")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dial := func(token string) *keelclient.Client {
		cl, err := keelclient.DialTLS(ctx, url, token, &tls.Config{RootCAs: roots})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}

	a := dial(acme.Token)
	init, err := a.Initialize(ctx, protocol.InitializeParams{Client: "gateway-test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{protocol.MethodRunStart, protocol.MethodRunList, protocol.MethodRunGet, protocol.MethodRunSubscribe} {
		if !slices.Contains(init.Methods, m) {
			t.Errorf("initialize lists %v, want %s among them", init.Methods, m)
		}
	}
	if slices.Contains(init.Methods, protocol.MethodToolsList) {
		t.Errorf("initialize lists %s, which the cloud does not serve", protocol.MethodToolsList)
	}
	var pe *protocol.Error
	if _, err := a.ListTools(ctx); !errors.As(err, &pe) || pe.Code != protocol.CodeMethodNotFound {
		t.Errorf("tools.list: %v, want method not found (%d)", err, protocol.CodeMethodNotFound)
	}

	goal := "gateway-goal"
	run, err := a.StartRun(ctx, protocol.RunStartParams{Goal: goal})
	if err != nil {
		t.Fatal(err)
	}
	if run.ID == "" || run.Goal != goal {
		t.Fatalf("run.start = %+v, want a run of goal %q", run, goal)
	}
	if _, err := a.Subscribe(ctx, run.ID, 0); err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for ended := false; !ended; {
		select {
		case ev := <-a.Events():
			if ev.RunID != run.ID {
				continue
			}
			seqs = append(seqs, ev.Seq)
			ended = ev.Type == keel.EventRunSucceeded || ev.Type == keel.EventRunFailed
			if ev.Type == keel.EventRunFailed {
				t.Fatalf("run %s failed: %s", run.ID, ev.Data)
			}
		case <-ctx.Done():
			t.Fatalf("run %s: no run.succeeded within a minute (events %v)", run.ID, seqs)
		}
	}
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("events of run %s arrived as seqs %v, want 1..%d once each, in order", run.ID, seqs, len(seqs))
		}
	}
	for i := 1; i <= toolSteps; i++ {
		if n := c.get(string(run.ID) + "/" + goal + "-c" + strconv.Itoa(i)); n != 1 {
			t.Errorf("call %d of run %s ran %d times, want 1", i, run.ID, n)
		}
	}
	if runs, err := a.ListRuns(ctx, 10); err != nil || len(runs) != 1 || runs[0].ID != run.ID || runs[0].Status != keel.RunSucceeded {
		t.Errorf("acme's run.list = %+v, %v; want its one run, succeeded", runs, err)
	}

	b := dial(globex.Token)
	if runs, err := b.ListRuns(ctx, 10); err != nil || len(runs) != 0 {
		t.Errorf("globex's run.list = %+v, %v; want no runs", runs, err)
	}
	if _, err := b.GetRun(ctx, run.ID); !errors.As(err, &pe) || pe.Code != protocol.CodeNotFound {
		t.Errorf("globex's run.get of acme's run: %v, want not found (%d)", err, protocol.CodeNotFound)
	}

	host := url[len("wss://"):]
	host = host[:len(host)-len(protocol.Path)]
	_, port, _ := net.SplitHostPort(host)
	for _, tc := range []struct {
		token, host string
		want        int
	}{
		{acme.Token, "", http.StatusSwitchingProtocols},
		{acme.Token, "keel.example", http.StatusSwitchingProtocols},
		{acme.Token, "evil.example:" + port, http.StatusForbidden},
		{"wrong-token-0123456789", "", http.StatusUnauthorized},
		{acme.Token + "x", "", http.StatusUnauthorized},
	} {
		if got := handshake(t, url, tc.token, tc.host, roots); got != tc.want {
			t.Errorf("handshake with token %q and Host %q: HTTP %d, want %d", tc.token, tc.host, got, tc.want)
		}
	}
}
