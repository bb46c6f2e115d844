package mcpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel/internal/nodetest"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// nodeDir holds the peers nobody at keel wrote: the official MCP
// conformance suite and TypeScript SDK (package.json, package-lock.json;
// node_modules is installed by npm ci on first use and kept).
const nodeDir = "testdata/node"

// needNode skips t when node is not installed, unless CI is set (then the
// test fails: CI must run it), and installs the packages once.
func needNode(t *testing.T) {
	t.Helper()
	nodetest.Need(t, nodeDir)
}

// node runs a node program in nodeDir with env added and returns its
// output.
func node(t *testing.T, ctx context.Context, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "node", args...)
	cmd.Dir = nodeDir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// TestConformance runs the official MCP conformance suite
// (@modelcontextprotocol/conformance, its active server scenarios)
// against the daemon's /mcp. Scenarios that call the suite's own
// fixture tools, prompts and resources (test_simple_text, ...), which
// keel does not have, are listed in conformance-baseline.yml: the suite
// fails if one of them starts passing, or if any other fails.
//
// The suite drives HTTP servers only (--url); keel mcp (stdio) serves
// the same server through the same SDK, and the TypeScript SDK client
// exercises it (TestTypeScriptClient).
func TestConformance(t *testing.T) {
	t.Parallel()
	needNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	url := shared.base + "/mcp"
	// KEEL_CONFORMANCE_OUT keeps the suite's checks.json files there.
	results := os.Getenv("KEEL_CONFORMANCE_OUT")
	if results == "" {
		results = t.TempDir()
	}
	out, err := node(t, ctx, []string{"KEEL_MCP_URL=" + url, "KEEL_MCP_TOKEN=" + shared.token},
		"--import", "./harness.mjs", "node_modules/@modelcontextprotocol/conformance/dist/index.js",
		"server", "--url", url, "--expected-failures", "conformance-baseline.yml", "-o", results)
	if err != nil {
		t.Errorf("conformance suite: %v\n%s", err, out)
	} else if testing.Verbose() {
		t.Log(out)
	}
}

// TestTypeScriptClient drives keel's MCP server with the official
// TypeScript SDK client (testdata/node/client.mjs) over HTTP and over
// stdio (keel mcp): listing, a call checked against the output schema, a
// schema error, a permission denial, and the notification of a tool
// installed meanwhile.
func TestTypeScriptClient(t *testing.T) {
	needNode(t)
	toolChange.Lock()
	defer toolChange.Unlock()
	command, _ := json.Marshal([]string{os.Args[0], "mcp", "--data-dir", shared.dir})
	for _, transport := range []string{"http", "stdio"} {
		t.Run(transport, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", "client.mjs")
			cmd.Dir = nodeDir
			cmd.Env = append(os.Environ(), "KEEL_MCP_TRANSPORT="+transport, "KEEL_MCP_URL="+shared.base+"/mcp",
				"KEEL_MCP_TOKEN="+shared.token, "KEEL_MCP_COMMAND="+string(command), cliEnv+"=1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var lines []string
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines = append(lines, sc.Text())
				if sc.Text() == "ready for a change" {
					if _, err := client.Do(ctx, shared.c, client.ToolsInstall, protocol.ToolsInstallParams{Path: shared.spare}); err != nil {
						t.Errorf("install writefile: %v", err)
					}
				}
			}
			err = cmd.Wait()
			// Not installed if the script failed before: then this fails.
			client.Do(context.Background(), shared.c, client.ToolsRemove, protocol.ToolRef{Name: "writefile"})
			if err != nil || len(lines) == 0 || lines[len(lines)-1] != "ok" {
				t.Errorf("client.mjs over %s: %v\nstdout:\n%s\nstderr:\n%s", transport, err, strings.Join(lines, "\n"), stderr.String())
			}
		})
	}
}
