package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/policy"
)

// TestWorkspacePolicyInDaemon: a run naming a workspace is decided by
// the workspace's .keel/policy.json with the user's file, through the
// real daemon, the real writefile tool and a real watcher. The user
// allows writefile, the workspace asks: the run waits. An edit of the
// workspace file while it waits (to deny) is journaled at once in the
// run (policy.changed, the daemon's watcher telling the engine); the
// approved call runs under the ask it waited on, and the next call is
// denied by the new file. run.replay, after the file changed again,
// reproduces the run. A run without the workspace is not touched.
func TestWorkspacePolicyInDaemon(t *testing.T) {
	t.Parallel()
	dir := withTools(t, "writefile")
	if err := os.WriteFile(policy.UserPath(dir), []byte(`{"rules": [{"action": "tool", "tool": "writefile", "decision": "allow"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ws := t.TempDir()
	wsFile := policy.WorkspacePath(ws)
	writeWS := func(s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(wsFile), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(wsFile+".new", []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(wsFile+".new", wsFile); err != nil {
			t.Fatal(err)
		}
	}
	writeWS(`{"rules": [{"action": "tool", "tool": "writefile", "decision": "ask", "reason": "the project reviews writes"}]}`)
	events := make(chan policy.Event, 16)
	write := func(id, name string) keel.ToolCall {
		return keel.ToolCall{ID: id, Name: "writefile", Arguments: json.RawMessage(`{"path":"` + name + `","content":"written"}`)}
	}
	p := scripted.ByGoal(nil, func(goal string) []scripted.Step {
		if goal == "outside" {
			return []scripted.Step{scripted.CallTools(write("o1", "outside.txt")), scripted.Answer("done")}
		}
		return []scripted.Step{scripted.CallTools(write("c1", "first.txt")), scripted.CallTools(write("c2", "second.txt")), scripted.Answer("done")}
	})
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: p,
		ManagedPolicyFile: filepath.Join(t.TempDir(), "managed", "policy.json"),
		OnPolicy:          func(ev policy.Event) { events <- ev }})
	c := dial(t, d.dir)
	ctx := context.Background()
	out := t.TempDir()
	if s, e, code := runCLI(ctx, d.dir, "tools", "grant", "writefile", "fs:/workspace="+out); code != 0 {
		t.Fatalf("grant: code %d\n%s%s", code, s, e)
	}
	exists := func(name string) bool {
		_, err := os.Stat(filepath.Join(out, name))
		return !errors.Is(err, os.ErrNotExist)
	}

	// Outside the workspace, the user's allow.
	outside, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "outside"})
	if err != nil {
		t.Fatal(err)
	}
	if evs := follow(t, c, outside.ID); evs[len(evs)-1].Type != keel.EventRunSucceeded || !exists("outside.txt") {
		t.Fatalf("run outside the workspace ended with %s, outside.txt written: %v", evs[len(evs)-1].Type, exists("outside.txt"))
	}

	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "inside", Workspace: ws})
	if err != nil {
		t.Fatal(err)
	}
	asked := waitEvent(t, d.dir, run.ID, keel.EventApprovalAsked)
	var req keel.ApprovalRequestData
	if err := json.Unmarshal(asked.Data, &req); err != nil {
		t.Fatal(err)
	}
	if req.Policy == nil || !strings.Contains(req.Policy.Explanation, wsFile) {
		t.Fatalf("approval.requested policy = %+v, want the workspace's ask (%s)", req.Policy, wsFile)
	}

	// The daemon's watcher tells the engine before OnPolicy: once the
	// test sees the reload, the run's journal holds its policy.changed.
	reloaded := func(what string) policy.Event {
		t.Helper()
		timeout := time.After(time.Minute)
		for {
			select {
			case ev := <-events:
				if ev.Workspace == ws {
					return ev
				}
			case <-timeout:
				t.Fatalf("no reload of the workspace file within a minute: %s", what)
			}
		}
	}
	lastChange := func() keel.PolicyChangeData {
		t.Helper()
		det, err := c.GetRun(ctx, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		var pc keel.PolicyChangeData
		for _, ev := range det.Events {
			if ev.Type == keel.EventPolicyChanged {
				pc = keel.PolicyChangeData{}
				if err := json.Unmarshal(ev.Data, &pc); err != nil {
					t.Fatal(err)
				}
			}
		}
		return pc
	}

	// A broken edit: the run is told, with the file and line, and keel
	// doctor says so.
	writeWS("{\"rules\": [\n  {\"action\": \"tool\", \"decision\": \"perhaps\"}]}")
	if ev := reloaded("the broken edit"); ev.Err == nil {
		t.Fatalf("the broken edit reloaded without an error")
	}
	if pc := lastChange(); !strings.Contains(pc.Error, wsFile+":2:") || pc.Digest != req.Policy.Digest {
		t.Errorf("policy.changed after the broken edit = %+v, want the error at %s:2 and the last good digest %s", pc, wsFile, req.Policy.Digest)
	}
	env, err := c.Describe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := env.Policy; p == nil || len(p.Workspaces) != 1 || p.Workspaces[0].Root != ws || !strings.Contains(p.Workspaces[0].Error, wsFile) {
		t.Errorf("env.describe policy = %+v, want workspace %s with its error", p, ws)
	}
	if s, _, code := runCLI(ctx, d.dir, "doctor"); code == 0 || !strings.Contains(s, "BROKEN") || !strings.Contains(s, wsFile) {
		t.Errorf("keel doctor with a broken workspace file = %d:\n%s\nwant a failure naming %s", code, s, wsFile)
	}

	writeWS(`{"rules": [{"action": "tool", "tool": "writefile", "decision": "deny", "reason": "no more writes"}]}`)
	if ev := reloaded("the edit to deny"); ev.Err != nil {
		t.Fatalf("the edit to deny: %v", ev.Err)
	}
	pc := lastChange()
	if pc.Digest == req.Policy.Digest || pc.Digest == "" || pc.Error != "" || pc.Version <= req.Policy.Version {
		t.Errorf("policy.changed = %+v, want a new version and digest after %d %s", pc, req.Policy.Version, req.Policy.Digest)
	}
	if det, err := c.GetRun(ctx, outside.ID); err != nil || slicesHasType(det.Events, keel.EventPolicyChanged) {
		t.Errorf("the run outside the workspace got policy.changed (%v)", err)
	}

	if _, err := c.ApproveRun(ctx, protocol.RunApproveParams{RunID: run.ID, CallID: "c1", ArgsSHA256: req.ArgsSHA256, Approved: true}); err != nil {
		t.Fatal(err)
	}
	evs := follow(t, c, run.ID)
	if evs[len(evs)-1].Type != keel.EventRunSucceeded || !exists("first.txt") || exists("second.txt") {
		t.Fatalf("run ended with %s; first.txt %v, second.txt %v; want succeeded, the approved call run, the next denied", evs[len(evs)-1].Type, exists("first.txt"), exists("second.txt"))
	}
	for _, ev := range evs {
		var res keel.ToolResultData
		if ev.Type == keel.EventToolResult && json.Unmarshal(ev.Data, &res) == nil && res.CallID == "c2" &&
			(res.Error == nil || res.Error.Code != keel.ToolPolicyDenied || !strings.Contains(res.Error.Message, "no more writes")) {
			t.Errorf("c2 result = %+v, want denied by the edited workspace file", res.Error)
		}
	}

	// The run ended: its workspace is no longer watched.
	if env, err := c.Describe(ctx); err != nil || env.Policy == nil || len(env.Policy.Workspaces) != 0 {
		t.Errorf("env.describe after the run ended = %+v, %v; want no workspace in use", env.Policy, err)
	}
	writeWS(`{}`)
	rep, err := client.Do(ctx, c, client.RunReplay, protocol.RunRef{RunID: run.ID})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Matches {
		t.Errorf("run.replay after the file changed again: %s", rep.Difference)
	}
}

func slicesHasType(evs []keel.Event, typ keel.EventType) bool {
	for _, ev := range evs {
		if ev.Type == typ {
			return true
		}
	}
	return false
}
