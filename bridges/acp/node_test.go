package acp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel/internal/nodetest"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// nodeDir holds the peer nobody at keel wrote: the official ACP
// TypeScript SDK (package.json, package-lock.json; node_modules is
// installed by npm ci on first use and kept).
const nodeDir = "testdata/node"

// needNode skips t when node is not installed, unless CI is set (then the
// test fails: CI must run it), and installs the packages once.
func needNode(t *testing.T) {
	t.Helper()
	nodetest.Need(t, nodeDir)
}

// TestTypeScriptEditor drives keel acp with the official ACP TypeScript
// SDK as the editor (testdata/node/editor.mjs): a session whose run
// calls a tool the policy asks about and the client allows; a second
// prompt cancelled while the model works; then the daemon restarts, and
// session/load brings the session back with its history and goes on.
func TestTypeScriptEditor(t *testing.T) {
	t.Parallel()
	needNode(t)
	dir := newDataDir(t)
	busy := make(chan struct{}, 1)
	first := scripted.ByGoal(nil, func(goal string) []scripted.Step {
		return []scripted.Step{
			scripted.CallTool("tally", `{"text":"a b c"}`),
			scripted.Answer("3 words"),
			// The second prompt: the model works until the run is
			// cancelled.
			scripted.ReplyFunc(func(ctx context.Context, _ models.ChatRequest) (models.ChatResponse, error) {
				busy <- struct{}{}
				<-ctx.Done()
				return models.ChatResponse{}, ctx.Err()
			}),
		}
	})
	d := startDaemon(t, dir, first)
	cwd := t.TempDir()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	command, _ := json.Marshal([]string{os.Args[0], "acp", "--data-dir", dir})
	cmd := exec.CommandContext(ctx, "node", "editor.mjs")
	cmd.Dir = nodeDir
	cmd.Env = append(os.Environ(), "KEEL_ACP_COMMAND="+string(command), "KEEL_ACP_CWD="+cwd, cliEnv+"=1")
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
	// The model's call of the second prompt: tell the editor to cancel.
	go func() {
		select {
		case <-busy:
			io.WriteString(stdin, "model busy\n")
		case <-ctx.Done():
		}
	}()
	var out []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		out = append(out, sc.Text())
		if sc.Text() == "restart" {
			d.stop()
			startDaemon(t, dir, scripted.ByGoal(nil, func(string) []scripted.Step {
				return []scripted.Step{scripted.Answer("after restart")}
			}))
			io.WriteString(stdin, "restarted\n")
		}
	}
	err = cmd.Wait()
	if err != nil || len(out) == 0 || out[len(out)-1] != "ok" {
		t.Errorf("editor.mjs: %v\nstdout:\n%s\nstderr:\n%s", err, strings.Join(out, "\n"), stderr.String())
	}
}
