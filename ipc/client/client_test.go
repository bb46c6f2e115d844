package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testToken = "client-test-token"

// serve runs a real ipc.Server on loopback and returns its URL.
func serve(t *testing.T, b any, cfg ipc.Config) string {
	t.Helper()
	cfg.Token = testToken
	s, err := ipc.NewServer(ipctest.Services(b), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	return s.URL(ln)
}

func dial(t *testing.T, url string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, url, testToken)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctx5s(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestTypedHelpers(t *testing.T) {
	f := ipctest.New()
	c := dial(t, serve(t, f, ipc.Config{Version: "9.9"}))
	ctx := ctx5s(t)

	init, err := c.Initialize(ctx, protocol.InitializeParams{Client: "client-test/1"})
	if err != nil || init.Protocol != protocol.Version || init.Version != "9.9" {
		t.Errorf("Initialize = %+v, %v; want protocol %s, version 9.9", init, err, protocol.Version)
	}
	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "g", MaxSteps: 2})
	if err != nil || run.ID != "run-1" || run.MaxSteps != 2 {
		t.Fatalf("StartRun = %+v, %v; want run-1 with max_steps 2", run, err)
	}
	runs, err := c.ListRuns(ctx, 0)
	if err != nil || len(runs) != 1 {
		t.Errorf("ListRuns = %v, %v; want 1 run", runs, err)
	}
	detail, err := c.GetRun(ctx, run.ID)
	if err != nil || detail.Run.ID != run.ID {
		t.Errorf("GetRun = %+v, %v", detail, err)
	}
	run, err = c.CancelRun(ctx, run.ID)
	if err != nil || run.Status != keel.RunCancelled {
		t.Errorf("CancelRun = %+v, %v; want cancelled", run, err)
	}
	tools, err := c.ListTools(ctx)
	if err != nil || len(tools) != 1 || tools[0].Name != "echo" {
		t.Errorf("ListTools = %+v, %v; want [echo]", tools, err)
	}
	out, err := c.CallTool(ctx, "echo", json.RawMessage(`{"x":1}`))
	if err != nil || string(out.Output) != `{"x":1}` {
		t.Errorf("CallTool(echo) = %+v, %v", out, err)
	}
	env, err := c.Describe(ctx)
	if err != nil || env.Runtime != "keel" {
		t.Errorf("Describe = %+v, %v", env, err)
	}
}

func TestRPCErrors(t *testing.T) {
	c := dial(t, serve(t, ipctest.New(), ipc.Config{}))
	ctx := ctx5s(t)

	_, err := c.GetRun(ctx, "nope")
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeNotFound {
		t.Errorf("GetRun(nope) = %v, want a *protocol.Error with code %d", err, protocol.CodeNotFound)
	}
	_, err = c.CallTool(ctx, "broken", nil)
	var te keel.ToolError
	if !errors.As(err, &pe) || pe.Code != protocol.CodeToolError || json.Unmarshal(pe.Data, &te) != nil || te.Code != keel.ToolFailed {
		t.Errorf("CallTool(broken) = %v, want code %d with a tool_error in data", err, protocol.CodeToolError)
	}
	if err := c.Call(ctx, "no.such", nil, nil); !errors.As(err, &pe) || pe.Code != protocol.CodeMethodNotFound {
		t.Errorf("Call(no.such) = %v, want code %d", err, protocol.CodeMethodNotFound)
	}
	// The connection is still usable.
	if _, err := c.Initialize(ctx, protocol.InitializeParams{}); err != nil {
		t.Errorf("Initialize after errors: %v", err)
	}
}

func TestConcurrentCalls(t *testing.T) {
	c := dial(t, serve(t, ipctest.New(), ipc.Config{}))
	ctx := ctx5s(t)
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Go(func() {
			in := json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))
			out, err := c.CallTool(ctx, "echo", in)
			if err == nil && string(out.Output) != string(in) {
				err = fmt.Errorf("CallTool(echo, %s) = %s: answer of another call", in, out.Output)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func TestSubscribeEvents(t *testing.T) {
	f := ipctest.New()
	url := serve(t, f, ipc.Config{})
	c := dial(t, url)
	ctx := ctx5s(t)
	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "g"})
	if err != nil {
		t.Fatal(err)
	}
	for seq := int64(1); seq <= 3; seq++ {
		f.Emit(keel.Event{RunID: run.ID, Seq: seq, Type: keel.EventModelResult})
	}
	if _, err := c.Subscribe(ctx, run.ID, 1); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	f.Emit(keel.Event{RunID: run.ID, Seq: 4, Type: keel.EventRunSucceeded})
	var got []int64
	for len(got) < 3 {
		select {
		case ev := <-c.Events():
			got = append(got, ev.Seq)
		case <-ctx.Done():
			t.Fatalf("events so far %v, want 2 3 4", got)
		}
	}
	if diff := cmp.Diff([]int64{2, 3, 4}, got); diff != "" {
		t.Errorf("event seqs (-want +got):\n%s", diff)
	}
	if err := c.Unsubscribe(ctx, run.ID); err != nil {
		t.Errorf("Unsubscribe: %v", err)
	}
}

