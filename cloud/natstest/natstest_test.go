package natstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/keel-runtime/keel/cloud/natstest"
	"github.com/nats-io/nats.go/jetstream"
)

// TestClusterReplicates starts a 3-node cluster and checks an R3 stream
// places a replica on every node.
func TestClusterReplicates(t *testing.T) {
	t0 := time.Now()
	c, err := natstest.Start(natstest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("3 nodes up in %v", time.Since(t0))
	nc, err := c.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.a", []byte("x")); err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := 1 + len(info.Cluster.Replicas); got != 3 {
		t.Errorf("stream on %d nodes, want 3", got)
	}
	t.Logf("ready in %v", time.Since(t0))
}
