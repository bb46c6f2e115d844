package cloudcmd_test

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/cloud/edge"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestServeTenantEdges: `keel cloud serve --embedded 1 --tenants F`,
// where F names an edge of tenant acme, makes the edge a user of acme's
// account: the edge joins with its credentials and its declaration is in
// acme's edges bucket, not in the default account's.
func TestServeTenantEdges(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const token, edgePW = "acme-0123456789abcdef", "laptop-0123456789abcdef"
	tenants := filepath.Join(dir, "tenants.json")
	creds := filepath.Join(dir, "laptop.creds")
	for f, body := range map[string]string{
		tenants: `[{"name":"acme","token":"` + token + `","edges":[{"name":"laptop","password":"` + edgePW + `"}]}]`,
		creds:   "laptop:" + edgePW + "\n",
	} {
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pr := runServe(t, ctx, []string{"serve", "--embedded", "1", "--data-dir", filepath.Join(dir, "cloud"), "--workers", "0", "--tenants", tenants})
	var url, leaf string
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		line := sc.Text()
		if _, u, ok := strings.Cut(line, "embedded cluster of 1: "); ok {
			url = u
		}
		if _, u, ok := strings.Cut(line, "edges join at: "); ok {
			leaf = u
		}
		if strings.Contains(line, "workers for each of") {
			break // the tenants' edges buckets are set up
		}
	}
	go io.Copy(io.Discard, pr)
	if url == "" || leaf == "" {
		t.Fatalf("serve printed no cluster URL (%q) or leaf URL (%q)", url, leaf)
	}
	e, err := edge.Join(ctx, edge.Config{URL: leaf, Credentials: creds, Name: "laptop", Dir: filepath.Join(dir, "edge"), Heartbeat: 100 * time.Millisecond},
		edge.Sources{Describe: func(context.Context) (capabilities.Environment, error) { return capabilities.Environment{}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	nc, err := nats.Connect(url, nats.UserInfo("acme", token))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, edge.BucketName("keel"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, "laptop")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for declared := false; !declared; {
		select {
		case en := <-w.Updates():
			declared = en != nil && en.Operation() == jetstream.KeyValuePut
		case <-ctx.Done():
			t.Fatal("the edge laptop did not declare itself in acme's edges bucket within a minute")
		}
	}
	dnc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer dnc.Close()
	djs, _ := jetstream.New(dnc)
	if dkv, err := djs.KeyValue(ctx, edge.BucketName("keel")); err == nil {
		if _, err := dkv.Get(ctx, "laptop"); err == nil {
			t.Errorf("the default account's edges bucket holds acme's edge laptop")
		}
	}
}
