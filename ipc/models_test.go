package ipc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

func TestModelsList(t *testing.T) {
	ts := startServer(t, ipctest.New(), ipc.Config{})
	c := dial(t, ts)
	var res protocol.ModelsListResult
	c.callOK(protocol.MethodModelsList, nil, &res)
	want := protocol.ModelsListResult{
		Models:    []protocol.ModelInfo{{Name: "tiny", Provider: "fake", Capabilities: []string{"completion"}, ContextLength: 2048}},
		Providers: []protocol.ProviderStatus{{Name: "fake", Reachable: true}},
	}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("models.list (-want +got):\n%s", diff)
	}
}

// readProgress reads the next frame, which must be a
// models.pull.progress notification.
func (c *tclient) readProgress() protocol.ModelsPullProgress {
	c.t.Helper()
	m := c.read()
	if m.Method != protocol.NotifyModelsPullProgress || m.ID != nil {
		c.t.Fatalf("got frame id=%s method=%q error=%v result=%s, want a %s notification", m.ID, m.Method, m.Error, m.Result, protocol.NotifyModelsPullProgress)
	}
	var pr protocol.ModelsPullProgress
	if err := json.Unmarshal(m.Params, &pr); err != nil {
		c.t.Fatalf("decode progress %s: %v", m.Params, err)
	}
	return pr
}

// progressSteps is a scripted pull's progress, as a backend reports it.
var progressSteps = []protocol.ModelsPullProgress{
	{Status: "pulling manifest"},
	{Status: "pulling 8eeb52dfb3bb", Digest: "sha256:8eeb52dfb3bb", Total: 1000, Completed: 10},
	{Status: "pulling 8eeb52dfb3bb", Digest: "sha256:8eeb52dfb3bb", Total: 1000, Completed: 1000},
	{Status: "success"},
}

// TestModelsPullProgress checks that a pull's progress goes, in order and
// carrying the request's id, to the connection that asked for it, before
// the response, and to no other connection.
func TestModelsPullProgress(t *testing.T) {
	f := ipctest.New()
	var (
		mu     sync.Mutex
		pulled []string
	)
	pulls := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(pulled)
	}
	f.OnPullModel = func(_ context.Context, name string, progress func(protocol.ModelsPullProgress)) error {
		mu.Lock()
		pulled = append(pulled, name)
		mu.Unlock()
		for _, p := range progressSteps {
			progress(p)
		}
		return nil
	}
	ts := startServer(t, f, ipc.Config{})
	other := dial(t, ts)
	other.callOK(protocol.MethodInitialize, nil, nil)
	c := dial(t, ts)

	// A string id comes back byte for byte, in every notification.
	c.writeRaw(`{"jsonrpc":"2.0","id":"pull-1","method":"models.pull","params":{"name":"qwen2.5:0.5b"}}`)
	var got []protocol.ModelsPullProgress
	for range progressSteps {
		pr := c.readProgress()
		if string(pr.ID) != `"pull-1"` {
			t.Errorf("progress id = %s, want \"pull-1\"", pr.ID)
		}
		pr.ID = nil
		got = append(got, pr)
	}
	if diff := cmp.Diff(progressSteps, got); diff != "" {
		t.Errorf("progress notifications (-want +got):\n%s", diff)
	}
	m := c.read()
	var res protocol.ModelsPullResult
	if string(m.ID) != `"pull-1"` || m.Error != nil || json.Unmarshal(m.Result, &res) != nil || res.Name != "qwen2.5:0.5b" {
		t.Fatalf("after the progress: frame id=%s error=%v result=%s, want the pull's result", m.ID, m.Error, m.Result)
	}
	if got := pulls(); !slices.Equal(got, []string{"qwen2.5:0.5b"}) {
		t.Errorf("backend pulled %q, want [qwen2.5:0.5b]", got)
	}
	// The other connection got nothing: its next frame is this response.
	other.callOK(protocol.MethodInitialize, nil, nil)

	// Sent as a notification, the pull runs with no progress sent: the
	// next frame is the response to the call after it. Handlers run
	// concurrently, so wait for the pull.
	c.writeRaw(`{"jsonrpc":"2.0","method":"models.pull","params":{"name":"llama3.2"}}`)
	c.callOK(protocol.MethodInitialize, nil, nil)
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.WaitUntil(wctx, func() bool { return len(pulls()) >= 2 }); err != nil {
		t.Fatalf("backend pulled %q, want the notification's llama3.2 too", pulls())
	}
	if _, err := c.tryRead(100 * time.Millisecond); err == nil {
		t.Error("a models.pull sent as a notification got a frame back")
	}
}

