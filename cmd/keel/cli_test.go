package main

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel/cli"
)

// keelCmd runs the built keel with args in env and returns its combined
// output and exit code.
func keelCmd(t *testing.T, bin string, env []string, args ...string) (string, int) {
	t.Helper()
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

// startFollowedRun starts `keel run` of goal in e, which follows the
// run in the terminal, and waits until the model's first words
// ("Thinking") reach its output. It returns the process, its output and
// a channel that receives its exit; the process is killed when the test
// ends if it still runs.
func startFollowedRun(t *testing.T, e crashEnv, goal string) (*exec.Cmd, *syncWriter, <-chan error) {
	t.Helper()
	cmd := exec.Command(e.bin, "run", "--model", "default", goal)
	cmd.Env = e.env
	out := newSyncWriter()
	cmd.Stdout, cmd.Stderr = out, out
	thinking := out.when("Thinking")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	select {
	case <-thinking:
	case err := <-exited:
		t.Fatalf("keel run exited (%v) before the model's first words reached the terminal:\n%s", err, out.String())
	case <-time.After(patience):
		t.Fatalf("the model's first words never reached the terminal:\n%s", out.String())
	}
	return cmd, out, exited
}

// TestCLIExitCodes: each documented exit code (cli/exit.go, docs/cli.md)
// from a real invocation of the built binary against a real daemon, and
// the install messages. Ctrl-C (ExitDetached) is TestRunCtrlC's.
func TestCLIExitCodes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	e := newCrashEnv(t)
	// With the bundled tools (compiled in the shared cache): writefile
	// is refused without a grant.
	if err := os.Remove(filepath.Join(e.dir, "tools", ".examples-installed")); err != nil {
		t.Fatal(err)
	}
	p := startKeel(t, e.bin, e.env, e.dir)
	defer p.stop(t)
	keel := func(args ...string) (string, int) { return keelCmd(t, e.bin, e.env, args...) }

	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"version"}, cli.ExitOK, "commit "},
		{[]string{"tols"}, cli.ExitUsage, "Did you mean this?\n\ttools"},
		{[]string{"tool", "cal", "wordcount", "{}"}, cli.ExitUsage, "Did you mean this?\n\tcall"},
		{[]string{"tools", "list", "--bogus"}, cli.ExitUsage, "unknown flag"},
		{[]string{"tools", "call", "wordcount", "{not json"}, cli.ExitUsage, "not valid JSON"},
		{[]string{"show", "run_nope"}, cli.ExitFailure, "not found"},
		{[]string{"tools", "call", "writefile", `{"path":"x.txt","content":"x"}`}, cli.ExitRefused, "permission_denied"},
		{[]string{"tools", "install", filepath.Join(t.TempDir(), "nope.wasm")}, cli.ExitFailure, "nope.wasm"},
	} {
		out, code := keel(tt.args...)
		if code != tt.code || !strings.Contains(out, tt.want) {
			t.Errorf("keel %s: exit %d, want %d with %q\n%s", strings.Join(tt.args, " "), code, tt.code, tt.want, out)
		}
		if tt.args[0] == "tools" && tt.args[1] == "install" && strings.Contains(out, "done") {
			t.Errorf("keel tools install of a missing file claims something was done:\n%s", out)
		}
	}

	// Reinstalling names the flag that does it.
	again := filepath.Join(t.TempDir(), "tally.wasm")
	if err := copyFile(filepath.Join(e.dir, "tools", "tally.wasm"), again); err != nil {
		t.Fatal(err)
	}
	if out, code := keel("tools", "install", again); code != cli.ExitFailure || !strings.Contains(out, "--replace") || strings.Contains(out, "pass replace") {
		t.Errorf("keel tools install of an installed tool: exit %d, want %d naming --replace\n%s", code, cli.ExitFailure, out)
	}

	// A followed run that is cancelled elsewhere: ExitCancelled.
	_, out, exited := startFollowedRun(t, e, "hang until cancelled elsewhere")
	id := strings.Fields(out.String()[strings.Index(out.String(), "run run_"):])[1]
	if o, code := keel("cancel", id); code != cli.ExitOK {
		t.Fatalf("keel cancel %s: exit %d\n%s", id, code, o)
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != cli.ExitCancelled {
			t.Errorf("keel run of a run cancelled elsewhere: %v, want exit %d\n%s", err, cli.ExitCancelled, out.String())
		}
	case <-time.After(patience):
		t.Fatalf("keel run did not exit within %s of the run's cancellation:\n%s", patience, out.String())
	}
}

// TestDaemonChecksFlagsFirst: a port in use or a bad --allow-origin was
// reported only after the daemon had opened its database and installed
// and compiled its tools; now before any of that.
func TestDaemonChecksFlagsFirst(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	tmp := t.TempDir()
	bin := buildKeel(t, tmp)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"port in use", []string{"--addr", busy.Addr().String()}, "listen on " + busy.Addr().String()},
		{"bad origin", []string{"--addr", "127.0.0.1:0", "--allow-origin", "localhost:5173"}, "--allow-origin"},
	} {
		dir := filepath.Join(tmp, strings.ReplaceAll(tt.name, " ", "-"))
		out, code := keelCmd(t, bin, append(os.Environ(), "KEEL_DATA_DIR="+dir), append([]string{"daemon"}, tt.args...)...)
		if code != cli.ExitFailure || !strings.Contains(out, tt.want) {
			t.Errorf("%s: keel daemon exit %d, want %d saying %q\n%s", tt.name, code, cli.ExitFailure, tt.want, out)
		}
		if _, err := os.Stat(filepath.Join(dir, "keel.db")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: the daemon opened its database before failing (%v)", tt.name, err)
		}
		if tools, _ := filepath.Glob(filepath.Join(dir, "tools", "*.wasm")); len(tools) > 0 {
			t.Errorf("%s: the daemon installed tools before failing: %v", tt.name, tools)
		}
	}
}
