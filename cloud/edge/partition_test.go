package edge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud/edge"
	"github.com/keel-runtime/keel/internal/daemontest"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestPartition: an edge's leaf link is cut (a relay between it and the
// cloud closes every connection and refuses new ones) in the middle of a
// run. The cloud forgets the edge (its declaration expires) and its
// mirror stops short; the run goes on and ends on the edge. When the link
// returns, the edge declares itself again and the cloud's copy of the
// run's journal matches the edge's journal event for event.
func TestPartition(t *testing.T) {
	t.Parallel()
	const name = "part-edge"
	first, second := make(chan struct{}), make(chan struct{})
	// A step that waits for gate, then calls a tool the edge does not
	// have (its result is an error, and the run goes on).
	wait := func(gate chan struct{}) scripted.Step {
		return scripted.ReplyFunc(func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
			select {
			case <-gate:
			case <-ctx.Done():
				return models.ChatResponse{}, ctx.Err()
			}
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{Name: "not-installed", Arguments: json.RawMessage(`{}`)}}}}, nil
		})
	}
	provider := scripted.New(nil, wait(first), wait(second),
		scripted.Answer("done while the cloud was away"))
	relay := newProxy(t, strings.TrimPrefix(strings.Split(cluster.LeafURLs(), ",")[0], "nats-leaf://"))
	_, c := joinedUp(t, name, "nats-leaf://"+relay.Addr(), provider)
	run, err := c.StartRun(context.Background(), protocol.RunStartParams{Goal: "work through a partition"})
	if err != nil {
		t.Fatal(err)
	}

	// The first step reaches the cloud.
	close(first)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = edge.Follow(ctx, js, ns, name, run.ID, func(ev keel.Event) bool { return ev.Type != keel.EventToolResult })
	if err != nil {
		t.Fatalf("the first step in the mirror: %v", err)
	}

	// The partition: the cloud forgets the edge; the run ends on the edge.
	relay.Cut()
	waitEdge(t, name, false)
	close(second)
	local := daemontest.Follow(t, c, run.ID)
	if last := local[len(local)-1]; last.Type != keel.EventRunSucceeded {
		t.Fatalf("the run on the edge ended %s, want succeeded", last.Type)
	}
	mirror, err := js.Stream(ctx, edge.MirrorName(ns, name))
	if err != nil {
		t.Fatal(err)
	}
	m, err := mirror.GetLastMsgForSubject(ctx, "keel.outbox."+string(run.ID))
	if err != nil {
		t.Fatal(err)
	}
	var lastSeen keel.Event
	if err := json.Unmarshal(m.Data, &lastSeen); err != nil {
		t.Fatal(err)
	}
	if lastSeen.Seq >= local[len(local)-1].Seq {
		t.Fatalf("the cloud has event %d of %d while the link is cut", lastSeen.Seq, local[len(local)-1].Seq)
	}

	// The link returns: the cloud catches up.
	relay.Restore()
	waitEdge(t, name, true)
	cloudView := mirrored(t, name, run.ID, 0)
	if len(cloudView) != len(local) {
		t.Fatalf("the cloud holds %d events of the run, the edge %d:\ncloud %v\nedge  %v", len(cloudView), len(local), daemontest.Types(cloudView), daemontest.Types(local))
	}
	for i := range local {
		a, b := cloudView[i], local[i]
		if a.RunID != b.RunID || a.Seq != b.Seq || a.Type != b.Type || !a.Time.Equal(b.Time) || !sameJSON(a.Data, b.Data) {
			t.Errorf("event %d: cloud %d %s %s %s, edge %d %s %s %s", i, a.Seq, a.Type, a.Time, a.Data, b.Seq, b.Type, b.Time, b.Data)
		}
	}
}

func sameJSON(a, b json.RawMessage) bool {
	var x, y bytes.Buffer
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	return json.Compact(&x, a) == nil && json.Compact(&y, b) == nil && bytes.Equal(x.Bytes(), y.Bytes())
}
