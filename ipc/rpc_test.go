package ipc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

func TestBadInput(t *testing.T) {
	f := ipctest.New()
	f.AddRun("r1", keel.RunRunning)
	ts := startServer(t, f, ipc.Config{})
	c := dial(t, ts)

	tests := []struct {
		name     string
		frame    string
		wantID   string // the id the error response must carry
		wantCode int
		wantMsg  string // a substring of the error message
	}{
		{"malformed JSON", `{"jsonrpc":"2.0","id":1,"method":`, "null", protocol.CodeParseError, "not valid JSON"},
		{"not JSON at all", `hello`, "null", protocol.CodeParseError, "not valid JSON"},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"initialize"}]`, "null", protocol.CodeInvalidRequest, "batch"},
		{"empty batch", `[]`, "null", protocol.CodeInvalidRequest, "batch"},
		{"scalar", `42`, "null", protocol.CodeInvalidRequest, "JSON object"},
		{"missing jsonrpc", `{"id":7,"method":"initialize"}`, "7", protocol.CodeInvalidRequest, "jsonrpc"},
		{"wrong jsonrpc", `{"jsonrpc":"1.0","id":"a","method":"initialize"}`, `"a"`, protocol.CodeInvalidRequest, "jsonrpc"},
		{"missing method", `{"jsonrpc":"2.0","id":8}`, "8", protocol.CodeInvalidRequest, "method"},
		{"method not a string", `{"jsonrpc":"2.0","id":9,"method":3}`, "9", protocol.CodeInvalidRequest, "method"},
		{"id an object", `{"jsonrpc":"2.0","id":{},"method":"initialize"}`, "null", protocol.CodeInvalidRequest, "id"},
		{"params a string", `{"jsonrpc":"2.0","id":10,"method":"run.list","params":"x"}`, "10", protocol.CodeInvalidRequest, "params"},
		{"unknown method", `{"jsonrpc":"2.0","id":11,"method":"run.explode"}`, "11", protocol.CodeMethodNotFound, "run.explode"},
		{"unknown field", `{"jsonrpc":"2.0","id":12,"method":"run.start","params":{"goal":"g","colour":"red"}}`, "12", protocol.CodeInvalidParams, "colour"},
		{"empty goal", `{"jsonrpc":"2.0","id":13,"method":"run.start","params":{"goal":"  "}}`, "13", protocol.CodeInvalidParams, "goal"},
		{"missing goal", `{"jsonrpc":"2.0","id":14,"method":"run.start"}`, "14", protocol.CodeInvalidParams, "goal"},
		{"negative max_steps", `{"jsonrpc":"2.0","id":15,"method":"run.start","params":{"goal":"g","max_steps":-1}}`, "15", protocol.CodeInvalidParams, "max_steps"},
		{"max_steps a string", `{"jsonrpc":"2.0","id":16,"method":"run.start","params":{"goal":"g","max_steps":"3"}}`, "16", protocol.CodeInvalidParams, "max_steps"},
		{"positional params", `{"jsonrpc":"2.0","id":17,"method":"run.start","params":["g"]}`, "17", protocol.CodeInvalidParams, "object"},
		{"empty run_id", `{"jsonrpc":"2.0","id":18,"method":"run.cancel","params":{"run_id":""}}`, "18", protocol.CodeInvalidParams, "run_id"},
		{"run.get without run_id", `{"jsonrpc":"2.0","id":19,"method":"run.get","params":{}}`, "19", protocol.CodeInvalidParams, "run_id"},
		{"negative after_seq", `{"jsonrpc":"2.0","id":20,"method":"run.subscribe","params":{"run_id":"r1","after_seq":-1}}`, "20", protocol.CodeInvalidParams, "after_seq"},
		{"limit too large", `{"jsonrpc":"2.0","id":21,"method":"run.list","params":{"limit":100000}}`, "21", protocol.CodeInvalidParams, "limit"},
		{"tools.call without name", `{"jsonrpc":"2.0","id":22,"method":"tools.call","params":{"input":{}}}`, "22", protocol.CodeInvalidParams, "name"},
		{"tools.call client too long", `{"jsonrpc":"2.0","id":35,"method":"tools.call","params":{"name":"echo","client":"` + strings.Repeat("x", 201) + `"}}`, "35", protocol.CodeInvalidParams, "client"},
		{"unknown field in tools.list", `{"jsonrpc":"2.0","id":23,"method":"tools.list","params":{"all":true}}`, "23", protocol.CodeInvalidParams, "all"},
		{"tools.audit limit too large", `{"jsonrpc":"2.0","id":24,"method":"tools.audit","params":{"limit":5000}}`, "24", protocol.CodeInvalidParams, "limit"},
		{"tools.install relative path", `{"jsonrpc":"2.0","id":26,"method":"tools.install","params":{"path":"x.wasm"}}`, "26", protocol.CodeInvalidParams, "absolute"},
		{"tools.inspect not wasm", `{"jsonrpc":"2.0","id":27,"method":"tools.inspect","params":{"path":"/etc/passwd"}}`, "27", protocol.CodeInvalidParams, ".wasm"},
		{"tools.grant nothing", `{"jsonrpc":"2.0","id":28,"method":"tools.grant","params":{"name":"t","grants":{}}}`, "28", protocol.CodeInvalidParams, "grants"},
		{"tools.revoke both", `{"jsonrpc":"2.0","id":29,"method":"tools.revoke","params":{"name":"t","all":true,"grants":{"env":["X"]}}}`, "29", protocol.CodeInvalidParams, "grants"},
		{"tools.remove no name", `{"jsonrpc":"2.0","id":30,"method":"tools.remove","params":{}}`, "30", protocol.CodeInvalidParams, "name"},
		{"tools.audit tool a number", `{"jsonrpc":"2.0","id":25,"method":"tools.audit","params":{"tool":5}}`, "25", protocol.CodeInvalidParams, "tool"},
		{"models.pull without name", `{"jsonrpc":"2.0","id":31,"method":"models.pull","params":{}}`, "31", protocol.CodeInvalidParams, "name"},
		{"models.pull blank name", `{"jsonrpc":"2.0","id":32,"method":"models.pull","params":{"name":"  "}}`, "32", protocol.CodeInvalidParams, "name"},
		{"models.pull name a number", `{"jsonrpc":"2.0","id":33,"method":"models.pull","params":{"name":7}}`, "33", protocol.CodeInvalidParams, "name"},
		{"unknown field in models.list", `{"jsonrpc":"2.0","id":34,"method":"models.list","params":{"all":true}}`, "34", protocol.CodeInvalidParams, "all"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c.t = t
			c.writeRaw(tt.frame)
			m := c.read()
			if m.Error == nil {
				t.Fatalf("%s: got result %s, want error %d", tt.frame, m.Result, tt.wantCode)
			}
			if string(m.ID) != tt.wantID {
				t.Errorf("%s: response id = %s, want %s", tt.frame, m.ID, tt.wantID)
			}
			if m.Error.Code != tt.wantCode || !strings.Contains(m.Error.Message, tt.wantMsg) {
				t.Errorf("%s: error = %d %q, want %d containing %q", tt.frame, m.Error.Code, m.Error.Message, tt.wantCode, tt.wantMsg)
			}
			if m.Result != nil {
				t.Errorf("%s: response has both error and result %s", tt.frame, m.Result)
			}
		})
	}
	c.t = t

	// The connection survived all of it, and nothing reached the backend.
	c.callOK(protocol.MethodInitialize, nil, nil)
	r1, _ := f.Run("r1")
	started, status := len(f.Started()), r1.Status
	if started != 0 || status != keel.RunRunning {
		t.Errorf("after bad input: %d runs started, r1 %s; want 0 and running", started, status)
	}
}

func TestInvalidParamsNamesField(t *testing.T) {
	ts := startServer(t, ipctest.New(), ipc.Config{})
	c := dial(t, ts)
	m := c.call(protocol.MethodRunStart, map[string]any{"goal": ""})
	if m.Error == nil {
		t.Fatalf("run.start with empty goal succeeded")
	}
	var data struct{ Field string }
	if err := json.Unmarshal(m.Error.Data, &data); err != nil || data.Field != "goal" {
		t.Errorf("error data = %s, want {\"field\":\"goal\"}", m.Error.Data)
	}
}

func TestNotificationsGetNoResponse(t *testing.T) {
	f := ipctest.New()
	ts := startServer(t, f, ipc.Config{})
	c := dial(t, ts)
	c.writeRaw(`{"jsonrpc":"2.0","method":"run.start","params":{"goal":"quiet"}}`)
	c.writeRaw(`{"jsonrpc":"2.0","method":"no.such.method"}`)
	c.writeRaw(`{"jsonrpc":"2.0","method":"run.start","params":{"goal":""}}`)
	// The next frame must be this response: none of the above answered.
	c.callOK(protocol.MethodInitialize, nil, nil)
	// The notification still ran. Handlers run concurrently, so wait.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.WaitUntil(ctx, func() bool { return len(f.Started()) == 1 }); err != nil {
		t.Fatalf("run.start notification: %d runs started, want 1", len(f.Started()))
	}
}

func TestOversizedFrame(t *testing.T) {
	f := ipctest.New()
	f.AddRun("r1", keel.RunRunning)
	ts := startServer(t, f, ipc.Config{})
	c := dial(t, ts)
	c.callOK(protocol.MethodInitialize, nil, nil)

	big := `{"jsonrpc":"2.0","id":99,"method":"run.start","params":{"goal":"` + strings.Repeat("x", protocol.MaxFrameBytes) + `"}}`
	// The write may fail once the server has closed; what matters is
	// what the read sees.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = c.ws.Write(ctx, websocket.MessageText, []byte(big))
	_, err := c.tryRead(10 * time.Second)
	if got := websocket.CloseStatus(err); got != websocket.StatusMessageTooBig {
		t.Fatalf("read after oversized frame: %v (status %d), want close status %d", err, got, websocket.StatusMessageTooBig)
	}

	// The daemon survives and its state is intact.
	c2 := dial(t, ts)
	var run keel.Run
	c2.callOK(protocol.MethodRunCancel, protocol.RunRef{RunID: "r1"}, &run)
	if run.Status != keel.RunCancelled {
		t.Errorf("run.cancel on a new connection: status %s, want cancelled", run.Status)
	}
	started := len(f.Started())
	if started != 0 {
		t.Errorf("the oversized run.start reached the backend: %d runs started", started)
	}
}

// TestFrameAtLimit checks that a frame of exactly MaxFrameBytes is read.
func TestFrameAtLimit(t *testing.T) {
	f := ipctest.New()
	ts := startServer(t, f, ipc.Config{})
	c := dial(t, ts)
	prefix := `{"jsonrpc":"2.0","id":1,"method":"run.start","params":{"goal":"`
	suffix := `"}}`
	frame := prefix + strings.Repeat("x", protocol.MaxFrameBytes-len(prefix)-len(suffix)) + suffix
	c.writeRaw(frame)
	if m := c.read(); m.Error != nil {
		t.Fatalf("frame of exactly %d bytes: error %v, want success", len(frame), m.Error)
	}
}

func TestMethods(t *testing.T) {
	f := ipctest.New()
	f.AddRun("r1", keel.RunRunning)
	f.EmitSeq("r1", 1, 3)
	ts := startServer(t, f, ipc.Config{Version: "1.2.3"})
	c := dial(t, ts)

	var init protocol.InitializeResult
	c.callOK(protocol.MethodInitialize, protocol.InitializeParams{Client: "test/1"}, &init)
	wantInit := protocol.InitializeResult{
		Protocol: protocol.Version, Server: "keel", Version: "1.2.3",
		Methods: []string{
			protocol.MethodConsoleLogin, protocol.MethodEnvDescribe, protocol.MethodInitialize, protocol.MethodModelsList, protocol.MethodModelsPull, protocol.MethodRunCancel,
			protocol.MethodRunGet, protocol.MethodRunList, protocol.MethodRunStart,
			protocol.MethodRunSubscribe, protocol.MethodRunUnsubscribe, protocol.MethodRunsSubscribe, protocol.MethodRunsUnsubscribe,
			protocol.MethodToolsAudit, protocol.MethodToolsCall, protocol.MethodToolsGrant, protocol.MethodToolsInspect, protocol.MethodToolsInstall, protocol.MethodToolsList, protocol.MethodToolsRemove, protocol.MethodToolsRevoke,
		},
		Scopes: keel.Scopes,
	}
	if diff := cmp.Diff(wantInit, init); diff != "" {
		t.Errorf("initialize result (-want +got):\n%s", diff)
	}

	var run keel.Run
	c.callOK(protocol.MethodRunStart, protocol.RunStartParams{Goal: "count files", Model: "m1", MaxSteps: 3}, &run)
	if run.ID != "run-1" || run.Goal != "count files" || run.Status != keel.RunQueued {
		t.Errorf("run.start = %+v, want run-1, queued", run)
	}
	started := f.Started()
	if diff := cmp.Diff([]protocol.RunStartParams{{Goal: "count files", Model: "m1", MaxSteps: 3}}, started); diff != "" {
		t.Errorf("StartRun params (-want +got):\n%s", diff)
	}

	var list protocol.RunListResult
	c.callOK(protocol.MethodRunList, protocol.RunListParams{Limit: 1}, &list)
	if len(list.Runs) != 1 {
		t.Errorf("run.list limit 1: %d runs, want 1", len(list.Runs))
	}

	var detail protocol.RunDetail
	c.callOK(protocol.MethodRunGet, protocol.RunRef{RunID: "r1"}, &detail)
	if detail.Run.ID != "r1" || len(detail.Events) != 3 || len(detail.Spans) != 1 {
		t.Errorf("run.get = run %q, %d events, %d spans; want r1, 3, 1", detail.Run.ID, len(detail.Events), len(detail.Spans))
	}
	var fresh protocol.RunDetail
	m := c.call(protocol.MethodRunGet, protocol.RunRef{RunID: "run-1"})
	if err := json.Unmarshal(m.Result, &fresh); err != nil || !strings.Contains(string(m.Result), `"events":[]`) {
		t.Errorf("run.get of a run without events = %s, want \"events\":[]", m.Result)
	}

	c.callOK(protocol.MethodRunCancel, protocol.RunRef{RunID: "r1"}, &run)
	if run.Status != keel.RunCancelled {
		t.Errorf("run.cancel: status %s, want cancelled", run.Status)
	}

	var tools protocol.ToolsListResult
	c.callOK(protocol.MethodToolsList, nil, &tools)
	if len(tools.Tools) != 1 || tools.Tools[0].Name != "echo" {
		t.Errorf("tools.list = %+v, want [echo]", tools)
	}

	var out protocol.ToolsCallResult
	c.callOK(protocol.MethodToolsCall, protocol.ToolsCallParams{Name: "echo", Input: json.RawMessage(`{"a":1}`)}, &out)
	if string(out.Output) != `{"a":1}` {
		t.Errorf("tools.call echo output = %s, want {\"a\":1}", out.Output)
	}

	var env protocol.EnvDescribeResult
	c.callOK(protocol.MethodEnvDescribe, nil, &env)
	if env.Runtime != "keel" || env.Protocol != protocol.Version {
		t.Errorf("env.describe = %+v, want runtime keel, protocol %s", env, protocol.Version)
	}
}

func TestErrorMapping(t *testing.T) {
	toolErr := &keel.ToolError{Code: keel.ToolTimeout, Message: "took too long"}
	tests := []struct {
		name     string
		method   string // Backend method that fails
		err      error
		wantCode int
		wantData bool
	}{
		{"not found", "GetRun", fmt.Errorf("run x: %w", keel.ErrNotFound), protocol.CodeNotFound, false},
		{"conflict", "CancelRun", fmt.Errorf("run ended: %w", keel.ErrConflict), protocol.CodeConflict, false},
		{"invalid", "StartRun", fmt.Errorf("model name: %w", keel.ErrInvalid), protocol.CodeInvalidParams, false},
		{"unavailable", "ListRuns", fmt.Errorf("shutting down: %w", keel.ErrUnavailable), protocol.CodeUnavailable, false},
		{"model unavailable", "StartRun", fmt.Errorf("ollama: %w", keel.ErrModelUnavailable), protocol.CodeModelUnavailable, false},
		{"tool invalid input", "CallTool", fmt.Errorf("wrapped: %w", &keel.ToolError{Code: keel.ToolInvalidInput, Message: "n must be positive", Path: "/n"}), protocol.CodeInvalidToolInput, true},
		{"tool not found", "CallTool", &keel.ToolError{Code: keel.ToolNotFound, Message: "no tool nope"}, protocol.CodeNotFound, true},
		{"tool failed", "CallTool", toolErr, protocol.CodeToolError, true},
		{"other", "Describe", errors.New("sqlite: disk I/O error at /secret/path"), protocol.CodeInternal, false},
	}
	call := map[string]struct {
		method string
		params any
	}{
		"GetRun":    {protocol.MethodRunGet, protocol.RunRef{RunID: "x"}},
		"CancelRun": {protocol.MethodRunCancel, protocol.RunRef{RunID: "x"}},
		"StartRun":  {protocol.MethodRunStart, protocol.RunStartParams{Goal: "g"}},
		"ListRuns":  {protocol.MethodRunList, nil},
		"CallTool":  {protocol.MethodToolsCall, protocol.ToolsCallParams{Name: "t"}},
		"Describe":  {protocol.MethodEnvDescribe, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := ipctest.New()
			f.Err[tt.method] = tt.err
			ts := startServer(t, f, ipc.Config{})
			c := dial(t, ts)
			rpc := call[tt.method]
			m := c.call(rpc.method, rpc.params)
			if m.Error == nil {
				t.Fatalf("%s: result %s, want error %d", rpc.method, m.Result, tt.wantCode)
			}
			if m.Error.Code != tt.wantCode {
				t.Errorf("%s with backend error %v: code %d, want %d", rpc.method, tt.err, m.Error.Code, tt.wantCode)
			}
			if tt.wantData {
				want, _ := errors.AsType[*keel.ToolError](tt.err)
				var got keel.ToolError
				if err := json.Unmarshal(m.Error.Data, &got); err != nil || got != *want {
					t.Errorf("error data = %s, want %+v", m.Error.Data, *want)
				}
			}
			if tt.wantCode == protocol.CodeInternal && strings.Contains(m.Error.Message, "secret") {
				t.Errorf("internal error leaks detail: %q", m.Error.Message)
			}
		})
	}
}

