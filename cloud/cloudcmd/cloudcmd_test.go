package cloudcmd_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel/cloud/cloudcmd"
	"github.com/keel-runtime/keel/cloud/natstest"
)

// TestSubmitStatus: `keel cloud submit` queues a run, which `keel cloud
// status` then counts as queued (no worker runs); a second submit with
// the same key is dropped as a duplicate.
func TestSubmitStatus(t *testing.T) {
	t.Parallel()
	cl, err := natstest.Start(natstest.Options{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	keel := func(args ...string) string {
		t.Helper()
		cmd := cloudcmd.Command()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"--nats", cl.URL(), "--replicas", "1", "--namespace", "t"}, args...))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cmd.ExecuteContext(ctx); err != nil {
			t.Fatalf("keel cloud %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
	for range 2 {
		if got := keel("submit", "--key", "k1", "count the words"); strings.TrimSpace(got) != "k1" {
			t.Errorf("submit printed %q, want the key k1", got)
		}
	}
	keel("submit", "--key", "k2", "another")
	got := keel("status")
	if !strings.Contains(got, "queued     2\n") || !strings.Contains(got, "leases     0\n") {
		t.Errorf("status =\n%s\nwant 2 queued (k1 once), 0 leases", got)
	}
}
