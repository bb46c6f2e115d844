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
	if !strings.Contains(got, "queued     2\n") || !strings.Contains(got, "leases     0\n") || !strings.Contains(got, "workers    0\n") {
		t.Errorf("status =\n%s\nwant 2 queued (k1 once), 0 leases, 0 workers", got)
	}
}

// TestTenantTokens: with tenants (NATS accounts), `keel cloud submit`
// and `status` speak for the tenant whose token they present: a run one
// tenant submits is in its queue and not in the other's, and a wrong
// token is refused by the server.
func TestTenantTokens(t *testing.T) {
	t.Parallel()
	acme := natstest.Account{Name: "acme", Token: "acme-0123456789abcdef"}
	globex := natstest.Account{Name: "globex", Token: "globex-0123456789abcdef"}
	cl, err := natstest.Start(natstest.Options{Nodes: 1, Accounts: []natstest.Account{acme, globex}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	keel := func(as natstest.Account, args ...string) (string, error) {
		t.Helper()
		cmd := cloudcmd.Command()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"--nats", cl.URL(), "--replicas", "1", "--tenant", as.Name, "--token", as.Token}, args...))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}
	if out, err := keel(acme, "submit", "--key", "k1", "acme's goal"); err != nil {
		t.Fatalf("submit as acme: %v\n%s", err, out)
	}
	for _, c := range []struct {
		as   natstest.Account
		want string
	}{{acme, "queued     1\n"}, {globex, "queued     0\n"}} {
		got, err := keel(c.as, "status")
		if err != nil || !strings.Contains(got, c.want) {
			t.Errorf("status as %s = %v\n%s\nwant %q", c.as.Name, err, got, c.want)
		}
	}
	if _, err := keel(natstest.Account{Name: acme.Name, Token: globex.Token}, "submit", "--key", "k2", "g"); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Errorf("submit as acme with globex's token: %v, want an authorization violation", err)
	}
}