// TestConcurrentRequests checks that a slow request does not hold up
// the ones behind it.
func TestConcurrentRequests(t *testing.T) {
	f := ipctest.New()
	f.AddRun("r1", keel.RunRunning)
	release := make(chan struct{})
	f.OnCallTool = func(ctx context.Context, _ string, input json.RawMessage) (json.RawMessage, error) {
		select {
		case <-release:
			return input, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	ts := startServer(t, f, ipc.Config{})
	c := dial(t, ts)
	slowID := c.send(protocol.MethodToolsCall, protocol.ToolsCallParams{Name: "slow", Input: json.RawMessage(`{}`)})
	cancelID := c.send(protocol.MethodRunCancel, protocol.RunRef{RunID: "r1"})
	m := c.read()
	if string(m.ID) != cancelID || m.Error != nil {
		t.Fatalf("first response: id %s error %v, want run.cancel's (id %s) to overtake the slow tools.call", m.ID, m.Error, cancelID)
	}
	close(release)
	m = c.read()
	if string(m.ID) != slowID || m.Error != nil {
		t.Errorf("second response: id %s error %v, want tools.call's (id %s)", m.ID, m.Error, slowID)
	}
}

// TestDisconnectCancelsCalls checks that a call in flight is cancelled
// when its client goes away, and that the server still shuts down.
func TestDisconnectCancelsCalls(t *testing.T) {
	f := ipctest.New()
	cancelled := make(chan struct{})
	entered := make(chan struct{})
	f.OnCallTool = func(ctx context.Context, _ string, _ json.RawMessage) (json.RawMessage, error) {
		close(entered)
		<-ctx.Done()
		close(cancelled)
		return nil, ctx.Err()
	}
	ts := startServer(t, f, ipc.Config{})
	c := dial(t, ts)
	c.send(protocol.MethodToolsCall, protocol.ToolsCallParams{Name: "slow"})
	<-entered
	c.ws.Close(websocket.StatusNormalClosure, "")
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("CallTool's ctx was not cancelled when the client disconnected")
	}
}
