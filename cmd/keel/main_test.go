package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestBinary runs the real keel binary (TestMain builds it) as a user
// would: the daemon with no Ollama reachable, CLI commands against it, a
// foreign Origin and Host refused by the real listener, then SIGTERM,
// which must stop it cleanly (exit 0, daemon.json removed).
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	dir, env := testDataDir(t, t.TempDir())
	bin := shared.bin
	daemon := startKeel(t, bin, env, dir)
	info, err := client.ReadDaemonInfo(dir)
	if err != nil {
		t.Fatal(err)
	}

	keel := func(args ...string) (string, int) { return keelCmd(t, bin, env, args...) }
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

	if err := daemon.terminate(time.Minute); err != nil {
		t.Errorf("daemon exit after SIGTERM = %v, want 0\n%s", err, daemon.logs.String())
	}
	if _, err := os.Stat(filepath.Join(dir, protocol.DaemonFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("daemon.json left after SIGTERM: %v", err)
	}
	if logs := daemon.logs.String(); !strings.Contains(logs, "keel daemon stopped") {
		t.Errorf("daemon log lacks a clean stop:\n%s", logs)
	}
}

// TestRunCtrlC: Ctrl-C on `keel run` detaches: the model starts
// answering and never finishes; SIGINT to the CLI must leave the run
// going, exit with the detached code saying how to attach again and how
// to cancel; `keel cancel` then ends the run and closes the model request
// (the stream is stopped, not left running).
func TestRunCtrlC(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	e := newCrashEnv(t)
	p := startKeel(t, e.bin, e.env, e.dir)
	defer p.stop(t)

	cmd, out, exited := startFollowedRun(t, e, "hang until cancelled")
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-exited:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatalf("keel run did not exit within a minute of Ctrl-C:\n%s", out.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != cli.ExitDetached {
		t.Errorf("keel run after Ctrl-C: %v, want exit code %d\n%s", err, cli.ExitDetached, out.String())
	}
	c := dialWait(t, e.dir)
	defer c.Close()
	runs, err := c.ListRuns(context.Background(), 10)
	if err != nil || len(runs) != 1 || runs[0].Status.Terminal() {
		t.Fatalf("runs after Ctrl-C = %+v, %v; want one, still going", runs, err)
	}
	id := string(runs[0].ID)
	if s := out.String(); !strings.Contains(s, "detached from run "+id) || !strings.Contains(s, "keel attach "+id) || !strings.Contains(s, "keel cancel "+id) {
		t.Errorf("keel run after Ctrl-C printed:\n%s\nwant it to say it detached, how to attach again and how to cancel", s)
	}
	cancel := exec.Command(e.bin, "cancel", id)
	cancel.Env = e.env
	if o, err := cancel.CombinedOutput(); err != nil {
		t.Fatalf("keel cancel: %v\n%s", err, o)
	}
	// keel attach follows it to its end: cancelled.
	attach := exec.Command(e.bin, "attach", id)
	attach.Env = e.env
	o, err := attach.CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != cli.ExitCancelled || !strings.Contains(string(o), "run cancelled") {
		t.Errorf("keel attach of the cancelled run: %v, want exit %d\n%s", err, cli.ExitCancelled, o)
	}
	select {
	case <-e.model.hangGone:
	case <-time.After(time.Minute):
		t.Fatal("the model request was still open a minute after the run was cancelled")
	}
}
