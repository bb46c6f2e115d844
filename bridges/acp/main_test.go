package acp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/internal/daemontest"
	"github.com/keel-runtime/keel/internal/wasmtest"
	"github.com/keel-runtime/keel/models"
)

// cliEnv, set to "1", makes the test binary the keel command line: the
// tests and the TypeScript client start it as `keel acp`.
const cliEnv = "KEEL_ACP_TEST_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(cliEnv) == "1" {
		os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// tallyManifest is the sidecar manifest of the tally tool: read only, so
// a daemon that requires approval for read-only calls asks for each.
const tallyManifest = `{"name":"tally","description":"Count words.","side_effects":"read_only",
"input_schema":{"type":"object","properties":{"text":{"type":"string"}}}}`

// testDaemon is a daemon in this process over a data directory that
// outlives it, so that it can be stopped and started again.
type testDaemon struct {
	dir  string
	stop func()
}

// newDataDir makes a data directory holding the tally tool (a canned
// module: it answers {"words":3} to anything).
func newDataDir(t *testing.T) string {
	t.Helper()
	return daemontest.DataDir(t, map[string][]byte{
		"tally.wasm":          wasmtest.CannedReactor(`{"output":{"words":3}}`),
		"tally.manifest.json": []byte(tallyManifest),
	})
}

// startDaemon runs a daemon on dir with the model p, which asks for
// approval of read-only calls (tally's), until stop or the test's end.
func startDaemon(t *testing.T, dir string, p models.Provider) *testDaemon {
	t.Helper()
	d := daemontest.Start(t, daemon.Config{DataDir: dir, Provider: p, CacheDir: filepath.Join(dir, "cache"),
		RequireApproval: []keel.SideEffect{keel.SideEffectReadOnly}})
	return &testDaemon{dir: dir, stop: func() {
		if err := d.Stop(); err != nil {
			t.Errorf("daemon.Run: %v", err)
		}
	}}
}

// agent is `keel acp` running as a child process.
type agent struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Reader
	stderr *strings.Builder
}

func startAgent(t *testing.T, dir string) *agent {
	t.Helper()
	cmd := exec.Command(os.Args[0], "acp", "--data-dir", dir)
	cmd.Env = append(os.Environ(), cliEnv+"=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
	})
	return &agent{cmd: cmd, stdin: stdin, out: bufio.NewReaderSize(stdout, 1<<20), stderr: &stderr}
}

// send writes one line.
func (a *agent) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(a.stdin, line+"\n"); err != nil {
		t.Fatalf("write to keel acp: %v (stderr %s)", err, a.stderr)
	}
}

// reply is a JSON-RPC message from the agent.
type reply struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// next reads the agent's next message, failing after a minute.
func (a *agent) next(t *testing.T) reply {
	t.Helper()
	type res struct {
		line string
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		l, err := a.out.ReadString('\n')
		ch <- res{l, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("read from keel acp: %v (stderr %s)", r.err, a.stderr)
		}
		var m reply
		if err := json.Unmarshal([]byte(r.line), &m); err != nil {
			t.Fatalf("keel acp wrote %q: %v", r.line, err)
		}
		return m
	case <-time.After(time.Minute):
		t.Fatalf("keel acp said nothing within a minute (stderr %s)", a.stderr)
	}
	panic("unreachable")
}

func (r reply) String() string {
	b, _ := json.Marshal(r)
	return fmt.Sprintf("%s", b)
}
