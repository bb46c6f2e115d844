package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestBinary builds the real keel binary and runs it as a user would: the
// daemon with no Ollama reachable, CLI commands against it, a foreign
// Origin and Host refused by the real listener, then SIGTERM, which must
// stop it cleanly (exit 0, daemon.json removed).
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	tmp := t.TempDir()
	bin := buildKeel(t, tmp)
	// A closed port: Ollama is "down".
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadOllama := ln.Addr().String()
	ln.Close()

	dir := filepath.Join(tmp, "data")
	env := append(os.Environ(), "OLLAMA_HOST="+deadOllama, "KEEL_DATA_DIR="+dir)
	daemon := exec.Command(bin, "daemon", "--addr", "127.0.0.1:0")
	daemon.Env = env
	var logs strings.Builder
	daemon.Stderr = &logs
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- daemon.Wait() }()
	defer func() {
		daemon.Process.Kill()
	}()
	var info protocol.DaemonInfo
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if info, err = client.ReadDaemonInfo(dir); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("daemon exited early: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no daemon.json after 2m\n%s", logs.String())
		}
	}
	if info.PID != daemon.Process.Pid {
		t.Errorf("daemon.json pid = %d, want %d", info.PID, daemon.Process.Pid)
	}

	keel := func(args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	if out, code := keel("tool", "call", "wordcount", `{"text":"keel works without ollama"}`); code != 0 || !strings.Contains(out, `"words": 4`) {
		t.Errorf("keel tool call: exit %d\n%s", code, out)
	}
	out, code := keel("doctor")
	if code != 1 || !strings.Contains(out, "UNREACHABLE") || !strings.Contains(out, "ollama serve") {
		t.Errorf("keel doctor with Ollama down: exit %d, want 1 with what to do\n%s", code, out)
	}
	out, code = keel("models", "list")
	if code != 1 || !strings.Contains(out, "unreachable") || !strings.Contains(out, "ollama serve") {
		t.Errorf("keel models list with Ollama down: exit %d, want 1 with what to do\n%s", code, out)
	}
	out, code = keel("run", "hello")
	if code != 1 || !strings.Contains(out, "Ollama") {
		t.Errorf("keel run with Ollama down: exit %d, want 1 with an actionable message\n%s", code, out)
	}

	// The real listener refuses a foreign Origin and a rebinding Host, even with the token.
	token, err := os.ReadFile(info.TokenFile)
	if err != nil {
		t.Fatal(err)
	}
	httpURL := "http" + strings.TrimPrefix(info.URL, "ws")
	for _, tt := range []struct{ name, origin, host string }{
		{"foreign origin", "https://evil.example", ""},
		{"rebinding host", "", "evil.example:" + strings.Split(strings.TrimPrefix(httpURL, "http://127.0.0.1:"), "/")[0]},
	} {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, httpURL, nil)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		req.Header.Set("Sec-WebSocket-Protocol", protocol.Subprotocol)
		if tt.origin != "" {
			req.Header.Set("Origin", tt.origin)
		}
		if tt.host != "" {
			req.Host = tt.host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403", tt.name, resp.StatusCode)
		}
	}

	if err := daemon.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("daemon exit after SIGTERM = %v, want 0\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("daemon did not stop within 30s of SIGTERM")
	}
	if _, err := os.Stat(filepath.Join(dir, protocol.DaemonFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("daemon.json left after SIGTERM: %v", err)
	}
	if !strings.Contains(logs.String(), "keel daemon stopped") {
		t.Errorf("daemon log lacks a clean stop:\n%s", logs.String())
	}
}

// TestRunCtrlC: Ctrl-C on `keel run` cancels the run in the daemon. The
// model starts answering and never finishes; SIGINT to the CLI must end
// the run as cancelled, exit with the cancelled code, and close the
// model request (the stream is stopped, not left running).
func TestRunCtrlC(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	e := newCrashEnv(t)
	p := startKeel(t, e.bin, e.env, e.dir)
	defer p.stop(t)

	cmd := exec.Command(e.bin, "run", "--model", "default", "hang until cancelled")
	cmd.Env = e.env
	var out syncWriter
	out.b = &strings.Builder{}
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for deadline := time.Now().Add(time.Minute); !strings.Contains(out.String(), "Thinking"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("the model's first words never reached the terminal:\n%s", out.String())
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-exited:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("keel run did not exit within 30 s of Ctrl-C:\n%s", out.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != cli.ExitCancelled {
		t.Errorf("keel run after Ctrl-C: %v, want exit code %d\n%s", err, cli.ExitCancelled, out.String())
	}
	if s := out.String(); !strings.Contains(s, "cancelling run") || !strings.Contains(s, "run cancelled") {
		t.Errorf("keel run after Ctrl-C printed:\n%s\nwant it to say it cancels, then that the run was cancelled", s)
	}
	c := dialWait(t, e.dir)
	defer c.Close()
	runs, err := c.ListRuns(context.Background(), 10)
	if err != nil || len(runs) != 1 || runs[0].Status != keel.RunCancelled {
		t.Errorf("runs after Ctrl-C = %+v, %v; want one, cancelled", runs, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		e.model.mu.Lock()
		gone := e.model.gone
		e.model.mu.Unlock()
		if gone == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the model request was still open 10 s after the run was cancelled")
		}
	}
}
