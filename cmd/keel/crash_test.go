package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// Shape of the crash harness: runs, tool calls per run, SIGKILLs.
const (
	crashRuns      = 12
	crashWaves     = 3 // runs are started in waves, after kills
	crashToolCalls = 3
	crashKills     = 8
)

// TestCrashHarness starts the real keel binary, runs many runs whose
// model (an OpenAI-compatible server in this test, answering by the
// run's goal) calls a non-idempotent tool that counts its own executions
// in a file, and kills the daemon with SIGKILL at random moments —
// while the model streams, while the tool sleeps, between journal writes
// — restarting it each time. At the end every run must have succeeded,
// every run's journal must be gapless with one model result per step and
// one tool result per call, and no tool call may have run twice. Runs
// left waiting (a kill during the tool call: its outcome is unknown) are
// decided as a human would, by looking at the tool's file.
func TestCrashHarness(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and a wasm tool")
	}
	tmp := t.TempDir()
	bin := buildKeel(t, tmp)
	dir := filepath.Join(tmp, "data")
	work := filepath.Join(tmp, "work")
	for _, d := range []string{filepath.Join(dir, "tools"), work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.Command("go", "build", "-buildmode=c-shared", "-o", filepath.Join(dir, "tools", "tally.wasm"), "./testdata/tally")
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build tally.wasm: %v\n%s", err, out)
	}
	model := newScriptModel(t)
	writeJSON(t, filepath.Join(dir, "models.json"), map[string]any{
		"providers": map[string]any{"fake": map[string]any{
			"base_url": model.URL + "/v1", "local": true, "max_retries": 5, "first_token_timeout": "10s",
			"models": []any{map[string]any{"name": "fake", "context_length": 32768, "capabilities": []string{"completion", "tools"}}},
		}},
		"routes": []any{map[string]any{"name": "default", "targets": []any{map[string]any{"provider": "fake", "model": "fake"}}}},
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadOllama := ln.Addr().String()
	ln.Close()
	env := append(os.Environ(), "OLLAMA_HOST="+deadOllama, "KEEL_DATA_DIR="+dir)

	d := startKeel(t, bin, env, dir)
	ctx := context.Background()
	c := dialWait(t, dir)
	grantCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	for {
		_, err := c.GrantTool(grantCtx, protocol.ToolsGrantParams{Name: "tally",
			Grants: capabilities.Grants{FS: []capabilities.FSGrant{{HostPath: work, GuestPath: "/workspace"}}}})
		if err == nil {
			break
		}
		if grantCtx.Err() != nil {
			t.Fatalf("grant tally: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // still compiling
	}
	cancel()

	var ids []keel.RunID
	startWave := func(c *client.Client, wave int) {
		for i := range crashRuns / crashWaves {
			goal := fmt.Sprintf("job-%d-%d", wave, i)
			r, err := c.StartRun(ctx, protocol.RunStartParams{Goal: goal, Model: "default", MaxSteps: crashToolCalls + 2})
			if err != nil {
				t.Fatalf("start %s: %v", goal, err)
			}
			ids = append(ids, r.ID)
		}
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	startWave(c, 0)
	for kill := range crashKills {
		time.Sleep(time.Duration(100+rng.IntN(700)) * time.Millisecond)
		c.Close()
		d.kill(t)
		d = startKeel(t, bin, env, dir)
		c = dialWait(t, dir)
		if w := kill/2 + 1; kill%2 == 1 && w < crashWaves {
			startWave(c, w)
		}
	}
	defer func() { c.Close(); d.stop(t) }()

	// Let every run end, deciding for those left waiting.
	decided := map[keel.RunID]int{}
	deadline := time.Now().Add(3 * time.Minute)
	for pending := len(ids); pending > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d runs did not end in 3 minutes", pending)
		}
		time.Sleep(100 * time.Millisecond)
		pending = 0
		for _, id := range ids {
			det, err := c.GetRun(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			switch det.Run.Status {
			case keel.RunSucceeded, keel.RunFailed, keel.RunCancelled:
				continue
			case keel.RunWaiting:
				if last := det.Events[len(det.Events)-1]; last.Type == keel.EventHumanDecision {
					// Decided; the run goes on in a moment (or, if the
					// daemon was killed in between, when it restarts).
					pending++
					continue
				}
				call := waitingCall(t, det)
				decision := keel.DecisionRetry
				if tally(t, work)[callKey(t, call)] > 0 {
					decision = keel.DecisionDone // it ran before the kill: the file says so
				}
				if _, err := c.Decide(ctx, protocol.RunDecideParams{RunID: id, CallID: call.ID, Decision: decision}); err != nil {
					t.Fatalf("decide %s: %v", id, err)
				}
				decided[id]++
			}
			pending++
		}
	}

	counts := tally(t, work)
	for _, id := range ids {
		det, err := c.GetRun(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if det.Run.Status != keel.RunSucceeded {
			t.Errorf("%s (%s) ended %s: %s", id, det.Run.Goal, det.Run.Status, det.Run.Error)
		}
		checkCrashJournal(t, det)
		for k := 1; k <= crashToolCalls; k++ {
			key := fmt.Sprintf("%s#%d", det.Run.Goal, k)
			if counts[key] != 1 {
				t.Errorf("%s: tool call %s ran %d times, want exactly once", id, key, counts[key])
			}
		}
	}
	n := 0
	for _, v := range decided {
		n += v
	}
	t.Logf("%d runs, %d kills, %d human decisions, %d model requests", len(ids), crashKills, n, model.requests())
}

// checkCrashJournal checks one run's journal: sequence numbers 1..n
// without gaps or repeats, one model result per step, one tool result per
// call, and exactly one ending, last.
func checkCrashJournal(t *testing.T, det protocol.RunDetail) {
	t.Helper()
	steps := map[int]int{}
	results := map[string]int{}
	ends := 0
	for i, ev := range det.Events {
		if ev.Seq != int64(i+1) {
			t.Errorf("%s: event %d has seq %d", det.Run.ID, i+1, ev.Seq)
		}
		switch ev.Type {
		case keel.EventModelResult:
			var d keel.ModelResultData
			json.Unmarshal(ev.Data, &d)
			steps[d.Step]++
		case keel.EventToolResult:
			var d keel.ToolResultData
			json.Unmarshal(ev.Data, &d)
			results[d.CallID]++
			if d.Error != nil {
				t.Errorf("%s: tool call %s failed: %s", det.Run.ID, d.CallID, d.Error.Message)
			}
		case keel.EventRunSucceeded, keel.EventRunFailed, keel.EventRunCancelled:
			ends++
			if i != len(det.Events)-1 {
				t.Errorf("%s: %s is not the last event", det.Run.ID, ev.Type)
			}
		}
	}
	for step, n := range steps {
		if n != 1 {
			t.Errorf("%s: model step %d journaled %d times", det.Run.ID, step, n)
		}
	}
	for call, n := range results {
		if n != 1 {
			t.Errorf("%s: call %s has %d results", det.Run.ID, call, n)
		}
	}
	if ends != 1 {
		t.Errorf("%s: %d endings", det.Run.ID, ends)
	}
}

func waitingCall(t *testing.T, det protocol.RunDetail) keel.ToolCall {
	t.Helper()
	last := det.Events[len(det.Events)-1]
	var d keel.RunWaitingData
	if last.Type != keel.EventRunWaiting || json.Unmarshal(last.Data, &d) != nil || d.Call == nil {
		t.Fatalf("%s is waiting but its last event is %s %s", det.Run.ID, last.Type, last.Data)
	}
	return *d.Call
}

func callKey(t *testing.T, call keel.ToolCall) string {
	t.Helper()
	var in struct{ Key string }
	if err := json.Unmarshal(call.Arguments, &in); err != nil || in.Key == "" {
		t.Fatalf("call %s arguments %s", call.ID, call.Arguments)
	}
	return in.Key
}

// tally counts each key in the tool's own log of its executions.
func tally(t *testing.T, work string) map[string]int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(work, "tally.log"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		if line != "" {
			counts[line]++
		}
	}
	return counts
}

// scriptModel is an OpenAI-compatible chat server that drives each run by
// its goal: while the conversation has fewer than crashToolCalls tool
// results it streams a call of tally with the key GOAL#k, then an answer.
// It pauses before and while streaming, so kills land mid-stream.
type scriptModel struct {
	*httptest.Server
	mu sync.Mutex
	n  int
}

func newScriptModel(t *testing.T) *scriptModel {
	m := &scriptModel{}
	m.Server = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.Close)
	return m
}

func (m *scriptModel) requests() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

func (m *scriptModel) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	m.mu.Lock()
	m.n++
	m.mu.Unlock()
	var req struct {
		Messages []struct {
			Role    string `json:"role"`
			Content any    `json:"content"`
		} `json:"messages"`
	}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	goal, results := "", 0
	for _, msg := range req.Messages {
		switch msg.Role {
		case "user":
			if s, ok := msg.Content.(string); ok && goal == "" {
				goal = s
			}
		case "tool":
			results++
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	flusher := w.(http.Flusher)
	send := func(delta map[string]any, finish any) {
		chunk := map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "fake",
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
		b, _ := json.Marshal(chunk)
		fmt.Fprintf(w, "data: %s\n\n", b)
		flusher.Flush()
	}
	pause := func() { time.Sleep(time.Duration(rand.IntN(60)) * time.Millisecond) }
	pause()
	if results < crashToolCalls {
		k := results + 1
		args, _ := json.Marshal(map[string]any{"key": fmt.Sprintf("%s#%d", goal, k), "sleep_ms": 50 + rand.IntN(300)})
		send(map[string]any{"role": "assistant", "content": "Recording step."}, nil)
		pause()
		send(map[string]any{"tool_calls": []any{map[string]any{"index": 0, "id": fmt.Sprintf("call_%s_%d", goal, k), "type": "function",
			"function": map[string]any{"name": "tally", "arguments": string(args)}}}}, nil)
		send(map[string]any{}, "tool_calls")
	} else {
		for _, word := range []string{"All ", "steps ", "of ", goal, " recorded."} {
			send(map[string]any{"role": "assistant", "content": word}, nil)
			pause()
		}
		send(map[string]any{}, "stop")
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	flusher.Flush()
}

// keelProc is a running daemon process.
type keelProc struct {
	cmd    *exec.Cmd
	exited chan error
	logs   *strings.Builder
}

func buildKeel(t *testing.T, tmp string) string {
	t.Helper()
	bin := filepath.Join(tmp, "keel")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func startKeel(t *testing.T, bin string, env []string, dir string) *keelProc {
	t.Helper()
	os.Remove(filepath.Join(dir, protocol.DaemonFile)) // a stale file from a kill
	p := &keelProc{cmd: exec.Command(bin, "daemon", "--addr", "127.0.0.1:0"), exited: make(chan error, 1), logs: &strings.Builder{}}
	p.cmd.Env = env
	p.cmd.Stderr = &syncWriter{b: p.logs}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if info, err := client.ReadDaemonInfo(dir); err == nil && info.PID == p.cmd.Process.Pid {
			return p
		}
		select {
		case err := <-p.exited:
			t.Fatalf("daemon exited early: %v\n%s", err, p.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon not ready in 2m\n%s", p.logs.String())
		}
	}
}

func (p *keelProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.exited
}

func (p *keelProc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		t.Errorf("daemon did not stop on SIGTERM")
	}
}

func dialWait(t *testing.T, dir string) *client.Client {
	t.Helper()
	c, err := client.DialDataDir(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// syncWriter lets the daemon's stderr be read while it is written.
type syncWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
