package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
)

// TestReadOnlyAuditSurvivesKill: the audit record of a direct call of a
// read-only tool is committed without an fsync of its own (see
// store.AuditTrail), but before the call returns: every call that
// returned has its record after the daemon is killed with SIGKILL right
// after the last one, and restarted. (A record left to a later commit,
// as a run's call's is, would be lost here.)
func TestReadOnlyAuditSurvivesKill(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the keel binary")
	}
	t.Parallel()
	// wordcount alone (read_only), compiled in the shared cache.
	dir, env := testDataDir(t, t.TempDir(), bundledTool(t, "wordcount"))
	ctx := context.Background()

	d := startKeel(t, shared.bin, env, dir)
	c := dialWait(t, dir)
	waitToolsReady(t, c)
	const calls = 20
	for i := range calls {
		if _, err := c.CallTool(ctx, "wordcount", json.RawMessage(fmt.Sprintf(`{"text":"call %d"}`, i))); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	c.Close()
	d.kill(t)

	d = startKeel(t, shared.bin, env, dir)
	defer d.stop(t)
	c = dialWait(t, dir)
	defer c.Close()
	recs, err := c.ToolAudit(ctx, "wordcount", 2*calls)
	if err != nil {
		t.Fatal(err)
	}
	ok := 0
	for _, r := range recs {
		if r.Outcome == "ok" && r.RunID == "" {
			ok++
		}
	}
	if ok != calls {
		t.Errorf("after the kill, the audit trail holds %d records of direct calls of wordcount that succeeded (of %d records), want %d", ok, len(recs), calls)
	}
}
