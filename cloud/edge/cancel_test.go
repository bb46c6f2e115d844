package edge_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud/edge"
	"github.com/keel-runtime/keel/cloud/route"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/internal/daemontest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestPlanStepCancelCrosses: a step handed to cancel-b waits there for
// approval of its call of halt (non-idempotent), and cancel-b restarts;
// then the plan is cancelled on cancel-a. cancel-a asks cancel-b to
// cancel the step's run and journals it (step.cancelled_elsewhere); the
// run on cancel-b ends cancelled and halt never ran. Only the step's
// origin may cancel it, as cancel-b keeps it with the run: the same
// request from another name is refused, and asking again answers how the
// run ended.
func TestPlanStepCancelCrosses(t *testing.T) {
	t.Parallel()
	b, cfgB, cb := approvalEdge(t, "cancel-b", "cancel-a", "halt", "halt the line", "halted")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := daemontest.Start(t, daemon.Config{DataDir: daemontest.EmptyDataDir(t), Provider: byPrefix(nil), Join: cluster.LeafURLs(),
		JoinCredentials: credentials(t), EdgeName: "cancel-a", EdgeHeartbeat: 100 * time.Millisecond})
	ca := daemontest.Dial(t, a.Dir)
	waitEdge(t, "cancel-a", true)
	run, err := ca.StartRun(ctx, protocol.RunStartParams{Kind: keel.KindDAG, Goal: "stop", Plan: &keel.Plan{Steps: []keel.PlanStep{
		{ID: "far", Goal: "halt the line", Tools: []string{"halt"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	evs := daemontest.Follow(t, ca, run.ID, keel.EventStepAccepted)
	var acc keel.StepAcceptedData
	json.Unmarshal(evs[len(evs)-1].Data, &acc)
	daemontest.Follow(t, cb, acc.RemoteRun, keel.EventApprovalAsked)

	// A step cancelled by its key before its offer came (the origin had
	// no answer yet): nothing runs it, and the cancel is kept.
	late := edge.Step{ID: string(acc.Run) + "-late", Goal: "halt the line", Tools: []string{"halt"},
		Need: route.Need{Tools: []string{"halt"}, Origin: "cancel-a"}}
	if st, err := edge.RemoteCancel(ctx, nc, ns, "cancel-b", edge.CancelRequest{Key: late.ID, Origin: "cancel-a"}); err != nil || st != keel.RunCancelled {
		t.Fatalf("a cancel of step %s before its offer = %s, %v; want cancelled", late.ID, st, err)
	}
	// Another origin may not cancel cancel-a's step by its key either.
	if _, err := edge.RemoteCancel(ctx, nc, ns, "cancel-b", edge.CancelRequest{Key: string(acc.Run), Origin: "someone-else"}); !errors.Is(err, edge.ErrRefused) {
		t.Fatalf("a cancel of cancel-a's step by key from someone else = %v, want refused", err)
	}

	// cancel-b restarts: what it accepted, and from whom, is in its
	// store. Its new declaration comes after its subscriptions have
	// crossed its link.
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	waitEdge(t, "cancel-b", false)
	b = daemontest.Start(t, cfgB)
	waitEdge(t, "cancel-b", true)
	cb = daemontest.Dial(t, b.Dir)

	// The late offer, after the restart, is refused.
	if a, err := edge.Offer(ctx, nc, ns, "cancel-b", late); !errors.Is(err, edge.ErrRefused) {
		t.Errorf("the offer of step %s after its cancel = %+v, %v; want refused", late.ID, a, err)
	}
	// Another name may not cancel it.
	if _, err := edge.RemoteCancel(ctx, nc, ns, "cancel-b", edge.CancelRequest{Run: acc.RemoteRun, Origin: "someone-else"}); !errors.Is(err, edge.ErrRefused) {
		t.Fatalf("a cancel from someone else = %v, want refused", err)
	}
	if _, err := ca.CancelRun(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	ca2 := daemontest.Dial(t, a.Dir) // ca follows the run already
	daemontest.Follow(t, ca2, run.ID)
	got, err := ca2.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Run.Status != keel.RunCancelled {
		t.Fatalf("parent = %s %q, want cancelled", got.Run.Status, got.Run.Error)
	}
	var c []keel.StepCancelledElsewhereData
	for _, ev := range got.Events {
		if ev.Type == keel.EventStepCancelledElsewhere {
			var d keel.StepCancelledElsewhereData
			json.Unmarshal(ev.Data, &d)
			c = append(c, d)
		}
	}
	if len(c) != 1 || c[0].Env != "cancel-b" || c[0].RemoteRun != acc.RemoteRun || c[0].Error != "" || c[0].Status != keel.RunCancelled {
		t.Fatalf("step.cancelled_elsewhere = %+v, want one, of %s on cancel-b, cancelled; events %v", c, acc.RemoteRun, daemontest.Types(got.Events))
	}

	daemontest.Follow(t, daemontest.Dial(t, b.Dir), acc.RemoteRun)
	there, err := cb.GetRun(ctx, acc.RemoteRun)
	if err != nil {
		t.Fatal(err)
	}
	if there.Run.Status != keel.RunCancelled {
		t.Errorf("the step's run on cancel-b = %s %q, want cancelled", there.Run.Status, there.Run.Error)
	}
	audit, err := cb.ToolAudit(ctx, "halt", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(audit) != 0 {
		t.Errorf("halt ran %d times on cancel-b, want never", len(audit))
	}
	if runs, err := cb.ListRuns(ctx, 10); err != nil || len(runs) != 1 {
		t.Errorf("cancel-b's runs = %d, %v; want the step's only (none for the step cancelled before its offer)", len(runs), err)
	}
	// Asking again is harmless: it answers how the run ended.
	if st, err := edge.RemoteCancel(ctx, nc, ns, "cancel-b", edge.CancelRequest{Run: acc.RemoteRun, Origin: "cancel-a"}); err != nil || st != keel.RunCancelled {
		t.Errorf("a second cancel = %s, %v; want cancelled", st, err)
	}
}
