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

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bridges/mcpserver"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestRuns: an MCP client starts a run with keel_run_start and reads its
// trace as the resource keel://runs/{id}/trace, as far as the policy
// allows (policyFile: goals "allowed: ...", and traces), driven by the
// official TypeScript SDK client (testdata/node/runs.mjs) over both
// transports; the run is the daemon's, its trace the span tree, and a
// token without the run scope cannot start one.
func TestRuns(t *testing.T) {
	t.Parallel()
	needNode(t)
	command, _ := json.Marshal([]string{os.Args[0], "mcp", "--data-dir", shared.dir})
	for _, transport := range []string{"http", "stdio"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", "runs.mjs")
			cmd.Dir = nodeDir
			cmd.Env = append(os.Environ(), "KEEL_MCP_TRANSPORT="+transport, "KEEL_MCP_URL="+shared.base+"/mcp",
				"KEEL_MCP_TOKEN="+shared.token, "KEEL_MCP_COMMAND="+string(command), cliEnv+"=1")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil || !strings.HasSuffix(strings.TrimSpace(out.String()), "ok") {
				t.Fatalf("runs.mjs over %s: %v\n%s", transport, err, out.String())
			}
			var id keel.RunID
			for sc := bufio.NewScanner(&out); sc.Scan(); {
				if s, ok := strings.CutPrefix(sc.Text(), "run "); ok {
					id = keel.RunID(s)
				}
			}
			if _, err := shared.c.GetRun(ctx, id); err != nil {
				t.Fatalf("the run keel_run_start started, %q: %v", id, err)
			}
			if transport == "http" {
				checkTrace(t, ctx, id)
			}
		})
	}

	// Without the run scope, no run starts (tools/call needs it); the
	// trace needs only read.
	res, err := client.Do(context.Background(), shared.c, client.TokenCreate, protocol.TokenCreateParams{Name: "mcp-runs-read", Scopes: []string{keel.ScopeRead}})
	if err != nil {
		t.Fatal(err)
	}
	cs := connect(t, res.Token, "runs-read-only", nil)
	if _, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: mcpserver.RunStartTool, Arguments: map[string]any{"goal": "allowed: no"}}); !forbidden(err) {
		t.Errorf("keel_run_start with a read-only token = %v, want forbidden", err)
	}
}

// checkTrace waits, event by event, until run id's trace resource holds
// its root span, read over MCP.
func checkTrace(t *testing.T, ctx context.Context, id keel.RunID) {
	t.Helper()
	c, err := client.DialDataDir(ctx, shared.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Subscribe(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	cs := connect(t, shared.token, "keel-test-trace", nil)
	for {
		res, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: mcpserver.TraceURI(id)})
		if err != nil {
			t.Fatalf("read the trace of %s: %v", id, err)
		}
		var trace struct {
			RunID keel.RunID           `json:"run_id"`
			Spans []mcpserver.SpanNode `json:"spans"`
		}
		if err := json.Unmarshal([]byte(res.Contents[0].Text), &trace); err != nil {
			t.Fatalf("trace of %s: %v\n%s", id, err, res.Contents[0].Text)
		}
		if len(trace.Spans) > 0 {
			if root := trace.Spans[0]; trace.RunID != id || root.Kind != keel.SpanRun || root.RunID != id {
				t.Errorf("trace of %s = run %s, root %+v; want the run's root span", id, trace.RunID, root.Span)
			}
			return
		}
		select {
		case <-c.Events():
		case <-ctx.Done():
			t.Fatalf("the trace of %s never showed its root span", id)
		}
	}
}
