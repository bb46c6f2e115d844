package edge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud/edge"
	"github.com/keel-runtime/keel/internal/daemontest"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/nats-io/nats.go/jetstream"
)

// echo answers every run with its goal.
func echo() *scripted.Provider {
	return scripted.ByGoal(nil, func(goal string) []scripted.Step { return []scripted.Step{scripted.Answer("echo: " + goal)} })
}

// TestPrivateNeverCrosses: an edge runs a private run whose goal holds a
// canary, and a public one holding a marker. The public run's journal
// reaches the cloud whole (the marker is in the cloud's streams); of the
// private run only stubs cross, its status included, and the canary is
// in no cloud stream and in no file of any cloud node's store, nor in
// the edge's outbox.
func TestPrivateNeverCrosses(t *testing.T) {
	t.Parallel()
	const (
		name   = "canary-edge"
		canary = "CANARY-7f3a9e21"
		marker = "PUBLIC-4c2e55d0"
	)
	d, c := joinedUp(t, name, cluster.LeafURLs(), echo())
	priv := daemontest.RunToEnd(t, c, protocol.RunStartParams{Goal: "remember " + canary, Policy: keel.RunPolicy{Private: true}})
	pub := daemontest.RunToEnd(t, c, protocol.RunStartParams{Goal: "say " + marker})
	if priv.Run.Status != keel.RunSucceeded || !strings.Contains(priv.Run.Result, canary) {
		t.Fatalf("private run = %s %q, want succeeded with the canary in its result (on the edge)", priv.Run.Status, priv.Run.Result)
	}

	evs := mirrored(t, name, pub.Run.ID, 0)
	if last := evs[len(evs)-1]; last.Type != keel.EventRunSucceeded || !strings.Contains(string(last.Data), marker) {
		t.Errorf("public run's last event in the cloud = %s %s, want run.succeeded with its result", last.Type, last.Data)
	}
	pevs := mirrored(t, name, priv.Run.ID, 0)
	for _, ev := range pevs {
		var w edge.Withheld
		if err := json.Unmarshal(ev.Data, &w); err != nil || !w.Withheld {
			t.Errorf("private run's event %d %s crossed: %s", ev.Seq, ev.Type, ev.Data)
		}
	}
	if last := pevs[len(pevs)-1]; last.Type != keel.EventRunSucceeded || !strings.Contains(string(last.Data), `"status":"succeeded"`) {
		t.Errorf("private run's end in the cloud = %s %s, want its status only", last.Type, last.Data)
	}
	if int64(len(pevs)) != priv.Run.LastSeq {
		t.Errorf("the cloud holds %d events of the private run, want a stub for each of its %d", len(pevs), priv.Run.LastSeq)
	}

	// Every message of every stream of the cloud.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seen := map[string]bool{}
	names := js.StreamNames(ctx)
	for sn := range names.Name() {
		st, err := js.Stream(ctx, sn)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := st.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue // deleted, or expired meanwhile
			}
			if err != nil {
				t.Fatalf("stream %s, message %d: %v", sn, seq, err)
			}
			hdr, _ := json.Marshal(m.Header)
			for _, b := range [][]byte{m.Data, hdr, []byte(m.Subject)} {
				if bytes.Contains(b, []byte(canary)) {
					t.Errorf("stream %s holds the canary: %s %s", sn, m.Subject, m.Data)
				}
				if bytes.Contains(b, []byte(marker)) {
					seen[sn] = true
				}
			}
		}
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	if !seen[edge.MirrorName(ns, name)] {
		t.Errorf("the public marker is in streams %v, want the edge's mirror %s among them (the scan reads them)", seen, edge.MirrorName(ns, name))
	}
	// Every file of every cloud node, and of the edge's outbox.
	for _, dir := range []string{storeDir, filepath.Join(d.Dir, "edge")} {
		err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
			if err != nil || de.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return nil // a file removed meanwhile
			}
			if bytes.Contains(b, []byte(canary)) {
				t.Errorf("%s holds the canary", p)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
