package ipc_test

import (
	"slices"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/ipctest"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestRunListStatusAndPages: run.list keeps the runs in the states asked
// for and pages through them with next_cursor; an unknown state is
// invalid params.
func TestRunListStatusAndPages(t *testing.T) {
	f := ipctest.New()
	for id, st := range map[keel.RunID]keel.RunStatus{"r1": keel.RunWaiting, "r2": keel.RunSucceeded, "r3": keel.RunWaiting, "r4": keel.RunPaused, "r5": keel.RunWaiting} {
		f.AddRun(id, st)
	}
	ts := startServer(t, f, ipc.Config{})
	c := dial(t, ts)

	var got []keel.RunID
	p := protocol.RunListParams{Limit: 2, Status: []keel.RunStatus{keel.RunWaiting, keel.RunPaused}}
	for pages := 0; ; pages++ {
		if pages > 3 {
			t.Fatalf("run.list did not stop paging; got %v", got)
		}
		var res protocol.RunListResult
		c.callOK(protocol.MethodRunList, p, &res)
		for _, r := range res.Runs {
			got = append(got, r.ID)
		}
		if res.NextCursor == "" {
			break
		}
		p.Cursor = res.NextCursor
	}
	if want := []keel.RunID{"r5", "r4", "r3", "r1"}; !slices.Equal(got, want) {
		t.Errorf("run.list waiting or paused, two a page = %v, want %v", got, want)
	}

	m := c.call(protocol.MethodRunList, map[string]any{"status": []string{"stuck"}})
	if m.Error == nil || m.Error.Code != protocol.CodeInvalidParams {
		t.Errorf("run.list status stuck = %+v, want code %d", m.Error, protocol.CodeInvalidParams)
	}
}
