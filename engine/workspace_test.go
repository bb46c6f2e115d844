package engine_test

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
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/policy"
)

// writeFile replaces path whole, as editors save (a new file renamed
// over the old), so that a watcher never reads it half-written.
func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// policyDirs holds real policy files: a managed file, a user file, and
// workspaces, each a directory that may hold .keel/policy.json.
type policyDirs struct {
	managed, user string
	root          string
}

func newPolicyDirs(t *testing.T) policyDirs {
	dir := t.TempDir()
	return policyDirs{managed: filepath.Join(dir, "etc", "policy.json"), user: filepath.Join(dir, "data", "policy.json"), root: dir}
}

// workspace makes a workspace directory with the given policy file
// ("": none).
func (d policyDirs) workspace(t *testing.T, name, file string) string {
	t.Helper()
	ws := filepath.Join(d.root, name)
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if file != "" {
		writeFile(t, policy.WorkspacePath(ws), file)
	}
	return ws
}

// watch starts a real watcher over d's files; its events go to the
// engine set later (as the daemon wires them) and then to the channel.
func (d policyDirs) watch(t *testing.T, eng **engine.Engine) (*policy.Watcher, <-chan policy.Event) {
	t.Helper()
	events := make(chan policy.Event, 64)
	w, err := policy.NewWatcher(policy.WatcherConfig{Paths: policy.Paths{Managed: d.managed, User: d.user}, OnEvent: func(ev policy.Event) {
		if *eng != nil {
			(*eng).PolicyChanged(context.Background(), ev.Workspace)
		}
		events <- ev
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, events
}

func waitPolicyEvent(t *testing.T, ctx context.Context, events <-chan policy.Event, what string, ok func(policy.Event) bool) policy.Event {
	t.Helper()
	for {
		select {
		case ev := <-events:
			if ok(ev) {
				return ev
			}
		case <-ctx.Done():
			t.Fatalf("no policy event: %s", what)
		}
	}
}

func toolResults(t *testing.T, evs []keel.Event) map[string]keel.ToolResultData {
	t.Helper()
	out := map[string]keel.ToolResultData{}
	for _, ev := range evs {
		if ev.Type == keel.EventToolResult {
			var d keel.ToolResultData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatal(err)
			}
			out[d.CallID] = d
		}
	}
	return out
}

// TestWorkspaceLayer: a workspace's deny overrides the user's allow for
// a run naming that workspace, and only for it; a workspace's allow
// does not loosen the managed layer's ask; once the runs end, no
// workspace stays watched.
func TestWorkspaceLayer(t *testing.T) {
	t.Parallel()
	d := newPolicyDirs(t)
	writeFile(t, d.user, `{"rules": [{"action": "tool", "tool": "write", "decision": "allow"}]}`)
	writeFile(t, d.managed, `{"rules": [{"action": "tool", "tool": "echo", "decision": "ask"}]}`)
	denies := d.workspace(t, "denies", `{"rules": [{"action": "tool", "tool": "write", "decision": "deny", "reason": "not in this project"}]}`)
	loosens := d.workspace(t, "loosens", `{"rules": [{"action": "tool", "tool": "echo", "decision": "allow"}]}`)
	var eng *engine.Engine
	w, _ := d.watch(t, &eng)
	p := scripted.ByGoal(nil, func(goal string) []scripted.Step {
		if strings.HasPrefix(goal, "echo") {
			return []scripted.Step{scripted.CallTools(keel.ToolCall{ID: "e1", Name: "echo", Arguments: json.RawMessage(`{"text":"hi"}`)}), scripted.Answer("echoed")}
		}
		return []scripted.Step{scripted.CallTools(keel.ToolCall{ID: "w1", Name: "write", Arguments: json.RawMessage(`{"n":1}`)}), scripted.Answer("done")}
	})
	st, e, tools := policyHarness(t, p, w)
	eng = e
	ctx := context.Background()

	in, err := eng.Start(ctx, engine.StartRequest{Goal: "write in the project", Workspace: denies})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, in.ID); got.Status != keel.RunSucceeded || got.Workspace != denies {
		t.Fatalf("run in the workspace = %s %q workspace %q, want succeeded in %s", got.Status, got.Error, got.Workspace, denies)
	}
	res := toolResults(t, journal(t, st, in.ID))["w1"]
	if res.Error == nil || res.Error.Code != keel.ToolPolicyDenied || !strings.Contains(res.Error.Message, policy.WorkspacePath(denies)+":1:") ||
		res.Policy == nil || !strings.Contains(res.Policy.Explanation, "workspace layer") {
		t.Fatalf("write in the workspace = %+v (policy %+v), want policy_denied by the workspace file", res.Error, res.Policy)
	}
	if tools.writes != 0 {
		t.Fatalf("the denied write ran %d times", tools.writes)
	}

	out, err := eng.Start(ctx, engine.StartRequest{Goal: "write elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, out.ID); got.Status != keel.RunSucceeded {
		t.Fatalf("run without a workspace = %s %q", got.Status, got.Error)
	}
	if res := toolResults(t, journal(t, st, out.ID))["w1"]; res.Error != nil || tools.writes != 1 {
		t.Fatalf("write without a workspace = %+v, %d writes; want the user's allow", res.Error, tools.writes)
	}

	asked, err := eng.Start(ctx, engine.StartRequest{Goal: "echo in the loose project", Workspace: loosens})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, asked.ID); got.Status != keel.RunWaiting {
		t.Fatalf("run in the loosening workspace = %s %q, want waiting on the managed ask", got.Status, got.Error)
	}
	req, _ := eventData[keel.ApprovalRequestData](t, journal(t, st, asked.ID), keel.EventApprovalAsked)
	if req.Policy == nil || req.Policy.Outcome != "ask" || !strings.Contains(req.Policy.Explanation, "managed layer") {
		t.Fatalf("approval.requested policy = %+v, want the managed ask", req.Policy)
	}
	if _, err := eng.Cancel(ctx, asked.ID); err != nil {
		t.Fatal(err)
	}
	if roots := w.InUse(); len(roots) != 0 {
		t.Errorf("workspaces still watched after every run's loop ended: %v", roots)
	}
}

// TestWorkspaceRefused: a workspace that is not an absolute directory,
// or whose policy file does not load, refuses the start, naming the
// file and line; nothing is stored.
func TestWorkspaceRefused(t *testing.T) {
	t.Parallel()
	d := newPolicyDirs(t)
	broken := d.workspace(t, "broken", "{\n  \"rules\": [\n    {\"action\": \"tool\", \"tool\": \"write\", \"decision\": \"never\"}\n]}")
	file := filepath.Join(d.root, "file")
	writeFile(t, file, "x")
	var eng *engine.Engine
	w, _ := d.watch(t, &eng)
	st, e, _ := policyHarness(t, scripted.New(nil, scripted.Repeat(scripted.Answer("done"))), w)
	eng = e
	ctx := context.Background()

	_, err := eng.Start(ctx, engine.StartRequest{Goal: "g", Workspace: broken})
	var fe *policy.FileError
	if !errors.Is(err, keel.ErrInvalid) || !errors.As(err, &fe) || fe.File != policy.WorkspacePath(broken) || fe.Line != 3 ||
		!strings.Contains(err.Error(), policy.WorkspacePath(broken)+":3:") {
		t.Fatalf("Start in a broken workspace = %v, want invalid naming %s:3", err, policy.WorkspacePath(broken))
	}
	for _, ws := range []string{"relative/dir", filepath.Join(d.root, "missing"), file} {
		if _, err := eng.Start(ctx, engine.StartRequest{Goal: "g", Workspace: ws}); !errors.Is(err, keel.ErrInvalid) {
			t.Errorf("Start(workspace %s) = %v, want keel.ErrInvalid", ws, err)
		}
	}
	if runs, err := st.ListRuns(ctx, 10); err != nil || len(runs) != 0 {
		t.Errorf("runs stored after refused starts: %+v, %v", runs, err)
	}
	if roots := w.InUse(); len(roots) != 0 {
		t.Errorf("refused starts left workspaces watched: %v", roots)
	}
}

// routed puts a scripted model behind a router, as the daemon's models
// are, so that the policy decides each model call's target.
func routed(t *testing.T, p *scripted.Provider) *models.Router {
	t.Helper()
	r, err := models.NewRouter(models.RouterConfig{Providers: map[string]models.ProviderConfig{"local": {Provider: p}}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestPolicyHotReloadDuringRun edits a run's workspace file between two
// tool calls of the run, with real files and a real watcher: while the
// model is thinking about its second call (the run live), and while the
// run waits for an approval. Each time the next call is decided by the
// new policy and a policy.changed is journaled before it; a broken edit
// journals policy.changed with the file and line and the last good
// policy goes on deciding. A replay after the file changed again
// reproduces the decisions of the time, the model calls' included.
func TestPolicyHotReloadDuringRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d := newPolicyDirs(t)
	const modelRule = `{"action": "model", "provider": "local", "decision": "allow", "reason": "local models"}`
	v1 := `{"rules": [` + modelRule + `]}`
	v2 := `{"rules": [` + modelRule + `, {"action": "tool", "tool": "write", "decision": "ask"}]}`
	v3 := `{"rules": [` + modelRule + `, {"action": "tool", "tool": "write", "decision": "deny", "reason": "no more writes"}]}`
	ws := d.workspace(t, "proj", v1)
	var eng *engine.Engine
	w, events := d.watch(t, &eng)

	call := func(id string) scripted.Step {
		return scripted.CallTools(keel.ToolCall{ID: id, Name: "write", Arguments: json.RawMessage(`{"n":1}`)})
	}
	p := scripted.New(nil,
		call("c1"),
		// While the model thinks, the run is live: an edit to ask.
		scripted.ReplyFunc(func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
			writeFile(t, policy.WorkspacePath(ws), v2)
			waitPolicyEvent(t, ctx, events, "the edit to ask", func(ev policy.Event) bool { return ev.Workspace == ws && ev.Err == nil })
			return models.ChatResponse{Message: models.Message{Role: models.RoleAssistant,
				ToolCalls: []keel.ToolCall{{ID: "c2", Name: "write", Arguments: json.RawMessage(`{"n":2}`)}}}}, nil
		}),
		call("c3"),
		call("c4"),
		scripted.Answer("done"))
	tools := &echoTools{}
	st, e := newEngine(t, engine.Config{Model: routed(t, p), Tools: tools, Policy: w})
	eng = e

	r, err := eng.Start(ctx, engine.StartRequest{Goal: "write twice", Workspace: ws})
	if err != nil {
		t.Fatal(err)
	}
	// c1 ran under v1 (no rule); c2, after the edit, asks.
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunWaiting {
		t.Fatalf("run = %s %q, want waiting for the approval of c2", got.Status, got.Error)
	}
	v2Digest := w.CurrentFor(ws).Policy.Digest()

	// While it waits, the file breaks: the run notes it before its next
	// decision, and c3 is decided by the last good policy (ask).
	writeFile(t, policy.WorkspacePath(ws), "{\"rules\": [\n\n  {\"action\": \"tool\" \"tool\": \"write\"}]}")
	waitPolicyEvent(t, ctx, events, "the broken edit", func(ev policy.Event) bool { return ev.Workspace == ws && ev.Err != nil })
	approve := func(id string) {
		t.Helper()
		req, _ := eventData[keel.ApprovalRequestData](t, lastOf(t, journal(t, st, r.ID), keel.EventApprovalAsked), keel.EventApprovalAsked)
		if req.Call.ID != id {
			t.Fatalf("waiting on %s, want %s", req.Call.ID, id)
		}
		if _, err := eng.Approve(ctx, r.ID, keel.ApprovalData{CallID: id, ArgsSHA256: req.ArgsSHA256, Approved: true}); err != nil {
			t.Fatal(err)
		}
	}
	approve("c2")
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunWaiting {
		t.Fatalf("run = %s %q, want waiting for the approval of c3 (the last good policy asks)", got.Status, got.Error)
	}
	// Fixed to deny while it waits: c4 is denied.
	writeFile(t, policy.WorkspacePath(ws), v3)
	waitPolicyEvent(t, ctx, events, "the edit to deny", func(ev policy.Event) bool { return ev.Workspace == ws && ev.Err == nil })
	v3Digest := w.CurrentFor(ws).Policy.Digest()
	approve("c3")
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q, want succeeded", got.Status, got.Error)
	}
	if tools.writes != 3 {
		t.Errorf("writes = %d, want 3 (c1, c2 and c3; c4 denied)", tools.writes)
	}

	// The journal: each change before the decision it made.
	var order []string
	for _, ev := range journal(t, st, r.ID) {
		switch ev.Type {
		case keel.EventPolicyChanged:
			var c keel.PolicyChangeData
			if err := json.Unmarshal(ev.Data, &c); err != nil {
				t.Fatal(err)
			}
			switch {
			case c.Error != "":
				if !strings.Contains(c.Error, policy.WorkspacePath(ws)+":3:") {
					t.Errorf("policy.changed error = %q, want %s:3", c.Error, policy.WorkspacePath(ws))
				}
				if c.Digest != v2Digest {
					t.Errorf("policy.changed with an error names digest %s, want the last good %s", c.Digest, v2Digest)
				}
				order = append(order, "broken")
			case c.Digest == v2Digest:
				order = append(order, "v2")
			case c.Digest == v3Digest:
				order = append(order, "v3")
			default:
				order = append(order, "other")
			}
		case keel.EventToolResult:
			var res keel.ToolResultData
			if err := json.Unmarshal(ev.Data, &res); err != nil {
				t.Fatal(err)
			}
			outcome := "ran"
			if res.Error != nil {
				outcome = string(res.Error.Code)
			}
			order = append(order, res.CallID+" "+outcome)
		case keel.EventApprovalAsked:
			var req keel.ApprovalRequestData
			if err := json.Unmarshal(ev.Data, &req); err != nil {
				t.Fatal(err)
			}
			order = append(order, req.Call.ID+" asked")
		}
	}
	want := "c1 ran, v2, c2 asked, broken, c2 ran, c3 asked, v3, c3 ran, c4 policy_denied"
	if got := strings.Join(order, ", "); got != want {
		t.Errorf("journal = %s\nwant      %s", got, want)
	}
	// The model calls' decisions: each model.result names the rule that
	// allowed its target and the policy of its time.
	var versions []uint64
	for _, ev := range journal(t, st, r.ID) {
		if ev.Type == keel.EventModelResult {
			var m keel.ModelResultData
			if err := json.Unmarshal(ev.Data, &m); err != nil {
				t.Fatal(err)
			}
			if len(m.Policy) != 1 || m.Policy[0].Provider != "local" || m.Policy[0].Outcome != "allow" || !strings.Contains(m.Policy[0].Explanation, "local models") {
				t.Fatalf("model.result %d policy = %+v, want the local allow rule", m.Step, m.Policy)
			}
			versions = append(versions, m.Policy[0].Version)
		}
	}
	if len(versions) != 5 || versions[0] == versions[4] {
		t.Errorf("model decisions' versions = %v, want 5 with the last after the edits", versions)
	}

	// The run ended: its workspace is no longer watched.
	if roots := w.InUse(); len(roots) != 0 {
		t.Errorf("workspaces watched after the run ended: %v", roots)
	}
	// Replay, with the file changed again: the decisions of the time.
	writeFile(t, policy.WorkspacePath(ws), `{"rules": [{"action": "tool", "tool": "write", "decision": "allow"}, {"action": "model", "decision": "deny"}]}`)
	if s := w.CurrentFor(ws); s.Policy.Decide(&policy.Action{Kind: policy.KindModel, Provider: "local", Model: "m"}).Outcome != policy.Deny {
		t.Fatal("the last edit is not what the workspace's policy says now")
	}
	replayMatches(t, eng, st, r.ID)
}

// lastOf returns the events up to and including the last of type typ,
// with that one first, for eventData.
func lastOf(t *testing.T, evs []keel.Event, typ keel.EventType) []keel.Event {
	t.Helper()
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Type == typ {
			return evs[i : i+1]
		}
	}
	t.Fatalf("no %s in the journal", typ)
	return nil
}

