package store

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keel-runtime/keel"
)

// TestMigrateAuditDecisions: an audit trail written before migration 013
// (no decisions, labels or hosts) reads back the same after it, and new
// records keep their decision, labels, hosts and refusals.
func TestMigrateAuditDecisions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path, db := migratedTo(t, 12)
	at := time.Unix(1700000000, 0).UTC()
	if _, err := db.ExecContext(ctx, `INSERT INTO tool_audit (time, tool, version, sha256, run_id, step, call_id, args_sha256, grants, outcome, error, duration)
		VALUES (?, 'readfile', '1.0.0', 'abc', 'run_a', 2, 'call_1', 'def', '["fs:/workspace=ro"]', 'ok', '', 1500)`, nanos(at)); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pd := &keel.PolicyDecision{Outcome: "ask", Explanation: "rule 1 of user policy.json:1:12 asks", Version: 3, Digest: "d1"}
	refused := []keel.EgressRefusal{{Tool: "fetch", Destination: "https://example.com/", Decision: keel.PolicyDecision{Outcome: "deny", Explanation: "default egress deny"}}}
	if _, err := s.RecordToolCall(ctx, keel.ToolAudit{Time: at.Add(time.Second), Tool: "fetch", ArgsSHA256: "0f", Outcome: string(keel.ToolPolicyDenied),
		Policy: pd, Labels: []string{"pii", "private"}, Hosts: []string{"example.com:443"}, Refused: refused}); err != nil {
		t.Fatal(err)
	}
	got, err := s.ToolCalls(ctx, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []keel.ToolAudit{
		{ID: 2, Time: at.Add(time.Second), Tool: "fetch", ArgsSHA256: "0f", Outcome: string(keel.ToolPolicyDenied),
			Policy: pd, Labels: []string{"pii", "private"}, Hosts: []string{"example.com:443"}, Refused: refused},
		{ID: 1, Time: at, Tool: "readfile", Version: "1.0.0", SHA256: "abc", RunID: "run_a", Step: 2, CallID: "call_1", ArgsSHA256: "def",
			Grants: []string{"fs:/workspace=ro"}, Outcome: "ok", Duration: 1500},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ToolCalls after the migration (-want +got):\n%s", diff)
	}
}
