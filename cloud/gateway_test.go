package cloud_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud"
	"github.com/keel-runtime/keel/cloud/gateway"
	"github.com/keel-runtime/keel/internal/tlstest"
	keelclient "github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/wasmtools"
)

// gwOpts are what startGateway gives the tenants beside their token:
// the workers' tools and models, and each tenant's limits (by name).
type gwOpts struct {
	tools  gateway.ToolSpecs
	models gateway.ModelLister
	limits map[string]cloud.Limits
}

// startGateway serves keel/1 for the package's tenants on namespace ns
// over TLS on loopback, known also as host, and returns its wss:// URL
// and the roots that trust its certificate.
func startGateway(t *testing.T, ns, host string, o gwOpts) (string, *x509.CertPool) {
	t.Helper()
	srvTLS, roots, err := tlstest.New()
	if err != nil {
		t.Fatal(err)
	}
	var ts []gateway.Tenant
	for i := range tenants {
		nc := connect(t, nil, &tenants[i])
		t.Cleanup(nc.Close)
		ts = append(ts, gateway.Tenant{Name: tenants[i].Name, Token: tenants[i].Token, Conn: nc,
			Tools: o.tools, Models: o.models, Limits: o.limits[tenants[i].Name]})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var log *slog.Logger
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	g, err := gateway.New(ctx, gateway.Config{Namespace: ns, Tenants: ts, AllowedHosts: []string{host}, Logger: log})
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
// none of acme's, nor acme's run by its ID; each tenant lists the
// workers' tools its limits allow and their models; methods the cloud
// does not serve answer method not found, tools.call unavailable; a wrong token is refused (401), as is
// a Host that is not allowed (403), while an allowed name passes.
func TestGateway(t *testing.T) {
	t.Parallel()
	ns := namespace("gateway")
	acme, globex := &tenants[0], &tenants[1]
	c := &calls{}
	tools := toolsDir(t)
	startWorker(t, ns, "gw-acme-1", tools, c, workerOpts{as: acme})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reg, err := wasmtools.Open(ctx, wasmtools.Config{Dir: tools})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close(context.Background()) })
	url, roots := startGateway(t, ns, "keel.example", gwOpts{tools: reg.RunTools(), models: scripted.New(nil),
		limits: map[string]cloud.Limits{globex.Name: {Tools: []string{"search"}}}})
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
	for _, m := range []string{protocol.MethodRunStart, protocol.MethodRunList, protocol.MethodRunGet, protocol.MethodRunSubscribe,
		protocol.MethodToolsList, protocol.MethodModelsList} {
		if !slices.Contains(init.Methods, m) {
			t.Errorf("initialize lists %v, want %s among them", init.Methods, m)
		}
	}
	if slices.Contains(init.Methods, protocol.MethodToolsInstall) {
		t.Errorf("initialize lists %s, which the cloud does not serve", protocol.MethodToolsInstall)
	}
	var pe *protocol.Error
	if err := a.Call(ctx, protocol.MethodToolsInstall, map[string]string{"path": "/x.wasm"}, nil); !errors.As(err, &pe) || pe.Code != protocol.CodeMethodNotFound {
		t.Errorf("tools.install: %v, want method not found (%d)", err, protocol.CodeMethodNotFound)
	}
	// Each tenant lists the workers' tools within its limits.
	if ts, err := a.ListTools(ctx); err != nil || len(ts) != 1 || ts[0].Name != "bump" {
		t.Errorf("acme's tools.list = %+v, %v; want bump", ts, err)
	}
	if ms, err := a.ListModels(ctx); err != nil || len(ms.Models) != 1 || ms.Models[0].Name != scripted.DefaultModel.Name {
		t.Errorf("acme's models.list = %+v, %v; want the workers' model %s", ms, err, scripted.DefaultModel.Name)
	}
	if _, err := a.CallTool(ctx, "bump", json.RawMessage(`{}`)); !errors.As(err, &pe) || pe.Code != protocol.CodeUnavailable {
		t.Errorf("tools.call: %v, want unavailable (%d)", err, protocol.CodeUnavailable)
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
	if ts, err := b.ListTools(ctx); err != nil || len(ts) != 0 {
		t.Errorf("globex's tools.list = %+v, %v; want none (its limits allow only search)", ts, err)
	}
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

// TestGatewayControl: a tenant's client controls its runs over the
// gateway wherever they run (two workers of acme's, each call of bump
// waiting for a person's approval). A run is approved call by call and
// finishes once, each call run once and each approval journaled once (a
// second approval of a call is refused as already decided); a run held
// in its model call is cancelled and ends cancelled without calling its
// tool; a run is paused at its next step boundary and resumed, and
// finishes. globex's client finds none of acme's runs to approve,
// cancel or pause (not found).
func TestGatewayControl(t *testing.T) {
	t.Parallel()
	ns := namespace("gwctl")
	acme, globex := &tenants[0], &tenants[1]
	c := &calls{}
	tools := toolsDir(t)
	reached := make(chan string, 4) // a goal whose first model call is held
	release := make(chan struct{})  // lets pause-goal's first model call go on
	var once sync.Once
	hold := func(req models.ChatRequest) bool {
		first := !slices.ContainsFunc(req.Messages, func(m models.Message) bool { return m.Role == models.RoleTool })
		switch goal := scripted.Goal(req); {
		case goal == "cancel-goal":
			reached <- goal
			return true // until the run's context ends
		case goal == "pause-goal" && first:
			reached <- goal
			<-release
		}
		return false
	}
	approve := []keel.SideEffect{keel.SideEffectNonIdempotentWrite}
	startWorker(t, ns, "gwc-acme-1", tools, c, workerOpts{as: acme, approve: approve, holdModel: hold})
	startWorker(t, ns, "gwc-acme-2", tools, c, workerOpts{as: acme, approve: approve, holdModel: hold})
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	url, roots := startGateway(t, ns, "keel.example", gwOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dial := func(token string) *keelclient.Client {
		cl, err := keelclient.DialTLS(ctx, url, token, &tls.Config{RootCAs: roots})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	a, b := dial(acme.Token), dial(globex.Token)
	init, err := a.Initialize(ctx, protocol.InitializeParams{Client: "gateway-control-test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{protocol.MethodRunCancel, protocol.MethodRunApprove, protocol.MethodRunDecide, protocol.MethodRunPause, protocol.MethodRunResume} {
		if !slices.Contains(init.Methods, m) {
			t.Errorf("initialize lists %v, want %s among them", init.Methods, m)
		}
	}
	code := func(err error) int {
		var pe *protocol.Error
		if errors.As(err, &pe) {
			return pe.Code
		}
		return 0
	}
	start := func(goal string) keel.Run {
		t.Helper()
		run, err := a.StartRun(ctx, protocol.RunStartParams{Goal: goal})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Subscribe(ctx, run.ID, 0); err != nil {
			t.Fatal(err)
		}
		return run
	}
	// next returns the next event of run id of one of types, keeping
	// every event of every run.
	journal := map[keel.RunID][]keel.Event{}
	next := func(id keel.RunID, types ...keel.EventType) keel.Event {
		t.Helper()
		for {
			select {
			case ev := <-a.Events():
				journal[ev.RunID] = append(journal[ev.RunID], ev)
				if ev.RunID == id && slices.Contains(types, ev.Type) {
					return ev
				}
				if ev.RunID == id && ev.Type == keel.EventRunFailed {
					t.Fatalf("run %s failed: %s", id, ev.Data)
				}
			case <-ctx.Done():
				t.Fatalf("run %s: no %v (events %d)", id, types, len(journal[id]))
			}
		}
	}
	// approveAll approves each call of run id until it succeeds.
	approveAll := func(id keel.RunID) (asked []keel.ApprovalRequestData) {
		t.Helper()
		for {
			ev := next(id, keel.EventApprovalAsked, keel.EventRunSucceeded)
			if ev.Type == keel.EventRunSucceeded {
				return asked
			}
			var d keel.ApprovalRequestData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatal(err)
			}
			if len(asked) == 0 {
				p := protocol.RunApproveParams{RunID: id, CallID: d.Call.ID, ArgsSHA256: d.ArgsSHA256, Approved: true}
				if _, err := b.ApproveRun(ctx, p); code(err) != protocol.CodeNotFound {
					t.Errorf("globex approves acme's run %s: %v, want not found (%d)", id, err, protocol.CodeNotFound)
				}
				if _, err := b.CancelRun(ctx, id); code(err) != protocol.CodeNotFound {
					t.Errorf("globex cancels acme's run %s: %v, want not found (%d)", id, err, protocol.CodeNotFound)
				}
			}
			asked = append(asked, d)
			if _, err := a.ApproveRun(ctx, protocol.RunApproveParams{RunID: id, CallID: d.Call.ID, ArgsSHA256: d.ArgsSHA256, Approved: true}); err != nil {
				t.Fatalf("approve call %s of run %s: %v", d.Call.ID, id, err)
			}
		}
	}
	// ranOnce checks every call of run finished once, approved once, and
	// the run succeeded once.
	ranOnce := func(run keel.Run) {
		t.Helper()
		d, err := a.GetRun(ctx, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		n := map[keel.EventType]int{}
		for i, ev := range d.Events {
			n[ev.Type]++
			if ev.Seq != int64(i+1) {
				t.Errorf("run %s: event %d has seq %d", run.ID, i, ev.Seq)
			}
		}
		if d.Run.Status != keel.RunSucceeded || n[keel.EventRunSucceeded] != 1 || n[keel.EventApproval] != toolSteps || n[keel.EventToolResult] != toolSteps {
			t.Errorf("run %s: %s with %d run.succeeded, %d approvals, %d tool results; want succeeded once, %d of each", run.ID, d.Run.Status,
				n[keel.EventRunSucceeded], n[keel.EventApproval], n[keel.EventToolResult], toolSteps)
		}
		for i := 1; i <= toolSteps; i++ {
			if k := c.get(string(run.ID) + "/" + run.Goal + "-c" + strconv.Itoa(i)); k != 1 {
				t.Errorf("call %d of run %s ran %d times, want 1", i, run.ID, k)
			}
		}
	}

	// Approved call by call, on whichever worker.
	run := start("approve-goal")
	asked := approveAll(run.ID)
	if len(asked) != toolSteps {
		t.Errorf("run %s asked %d approvals, want %d", run.ID, len(asked), toolSteps)
	}
	ranOnce(run)
	p := protocol.RunApproveParams{RunID: run.ID, CallID: asked[0].Call.ID, ArgsSHA256: asked[0].ArgsSHA256, Approved: true}
	if _, err := a.ApproveRun(ctx, p); code(err) != protocol.CodeConflict {
		t.Errorf("a second approval of call %s: %v, want conflict (%d)", p.CallID, err, protocol.CodeConflict)
	}

	// Cancelled while its worker holds it in a model call.
	run = start("cancel-goal")
	<-reached
	if _, err := b.CancelRun(ctx, run.ID); code(err) != protocol.CodeNotFound {
		t.Errorf("globex cancels acme's run %s: %v, want not found (%d)", run.ID, err, protocol.CodeNotFound)
	}
	if _, err := a.CancelRun(ctx, run.ID); err != nil {
		t.Fatalf("cancel run %s: %v", run.ID, err)
	}
	next(run.ID, keel.EventRunCancelled)
	if d, err := a.GetRun(ctx, run.ID); err != nil || d.Run.Status != keel.RunCancelled {
		t.Errorf("run %s after run.cancel: %+v, %v; want cancelled", run.ID, d.Run, err)
	}
	if k := c.get(string(run.ID) + "/cancel-goal-c1"); k != 0 {
		t.Errorf("the cancelled run's call ran %d times, want 0", k)
	}

	// Paused at its next step boundary, then resumed.
	run = start("pause-goal")
	<-reached
	var got keel.Run
	if err := b.Call(ctx, protocol.MethodRunPause, protocol.RunRef{RunID: run.ID}, &got); code(err) != protocol.CodeNotFound {
		t.Errorf("globex pauses acme's run %s: %v, want not found (%d)", run.ID, err, protocol.CodeNotFound)
	}
	if err := a.Call(ctx, protocol.MethodRunPause, protocol.RunRef{RunID: run.ID}, &got); err != nil {
		t.Fatalf("pause run %s: %v", run.ID, err)
	}
	once.Do(func() { close(release) })
	next(run.ID, keel.EventRunPaused)
	if err := a.Call(ctx, protocol.MethodRunResume, protocol.RunRef{RunID: run.ID}, &got); err != nil {
		t.Fatalf("resume run %s: %v", run.ID, err)
	}
	approveAll(run.ID)
	ranOnce(run)
}