func TestCloseEndsEverything(t *testing.T) {
	c := dial(t, serve(t, ipctest.New(), ipc.Config{}))
	if err := c.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if _, ok := <-c.Events(); ok {
		t.Error("Events() not closed after Close")
	}
	if err := c.Call(context.Background(), protocol.MethodInitialize, nil, nil); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Call after Close = %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	// goleak in TestMain checks that the reader goroutine is gone.
}

func TestServerCloseReported(t *testing.T) {
	f := ipctest.New()
	s, err := ipc.NewServer(ipctest.Services(f), ipc.Config{Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, ln) }()
	c := dial(t, s.URL(ln))
	cancel()
	<-done
	select {
	case _, ok := <-c.Events():
		if ok {
			t.Fatal("got an event, want Events closed")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Events not closed after the server stopped")
	}
	if err := c.Err(); !errors.Is(err, client.ErrClosed) || !strings.Contains(err.Error(), "1001") {
		t.Errorf("Err() = %v, want ErrClosed with status 1001", err)
	}
}

func TestDialWrongToken(t *testing.T) {
	url := serve(t, ipctest.New(), ipc.Config{})
	_, err := client.Dial(ctx5s(t), url, "wrong")
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("Dial with a wrong token = %v, want an error mentioning 401", err)
	}
}

func TestDialDataDirNotRunning(t *testing.T) {
	dir := t.TempDir()
	_, err := client.DialDataDir(ctx5s(t), dir)
	want := fmt.Sprintf("keel daemon is not running (no %s); start it with: keel daemon --data-dir %s",
		filepath.Join(dir, protocol.DaemonFile), dir)
	if err == nil || err.Error() != want {
		t.Errorf("DialDataDir(empty dir) = %v,\nwant %q", err, want)
	}
	if !errors.Is(err, client.ErrDaemonNotRunning) {
		t.Errorf("error does not wrap ErrDaemonNotRunning")
	}
}

func TestDialDataDirQuotesDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "my data")
	_, err := client.DialDataDir(ctx5s(t), dir)
	if err == nil || !strings.HasSuffix(err.Error(), "--data-dir '"+dir+"'") {
		t.Errorf("DialDataDir(%q) = %v, want the start command with the dir quoted", dir, err)
	}
}

func TestDialDataDirDeadPID(t *testing.T) {
	// A process that has exited: run one and wait for it.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if err := cmd.Run(); err != nil {
		t.Fatalf("run a short-lived process: %v", err)
	}
	// A server that would answer, so only the pid check can refuse.
	url := serve(t, ipctest.New(), ipc.Config{})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(testToken), 0o600); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	writeDaemonInfo(t, dir, protocol.DaemonInfo{URL: url, PID: pid, TokenFile: "token", Protocol: protocol.Version})
	c, err := client.DialDataDir(ctx5s(t), dir)
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, client.ErrDaemonNotRunning) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", pid)) ||
		!strings.Contains(err.Error(), "keel daemon --data-dir "+dir) {
		t.Errorf("DialDataDir with a dead pid = %v, want ErrDaemonNotRunning naming pid %d, with the start command", err, pid)
	}
}

func TestDialDataDir(t *testing.T) {
	url := serve(t, ipctest.New(), ipc.Config{})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := protocol.DaemonInfo{URL: url, PID: os.Getpid(), Protocol: protocol.Version, TokenFile: "token", DataDir: dir, Version: "t"}
	writeDaemonInfo(t, dir, want)

	got, err := client.ReadDaemonInfo(dir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ReadDaemonInfo (-want +got):\n%s", diff)
	}
	c, err := client.DialDataDir(ctx5s(t), dir)
	if err != nil {
		t.Fatalf("DialDataDir: %v", err)
	}
	defer c.Close()
	if _, err := c.Initialize(ctx5s(t), protocol.InitializeParams{Client: "t"}); err != nil {
		t.Errorf("Initialize: %v", err)
	}
}

func writeDaemonInfo(t *testing.T, dir string, info protocol.DaemonInfo) {
	t.Helper()
	data, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, protocol.DaemonFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestDialDataDirNothingListening(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "ws://" + ln.Addr().String() + protocol.Path
	ln.Close() // a port nobody listens on
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(testToken), 0o600); err != nil {
		t.Fatal(err)
	}
	// Our own pid: alive, but not a daemon (a stale file whose pid was reused).
	writeDaemonInfo(t, dir, protocol.DaemonInfo{URL: url, PID: os.Getpid(), TokenFile: "token", Protocol: protocol.Version})
	_, err = client.DialDataDir(ctx5s(t), dir)
	if !errors.Is(err, client.ErrDaemonNotRunning) || !strings.Contains(err.Error(), "keel daemon --data-dir") {
		t.Errorf("DialDataDir with nothing listening = %v, want ErrDaemonNotRunning with the start command", err)
	}
}
