package edge_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud/edge"
	"github.com/keel-runtime/keel/cloud/route"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/nats-io/nats.go/jetstream"
)

// echoing answers every run with its goal, declaring the models ms.
func echoing(ms ...string) *scripted.Provider {
	var infos []models.ModelInfo
	for _, m := range ms {
		info := scripted.DefaultModel
		info.Name = m
		infos = append(infos, info)
	}
	return scripted.ByGoal(infos, func(goal string) []scripted.Step { return []scripted.Step{scripted.Answer("echo: " + goal)} })
}

// TestHandoff: two edges and the cloud declare what they have; the cloud
// routes each step by what it needs (a large model: the cloud; a model
// only one edge has: that edge; private inputs: their origin), hands the
// edges' steps off over their leaf links and follows them to their end
// in the edges' mirrors. The public step's result crosses back, the
// private one's does not (its status does). The hand-off stream holds
// the cross-environment events of each step, and a step handed off twice
// runs once.
func TestHandoff(t *testing.T) {
	t.Parallel()
	joined(t, "hand-a", cluster.LeafURLs(), echoing("small-a"))
	joined(t, "hand-b", cluster.LeafURLs(), echoing("vision-b"))
	waitEdge(t, "hand-a", true)
	waitEdge(t, "hand-b", true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg, err := edge.Watch(ctx, js, ns, nil, route.Env{Name: edge.CloudName, Kind: route.KindCloud, Models: []route.Model{{Name: "big-70b", ContextLength: 131072}}})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	has := func(names ...string) func(*route.Table) bool {
		return func(tab *route.Table) bool {
			for _, n := range names {
				if !slices.ContainsFunc(tab.Envs(), func(e route.Env) bool { return e.Name == n }) {
					return false
				}
			}
			return true
		}
	}
	if err := reg.Wait(ctx, has("hand-a", "hand-b")); err != nil {
		t.Fatalf("the registry never held both edges: %v; it holds %+v", err, reg.Table.Envs())
	}

	// The decisions, over the declarations the edges published.
	for _, tc := range []struct {
		need route.Need
		want string
	}{
		{route.Need{Model: "big-70b", Origin: "hand-a"}, edge.CloudName},
		{route.Need{Model: "vision-b", Origin: "hand-a"}, "hand-b"},
		{route.Need{Model: "small-a", Labels: []string{keel.LabelPrivate}, Origin: "hand-a"}, "hand-a"},
	} {
		d, err := reg.Table.Decide(tc.need)
		if err != nil || d.Env != tc.want {
			t.Errorf("Decide(%+v) = %+v, %v; want %s", tc.need, d, err, tc.want)
		}
	}
	if d, err := reg.Table.Decide(route.Need{Model: "vision-b", Labels: []string{keel.LabelPrivate}, Origin: "hand-a"}); !errors.Is(err, route.ErrNoEnvironment) {
		t.Errorf("Decide(private inputs of hand-a, a model of hand-b) = %+v, %v; want ErrNoEnvironment", d, err)
	}

	// The hand-offs.
	// The package's cluster outlives a run of the test (-count): the IDs
	// are this run's own.
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	stepID := func(s string) string { return strings.ReplaceAll(t.Name(), "/", "-") + "-" + s + "-" + run }
	pubNeed := route.Need{Model: "vision-b", Origin: "hand-a"}
	dec, err := reg.Table.Decide(pubNeed)
	if err != nil {
		t.Fatal(err)
	}
	pub := edge.Step{ID: stepID("pub"), Goal: "look at the picture", Model: "vision-b", Need: pubNeed}
	got, err := edge.Handoff(ctx, nc, js, ns, dec, pub)
	if err != nil {
		t.Fatal(err)
	}
	if got.Edge != "hand-b" || got.Status != keel.RunSucceeded || got.Withheld || got.Result != "echo: look at the picture" {
		t.Errorf("public step = %+v, want succeeded on hand-b with its result", got)
	}
	privNeed := route.Need{Model: "small-a", Labels: []string{keel.LabelPrivate}, Origin: "hand-a"}
	if dec, err = reg.Table.Decide(privNeed); err != nil {
		t.Fatal(err)
	}
	priv := edge.Step{ID: stepID("priv"), Goal: "read my diary", Model: "small-a", Need: privNeed}
	pgot, err := edge.Handoff(ctx, nc, js, ns, dec, priv)
	if err != nil {
		t.Fatal(err)
	}
	if pgot.Edge != "hand-a" || pgot.Status != keel.RunSucceeded || !pgot.Withheld || pgot.Result != "" {
		t.Errorf("private step = %+v, want succeeded on hand-a, its result withheld", pgot)
	}

	// The cross-environment events.
	for _, s := range []edge.Step{pub, priv} {
		evs, err := edge.Handoffs(ctx, js, ns, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		var types []string
		for _, ev := range evs {
			types = append(types, ev.Type)
		}
		if want := []string{edge.EventHandedOff, edge.EventAccepted, edge.EventCompletedElsewhere}; !slices.Equal(types, want) {
			t.Errorf("step %s: hand-off events %v, want %v", s.ID, types, want)
			continue
		}
		var done edge.Completion
		json.Unmarshal(evs[2].Data, &done)
		if s.ID == priv.ID && (strings.Contains(string(evs[2].Data), "diary") || !done.Withheld) {
			t.Errorf("private step's completion %s, want it withheld", evs[2].Data)
		}
	}

	// Each edge's runs are in its own mirror only: the outboxes' subjects
	// do not cross the leaf links.
	for _, c := range []struct {
		edge string
		run  keel.RunID
	}{{"hand-a", got.RunID}, {"hand-b", pgot.RunID}} {
		m, err := js.Stream(ctx, edge.MirrorName(ns, c.edge))
		if err != nil {
			t.Fatal(err)
		}
		if msg, err := m.GetLastMsgForSubject(ctx, "keel.outbox."+string(c.run)); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("%s's mirror holds run %s of the other edge: %v %v", c.edge, c.run, msg, err)
		}
	}

	// Again: the same run.
	a, err := edge.Offer(ctx, nc, ns, "hand-b", pub)
	if err != nil || a.RunID != got.RunID {
		t.Errorf("the public step offered again = %+v, %v; want its run %s", a, err, got.RunID)
	}
}