// TestWorkspacePolicyAfterRestart: a run waits on an approval its
// workspace file asked for; the engine stops, the file changes to deny
// while it is down, and a new engine (a new watcher, the same journal)
// takes the approval: the approved call runs under the ask it waited on
// (the decision of the time), the change is journaled (policy.changed,
// from the journal's last decision to the file's policy now) before the
// next call, which the new file denies; a replay reproduces it all.
func TestWorkspacePolicyAfterRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newPolicyDirs(t)
	ws := d.workspace(t, "proj", `{"rules": [{"action": "tool", "tool": "write", "decision": "ask"}]}`)
	st := openStore(t)
	steps := []scripted.Step{
		scripted.CallTools(keel.ToolCall{ID: "c1", Name: "write", Arguments: json.RawMessage(`{"n":1}`)}),
		scripted.CallTools(keel.ToolCall{ID: "c2", Name: "write", Arguments: json.RawMessage(`{"n":2}`)}),
		scripted.Answer("done"),
	}
	var eng1 *engine.Engine
	w1, _ := d.watch(t, &eng1)
	tools := &echoTools{}
	eng1, err := engine.New(engine.Config{Store: st, Model: scripted.New(nil, steps...), Tools: tools, Policy: w1})
	if err != nil {
		t.Fatal(err)
	}
	r, err := eng1.Start(ctx, engine.StartRequest{Goal: "write twice", Workspace: ws})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng1, st, r.ID); got.Status != keel.RunWaiting {
		t.Fatalf("run = %s %q, want waiting", got.Status, got.Error)
	}
	if err := eng1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	w1.Close()

	writeFile(t, policy.WorkspacePath(ws), `{"rules": [{"action": "tool", "tool": "write", "decision": "deny", "reason": "changed while down"}]}`)
	var eng2 *engine.Engine
	w2, _ := d.watch(t, &eng2)
	// The model goes on from the journal: its next reply is c2's call.
	eng2, err = engine.New(engine.Config{Store: st, Model: scripted.New(nil, steps[1:]...), Tools: tools, Policy: w2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng2.Close(context.Background()) })
	req, _ := eventData[keel.ApprovalRequestData](t, journal(t, st, r.ID), keel.EventApprovalAsked)
	if _, err := eng2.Approve(ctx, r.ID, keel.ApprovalData{CallID: "c1", ArgsSHA256: req.ArgsSHA256, Approved: true}); err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng2, st, r.ID); got.Status != keel.RunSucceeded {
		t.Fatalf("run after the restart = %s %q, want succeeded", got.Status, got.Error)
	}
	if tools.writes != 1 {
		t.Errorf("writes = %d, want 1 (c1 under its ask; c2 denied)", tools.writes)
	}
	var order []string
	for _, ev := range journal(t, st, r.ID) {
		switch ev.Type {
		case keel.EventPolicyChanged:
			var c keel.PolicyChangeData
			if err := json.Unmarshal(ev.Data, &c); err != nil {
				t.Fatal(err)
			}
			if c.Digest != w2.CurrentFor(ws).Policy.Digest() || c.Digest == req.Policy.Digest {
				t.Errorf("policy.changed digest %s, want the new file's", c.Digest)
			}
			order = append(order, "changed")
		case keel.EventToolResult:
			var res keel.ToolResultData
			if err := json.Unmarshal(ev.Data, &res); err != nil {
				t.Fatal(err)
			}
			outcome := "ran"
			if res.Error != nil {
				outcome = string(res.Error.Code)
			}
			order = append(order, res.CallID+" "+outcome)
		}
	}
	if got, want := strings.Join(order, ", "), "c1 ran, changed, c2 policy_denied"; got != want {
		t.Errorf("journal = %s, want %s", got, want)
	}
	replayMatches(t, eng2, st, r.ID)
}
