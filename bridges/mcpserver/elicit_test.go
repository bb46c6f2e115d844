package mcpserver_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel/bridges/mcpserver"
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
			// Its own name in each run: the daemon is the package's,
			// and the audit trail keeps the records of earlier runs
			// (go test -count=N).
			name := "keel-ts-elicit-" + transport + "-" + rand.Text()[:8]
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

// TestElicitationWaitsForStream: over HTTP an elicitation goes on the
// session's notification stream (GET), which clients open after
// initialize without waiting for it. A call the policy asks about, made
// before the client's stream is open, waits for it and is asked there,
// instead of being refused because nothing could carry the question.
func TestElicitationWaitsForStream(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hc := httpClient(shared.token)
	url := shared.base + "/mcp"
	var session string
	post := func(body string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		return hc.Do(req)
	}
	resp, err := post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",` +
		`"capabilities":{"elicitation":{"form":{}}},"clientInfo":{"name":"keel-raw-elicit","version":"1"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if session = resp.Header.Get("Mcp-Session-Id"); resp.StatusCode != http.StatusOK || session == "" {
		t.Fatalf("initialize: %s, session %q", resp.Status, session)
	}
	if resp, err = post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	waiting := make(chan struct{})
	var once sync.Once
	defer mcpserver.OnStreamWait(func(id string) {
		if id == session {
			once.Do(func() { close(waiting) })
		}
	})()
	type answer struct {
		body []byte
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"stamp","arguments":{"note":"yes"}}}`)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		answered <- answer{b, err}
	}()
	select {
	case a := <-answered:
		t.Fatalf("tools/call answered before the notification stream opened, without asking: %s %v", a.body, a.err)
	case <-waiting:
	case <-ctx.Done():
		t.Fatal("tools/call neither waited for the notification stream nor answered")
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	req.Header.Set("Mcp-Session-Id", session)
	stream, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	var ask struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Message string `json:"message"`
		} `json:"params"`
	}
	sc := bufio.NewScanner(stream.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			if err := json.Unmarshal([]byte(data), &ask); err != nil {
				t.Fatalf("notification stream: %v: %s", err, data)
			}
			if ask.Method == "elicitation/create" {
				break
			}
		}
	}
	if ask.Method != "elicitation/create" || !strings.Contains(ask.Params.Message, `{"note":"yes"}`) {
		t.Fatalf("notification stream ended (%v) without the question; last message %+v", sc.Err(), ask)
	}
	if resp, err = post(`{"jsonrpc":"2.0","id":` + string(ask.ID) + `,"result":{"action":"accept","content":{}}}`); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	a := <-answered
	var res struct {
		Result struct {
			IsError           bool            `json:"isError"`
			StructuredContent json.RawMessage `json:"structuredContent"`
		} `json:"result"`
	}
	if a.err != nil || json.Unmarshal(a.body, &res) != nil || res.Result.IsError || string(res.Result.StructuredContent) != `{"stamped":true}` {
		t.Errorf("tools/call stamp, accepted = %s %v, want structuredContent {\"stamped\":true}", a.body, a.err)
	}
	if req, err := http.NewRequest(http.MethodDelete, url, nil); err == nil {
		req.Header.Set("Mcp-Session-Id", session)
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
		}
	}
}
