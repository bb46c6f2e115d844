package edge_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel/cloud/cloudcmd"
	"github.com/keel-runtime/keel/cloud/route"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestJoinDeclares: a daemon started with --join runs a leaf node of the
// cloud and publishes its declaration there (its models, as env.describe
// says); keel cloud status lists it with them; once the daemon stops, its
// declaration is gone.
func TestJoinDeclares(t *testing.T) {
	t.Parallel()
	d := joined(t, "join-a", cluster.LeafURLs(), scripted.New(nil))
	got := waitEdge(t, "join-a", true)
	if got.Name != "join-a" || got.Kind != route.KindEdge || !slices.ContainsFunc(got.Models, func(m route.Model) bool { return m.Name == scripted.DefaultModel.Name }) {
		t.Errorf("declaration = %+v, want edge join-a with the model %s", got, scripted.DefaultModel.Name)
	}
	if got.At.IsZero() {
		t.Errorf("declaration = %+v, want the time of its heartbeat", got)
	}

	cmd := cloudcmd.Command()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--nats", cluster.URL(), "status"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("keel cloud status: %v\n%s", err, out.String())
	}
	if s := out.String(); !strings.Contains(s, "edge join-a") || !strings.Contains(s, "models: "+scripted.DefaultModel.Name) {
		t.Errorf("keel cloud status =\n%s\nwant edge join-a with its model", s)
	}

	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	waitEdge(t, "join-a", false)
}
