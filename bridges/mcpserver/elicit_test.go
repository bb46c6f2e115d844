package mcpserver_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestElicitation: a call the policy asks about (stamp, policyFile) is
// put to the user of a client that declared MCP elicitation, with its
// exact arguments, and runs only if they accept; a client that cannot be
// asked is refused with policy_denied; a call the policy denies is never
// asked about. Driven by the official TypeScript SDK client
// (testdata/node/elicit.mjs) over both transports; the audit trail
// records every call with the decision and, for an ask, who answered.
func TestElicitation(t *testing.T) {
	t.Parallel()
	needNode(t)
	command, _ := json.Marshal([]string{os.Args[0], "mcp", "--data-dir", shared.dir})
	for _, transport := range []string{"http", "stdio"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			name := "keel-ts-elicit-" + transport
			out, err := node(t, ctx, []string{"KEEL_MCP_TRANSPORT=" + transport, "KEEL_MCP_URL=" + shared.base + "/mcp",
				"KEEL_MCP_TOKEN=" + shared.token, "KEEL_MCP_COMMAND=" + string(command), "KEEL_MCP_NAME=" + name, cliEnv + "=1"}, "elicit.mjs")
			if err != nil {
				t.Fatalf("elicit.mjs over %s: %v\n%s", transport, err, out)
			}

			recs, err := client.Do(ctx, shared.c, client.ToolsAudit, protocol.ToolsAuditParams{Tool: "stamp", Limit: 1000})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range recs.Records {
				if r.Client != "mcp:"+name && r.Client != "mcp:"+name+"-plain" {
					continue
				}
				line := r.Client + " " + r.Outcome
				if r.Policy != nil {
					line += " " + r.Policy.Outcome + " by " + r.Policy.Approver
				}
				got = append(got, line)
			}
			slices.Sort(got)
			c := "mcp:" + name
			want := []string{
				c + " denied ask by " + c,
				c + " ok ask by " + c,
				c + " policy_denied deny by ",
				c + "-plain policy_denied ask by ",
			}
			if !slices.Equal(got, want) {
				t.Errorf("audit records of stamp (client outcome decision by approver):\n got %q\nwant %q", got, want)
			}
		})
	}
}