func TestModelsPullErrors(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantCode int
	}{
		{"unknown model", fmt.Errorf("no such model in the registry: %w", keel.ErrInvalid), protocol.CodeInvalidParams},
		{"provider down", fmt.Errorf("start Ollama: %w", keel.ErrModelUnavailable), protocol.CodeModelUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := ipctest.New()
			f.Err["PullModel"] = tt.err
			c := dial(t, startServer(t, f, ipc.Config{}))
			m := c.call(protocol.MethodModelsPull, protocol.ModelsPullParams{Name: "x"})
			if m.Error == nil || m.Error.Code != tt.wantCode || m.Error.Message != tt.err.Error() {
				t.Errorf("models.pull failing with %v: error %+v, want code %d with the backend's message", tt.err, m.Error, tt.wantCode)
			}
		})
	}
}

// TestModelsPullSlowClient checks that a client slow to read a pull's
// progress makes the pull wait, without dropping the client or losing a
// report.
func TestModelsPullSlowClient(t *testing.T) {
	const n = 400
	status := fmt.Sprintf("pulling %04000d", 0) // 4 KiB a frame: n of them overflow the socket buffers
	f := ipctest.New()
	f.OnPullModel = func(_ context.Context, _ string, progress func(protocol.ModelsPullProgress)) error {
		for i := range n {
			progress(protocol.ModelsPullProgress{Status: status, Completed: int64(i), Total: n})
		}
		return nil
	}
	ts := startSmallBufServer(t, f, ipc.Config{QueueSize: 4})
	c := dialWith(t, ts, dialOpts{smallReadBuffer: true})
	id := c.send(protocol.MethodModelsPull, protocol.ModelsPullParams{Name: "big"})
	time.Sleep(200 * time.Millisecond) // not reading: the queue fills
	ts.grow()
	c.grow()
	for i := range n {
		if pr := c.readProgress(); pr.Completed != int64(i) || string(pr.ID) != id {
			t.Fatalf("progress %d: id %s completed %d, want id %s completed %d", i, pr.ID, pr.Completed, id, i)
		}
	}
	if m := c.read(); string(m.ID) != id || m.Error != nil {
		t.Errorf("after the progress: frame id=%s error=%v, want the pull's result", m.ID, m.Error)
	}
}

// TestModelsPullCancelled checks that a pull ends when the client that
// asked for it disconnects, and when the server stops.
func TestModelsPullCancelled(t *testing.T) {
	for _, by := range []string{"disconnect", "shutdown"} {
		t.Run(by, func(t *testing.T) {
			f := ipctest.New()
			started, cancelled := make(chan struct{}), make(chan struct{})
			f.OnPullModel = func(ctx context.Context, _ string, progress func(protocol.ModelsPullProgress)) error {
				progress(progressSteps[0])
				close(started)
				<-ctx.Done()
				close(cancelled)
				return ctx.Err()
			}
			ts := startServer(t, f, ipc.Config{})
			c := dial(t, ts)
			c.send(protocol.MethodModelsPull, protocol.ModelsPullParams{Name: "qwen2.5:0.5b"})
			<-started
			c.readProgress()
			if by == "disconnect" {
				c.ws.CloseNow()
			} else {
				go ts.stop()
			}
			select {
			case <-cancelled:
			case <-time.After(5 * time.Second):
				t.Fatalf("the pull's ctx was not cancelled on %s", by)
			}
		})
	}
}

// TestModelsOptional checks that a backend without models serves no
// models methods: initialize does not list them and calls to them fail
// as unknown methods.
func TestModelsOptional(t *testing.T) {
	b := ipctest.Services(ipctest.New())
	b.Models = nil // serves no models
	c := dial(t, startServer(t, b, ipc.Config{}))
	var init protocol.InitializeResult
	c.callOK(protocol.MethodInitialize, nil, &init)
	if slices.Contains(init.Methods, protocol.MethodModelsList) || slices.Contains(init.Methods, protocol.MethodModelsPull) {
		t.Errorf("initialize lists %v, want no models methods", init.Methods)
	}
	for _, method := range []string{protocol.MethodModelsList, protocol.MethodModelsPull} {
		if m := c.call(method, protocol.ModelsPullParams{Name: "x"}); m.Error == nil || m.Error.Code != protocol.CodeMethodNotFound {
			t.Errorf("%s: error %+v, want code %d", method, m.Error, protocol.CodeMethodNotFound)
		}
	}
}
