package daemon_test

import (
	"context"
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/policy"
)

// auditOf returns the audit record of run's call of tool, from
// tools.audit, failing if there is not exactly one.
func auditOf(t *testing.T, c *client.Client, run keel.RunID, tool string) keel.ToolAudit {
	t.Helper()
	recs, err := c.ToolAudit(context.Background(), tool, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []keel.ToolAudit
	for _, r := range recs {
		if r.RunID == run {
			got = append(got, r)
		}
	}
	if len(got) != 1 {
		t.Fatalf("tools.audit has %d records of run %s's call of %s, want 1: %+v", len(got), run, tool, recs)
	}
	return got[0]
}

// auditCLI returns what keel tools audit prints for tool.
func auditCLI(t *testing.T, dir, tool string) string {
	t.Helper()
	out, errs, code := runCLI(context.Background(), dir, "tools", "audit", "--tool", tool)
	if code != 0 {
		t.Fatalf("keel tools audit = %d: %s%s", code, out, errs)
	}
	return out
}

// TestToolAuditDecisions: every decision is in the tool audit record,
// through the real daemon, SQLite, WebSocket and bundled tools: a call a
// policy rule denies (it never reaches the tools) is recorded
// policy_denied with the rule's explanation; an ask a person approved is
// recorded with the ask, one a person denied (it never runs) as denied,
// with the ask and the person's reason; a read of a labelled grant with its labels; a
// fetch to a loopback server with the host it reached; a direct
// tools.call whose request the policy refused, policy_denied with the
// refusal's decision. tools.audit returns them and keel tools audit
// prints them.
func TestToolAuditDecisions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	model := scripted.DefaultModel.Name

	t.Run("denied by a rule", func(t *testing.T) {
		t.Parallel()
		local := scripted.New(nil, scripted.CallTool("wordcount", `{"text":"a b c"}`), scripted.Answer("done"))
		e := startEgress(t, egressConfig{local: local, tools: []string{"wordcount"},
			user: `{"rules": [{"action": "tool", "tool": "wordcount", "decision": "deny", "reason": "no counting today"}]}`})
		got := runToEnd(t, e.c, protocol.RunStartParams{Goal: "count", Model: model, MaxSteps: 3})
		rec := auditOf(t, e.c, got.Run.ID, "wordcount")
		userFile := policy.UserPath(e.d.dir)
		if rec.Outcome != string(keel.ToolPolicyDenied) || rec.Policy == nil || rec.Policy.Outcome != "deny" ||
			!strings.Contains(rec.Policy.Explanation, "no counting today") || !strings.Contains(rec.Policy.Explanation, userFile) {
			t.Errorf("audit record = %+v, policy %+v; want policy_denied with the rule's explanation (its reason and %s)", rec, rec.Policy, userFile)
		}
		if out := auditCLI(t, e.d.dir, "wordcount"); !strings.Contains(out, "policy_denied") || !strings.Contains(out, "policy  deny: ") || !strings.Contains(out, "no counting today") {
			t.Errorf("keel tools audit:\n%s\nwant the denial and the rule's explanation", out)
		}
	})

	t.Run("ask approved", func(t *testing.T) {
		t.Parallel()
		local := scripted.New(nil, scripted.CallTools(keel.ToolCall{ID: "c1", Name: "wordcount", Arguments: json.RawMessage(`{"text":"a b c"}`)}), scripted.Answer("done"))
		e := startEgress(t, egressConfig{local: local, tools: []string{"wordcount"},
			user: `{"rules": [{"action": "tool", "tool": "wordcount", "decision": "ask", "reason": "counting is costly"}]}`})
		run, err := e.c.StartRun(ctx, protocol.RunStartParams{Goal: "count", Model: model, MaxSteps: 3})
		if err != nil {
			t.Fatal(err)
		}
		waitEvent(t, e.d.dir, run.ID, keel.EventApprovalAsked)
		if s, errs, code := runCLI(ctx, e.d.dir, "approve", string(run.ID), "c1"); code != 0 {
			t.Fatalf("keel approve = %d: %s%s", code, s, errs)
		}
		if evs := follow(t, e.c, run.ID); evs[len(evs)-1].Type != keel.EventRunSucceeded {
			t.Fatalf("approved run ended with %s", evs[len(evs)-1].Type)
		}
		rec := auditOf(t, e.c, run.ID, "wordcount")
		if rec.Outcome != "ok" || rec.Policy == nil || rec.Policy.Outcome != "ask" || !strings.Contains(rec.Policy.Explanation, "counting is costly") {
			t.Errorf("audit record = %+v, policy %+v; want ok with the ask decision", rec, rec.Policy)
		}
		if out := auditCLI(t, e.d.dir, "wordcount"); !strings.Contains(out, "policy  ask: ") {
			t.Errorf("keel tools audit:\n%s\nwant the ask decision", out)
		}
	})

	t.Run("ask denied by a person", func(t *testing.T) {
		t.Parallel()
		local := scripted.New(nil, scripted.CallTools(keel.ToolCall{ID: "c1", Name: "wordcount", Arguments: json.RawMessage(`{"text":"a b c"}`)}), scripted.Answer("done"))
		e := startEgress(t, egressConfig{local: local, tools: []string{"wordcount"},
			user: `{"rules": [{"action": "tool", "tool": "wordcount", "decision": "ask", "reason": "counting is costly"}]}`})
		run, err := e.c.StartRun(ctx, protocol.RunStartParams{Goal: "count", Model: model, MaxSteps: 3})
		if err != nil {
			t.Fatal(err)
		}
		waitEvent(t, e.d.dir, run.ID, keel.EventApprovalAsked)
		if s, errs, code := runCLI(ctx, e.d.dir, "deny", string(run.ID), "c1", "--reason", "not now"); code != 0 {
			t.Fatalf("keel deny = %d: %s%s", code, s, errs)
		}
		follow(t, e.c, run.ID)
		rec := auditOf(t, e.c, run.ID, "wordcount")
		if rec.Outcome != string(keel.ToolDenied) || !strings.Contains(rec.Error, "not now") || rec.Policy == nil || rec.Policy.Outcome != "ask" {
			t.Errorf("audit record = %+v, policy %+v; want denied by the person, with the ask decision", rec, rec.Policy)
		}
	})

	t.Run("labelled read", func(t *testing.T) {
		t.Parallel()
		local := scripted.New(nil, scripted.CallTool("readfile", `{"path":"secret.txt"}`), scripted.Answer("done"))
		e := startEgress(t, egressConfig{local: local, tools: []string{"readfile"}, grantLabel: "pii"})
		got := runToEnd(t, e.c, protocol.RunStartParams{Goal: "read", Model: model, MaxSteps: 3})
		rec := auditOf(t, e.c, got.Run.ID, "readfile")
		if rec.Outcome != "ok" || !slices.Equal(rec.Labels, []string{"pii"}) {
			t.Errorf("audit record = %+v; want ok with labels [pii]", rec)
		}
		if out := auditCLI(t, e.d.dir, "readfile"); !strings.Contains(out, "labels  pii") {
			t.Errorf("keel tools audit:\n%s\nwant the labels", out)
		}
	})

	t.Run("fetch to loopback", func(t *testing.T) {
		t.Parallel()
		tg := newTarget(t)
		in, _ := json.Marshal(map[string]string{"url": tg.srv.URL + "/v1/items"})
		local := scripted.New(nil, scripted.CallTool("fetch", string(in)), scripted.Answer("done"))
		e := startEgress(t, egressConfig{local: local, tools: []string{"fetch"}, fetchNet: []string{tg.grant()}})
		got := runToEnd(t, e.c, protocol.RunStartParams{Goal: "fetch", Model: model, MaxSteps: 3})
		if len(tg.requests()) != 1 {
			t.Fatalf("the target received %v, want one request; events %v", tg.requests(), evTypes(got.Events))
		}
		u, _ := url.Parse(tg.srv.URL)
		rec := auditOf(t, e.c, got.Run.ID, "fetch")
		if rec.Outcome != "ok" || !slices.Equal(rec.Hosts, []string{u.Host}) {
			t.Errorf("audit record = %+v; want ok with hosts [%s]", rec, u.Host)
		}
		if out := auditCLI(t, e.d.dir, "fetch"); !strings.Contains(out, "hosts   "+u.Host) {
			t.Errorf("keel tools audit:\n%s\nwant the host", out)
		}
	})

	t.Run("direct call refused by egress", func(t *testing.T) {
		t.Parallel()
		tg := newTarget(t)
		e := startEgress(t, egressConfig{local: scripted.New(nil), tools: []string{"fetch"}, fetchNet: []string{tg.grant()},
			user: `{"default": {"egress": "deny"}}`})
		waitLoaded(t, e.c)
		in, _ := json.Marshal(map[string]string{"url": tg.srv.URL + "/v1/items"})
		if _, err := client.Do(ctx, e.c, client.ToolsCall, protocol.ToolsCallParams{Name: "fetch", Input: in}); err == nil {
			t.Fatal("tools.call fetch succeeded, want refused by the policy")
		}
		rec := auditOf(t, e.c, "", "fetch")
		u, _ := url.Parse(tg.srv.URL)
		if rec.Outcome != string(keel.ToolPolicyDenied) || len(rec.Refused) != 1 || rec.Refused[0].Decision.Outcome != "deny" ||
			!strings.Contains(rec.Refused[0].Destination, u.Host) || !slices.Equal(rec.Hosts, []string{u.Host}) {
			t.Errorf("audit record = %+v; want policy_denied with the refusal's decision and the host", rec)
		}
		if out := auditCLI(t, e.d.dir, "fetch"); !strings.Contains(out, "refused "+tg.srv.URL) {
			t.Errorf("keel tools audit:\n%s\nwant the refusal", out)
		}
	})
}
