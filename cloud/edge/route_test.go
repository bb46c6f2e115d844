package edge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud/edge"
	"github.com/keel-runtime/keel/cloud/route"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/internal/daemontest"
	"github.com/keel-runtime/keel/internal/wasmtest"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
)

// canned is a tools directory's files for a canned wasm tool name,
// requesting the directory /workspace (read-only) when reads is set.
func canned(files map[string][]byte, name, sideEffects string, reads bool) {
	files[name+".wasm"] = wasmtest.CannedReactor(`{"output":{"done":true}}`)
	req := ""
	if reads {
		req = `"requests":{"fs":[{"guest_path":"/workspace","read_only":true}]},`
	}
	files[name+".manifest.json"] = []byte(`{"name":"` + name + `","description":"A tool of one edge only.","side_effects":"` + sideEffects + `",` + req + `
"input_schema":{"type":"object"}}`)
}

// byPrefix answers a run whose goal starts with a key of script with its
// steps, and any other with its goal.
func byPrefix(script map[string][]scripted.Step) *scripted.Provider {
	return scripted.ByGoal(nil, func(goal string) []scripted.Step {
		for p, steps := range script {
			if strings.HasPrefix(goal, p) {
				return steps
			}
		}
		return []scripted.Step{scripted.Answer("answer to: " + goal)}
	})
}

// TestPlanStepRoutedToEdge: two real daemons joined to the cloud; only
// route-b has the tools bump (a non-idempotent write) and peek (granted a
// directory marked private). A DAG run started on route-a, whose first
// step needs bump, runs that step on route-b by itself: route-a journals
// the hand-off, the acceptance and the completion elsewhere, route-b
// journals the step's run, bump runs once, and the next step, on
// route-a, reads the result. The step's spans are in route-a's trace
// under the hand-off span. A step that needs peek runs on route-b too,
// but its result, private there, does not cross: route-a learns that it
// succeeded, and its spans cross as one stub.
func TestPlanStepRoutedToEdge(t *testing.T) {
	t.Parallel()
	const canary = "diary-canary-5150"
	files := map[string][]byte{}
	canned(files, "bump", "non_idempotent_write", false)
	canned(files, "peek", "read_only", true)
	dirB := daemontest.DataDir(t, files)
	// With a Jaeger at hand, both edges export their traces there: route-a
	// its run's, route-b the step's run, in route-a's trace.
	dirA := daemontest.EmptyDataDir(t)
	jaeger, service := os.Getenv("KEEL_TEST_JAEGER_QUERY"), fmt.Sprintf("keel-route-%d", time.Now().UnixNano())
	if jaeger != "" && os.Getenv("KEEL_TEST_OTLP_GRPC") != "" {
		for dir, name := range map[string]string{dirA: service, dirB: service + "-b"} {
			cfg, _ := json.Marshal(map[string]any{"protocol": "grpc", "endpoint": os.Getenv("KEEL_TEST_OTLP_GRPC"), "insecure": true,
				"service_name": name, "flush_interval_ms": 100})
			if err := os.WriteFile(filepath.Join(dir, daemon.TelemetryConfigFile), cfg, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		jaeger = ""
	}
	b := daemontest.Start(t, daemon.Config{DataDir: dirB, Join: cluster.LeafURLs(), JoinCredentials: credentials(t), EdgeName: "route-b",
		EdgeHeartbeat: 100 * time.Millisecond, Provider: byPrefix(map[string][]scripted.Step{
			"bump the counter":  {scripted.CallTools(keel.ToolCall{ID: "c1", Name: "bump", Arguments: json.RawMessage(`{}`)}), scripted.Answer("bumped once")},
			"peek at the diary": {scripted.CallTools(keel.ToolCall{ID: "c1", Name: "peek", Arguments: json.RawMessage(`{}`)}), scripted.Answer("the diary says " + canary)},
		})})
	cb := daemontest.Dial(t, b.Dir)
	daemontest.WaitTools(t, cb, "route-b's tools", func(ts []protocol.ToolInfo) bool {
		return daemontest.HasTool("bump")(ts) && daemontest.HasTool("peek")(ts)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	secrets := t.TempDir()
	if out, errs, code := daemontest.CLI(ctx, b.Dir, "tools", "grant", "peek", "fs:/workspace="+secrets, "--private"); code != 0 {
		t.Fatalf("keel tools grant peek --private = %d:\n%s%s", code, out, errs)
	}
	a := daemontest.Start(t, daemon.Config{DataDir: dirA, Provider: byPrefix(nil), Join: cluster.LeafURLs(), JoinCredentials: credentials(t),
		EdgeName: "route-a", EdgeHeartbeat: 100 * time.Millisecond})
	ca := daemontest.Dial(t, a.Dir)

	// Both declared, route-b with its tools (and peek's private grant).
	reg, err := edge.Watch(ctx, js, ns, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if err := reg.Wait(ctx, func(tab *route.Table) bool {
		var okA, okB bool
		for _, e := range tab.Envs() {
			okA = okA || e.Name == "route-a"
			if e.Name == "route-b" {
				okB = slices.ContainsFunc(e.Tools, func(t route.Tool) bool { return t.Name == "bump" }) &&
					slices.ContainsFunc(e.Tools, func(t route.Tool) bool { return t.Name == "peek" && slices.Contains(t.Labels, keel.LabelPrivate) })
			}
		}
		return okA && okB
	}); err != nil {
		t.Fatalf("the edges were not declared with their tools: %v; %+v", err, reg.Table.Envs())
	}

	// The public step.
	got := daemontest.RunToEnd(t, ca, protocol.RunStartParams{Kind: keel.KindDAG, Goal: "count and tell", Plan: &keel.Plan{Steps: []keel.PlanStep{
		{ID: "far", Goal: "bump the counter", Tools: []string{"bump"}},
		{ID: "tell", Goal: "say what happened", DependsOn: []string{"far"}},
	}}})
	if got.Run.Status != keel.RunSucceeded || !strings.Contains(got.Run.Result, "bumped once") {
		t.Fatalf("run on route-a = %s %q %q; events %v", got.Run.Status, got.Run.Result, got.Run.Error, daemontest.Types(got.Events))
	}
	cross := crossEvents(t, got.Events)
	if len(cross) != 3 {
		t.Fatalf("route-a's journal %v: want step.handed_off, step.accepted, step.completed_elsewhere", daemontest.Types(got.Events))
	}
	var hand keel.StepHandedOffData
	var acc keel.StepAcceptedData
	var done keel.StepCompletedElsewhereData
	json.Unmarshal(cross[0].Data, &hand)
	json.Unmarshal(cross[1].Data, &acc)
	json.Unmarshal(cross[2].Data, &done)
	if hand.Placement.Env != "route-b" || acc.RemoteRun == "" || done.Status != keel.RunSucceeded || done.Result != "bumped once" || done.Withheld {
		t.Errorf("hand-off %+v, accepted %+v, completed %+v; want route-b's run, its result back", hand, acc, done)
	}
	// What its model calls spent there crossed with it (the scripted
	// model counts words as tokens), for route-a's budget.
	if done.Tokens <= 0 {
		t.Errorf("completed %+v: want the tokens route-b's run spent", done)
	}
	// route-b's journal holds the step's run, and bump ran once.
	there, err := cb.GetRun(ctx, acc.RemoteRun)
	if err != nil {
		t.Fatal(err)
	}
	if there.Run.Status != keel.RunSucceeded || there.Run.IdempotencyKey != "step-"+string(hand.Run) {
		t.Errorf("route-b's run = %s, key %q; want succeeded, key step-%s", there.Run.Status, there.Run.IdempotencyKey, hand.Run)
	}
	if calls := countType(there.Events, keel.EventToolResult); calls != 1 {
		t.Errorf("route-b's run journaled %d tool results, want 1: %v", calls, daemontest.Types(there.Events))
	}
	audit, err := cb.ToolAudit(ctx, "bump", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(audit) != 1 {
		t.Errorf("bump ran %d times on route-b, want once: %+v", len(audit), audit)
	}
	if _, err := ca.GetRun(ctx, hand.Run); err == nil {
		t.Errorf("route-a has a local run %s for the step handed off", hand.Run)
	}
	// route-a's trace: the step's spans from route-b under the hand-off span.
	byID := map[string]keel.Span{}
	for _, sp := range got.Spans {
		byID[sp.ID] = sp
	}
	var handSpan, rootThere, toolThere keel.Span
	for _, sp := range got.Spans {
		switch {
		case sp.Kind == keel.SpanHandOff:
			handSpan = sp
		case sp.Kind == keel.SpanRun && sp.ParentID != "" && byID[sp.ParentID].Kind == keel.SpanHandOff:
			rootThere = sp
		case sp.Kind == keel.SpanToolCall && sp.Name == "bump":
			toolThere = sp
		}
	}
	if handSpan.ID == "" || handSpan.Name != "route-b" || byID[handSpan.ParentID].Name != "far" {
		t.Fatalf("route-a's spans have no hand-off span to route-b under step far: %+v", got.Spans)
	}
	if rootThere.ParentID != handSpan.ID || toolThere.ID == "" || !descends(byID, toolThere, rootThere.ID) {
		t.Errorf("route-b's spans in route-a's trace: root %+v, bump %+v; want bump under route-b's root under the hand-off span", rootThere, toolThere)
	}
	if _, spanID, err := keel.ParseTraceParent(hand.TraceParent); err != nil || spanID != keel.OTelSpanID(handSpan.ID) {
		t.Errorf("traceparent %q (%v): want the hand-off span %s", hand.TraceParent, err, handSpan.ID)
	}

	// keel trace draws the same tree.
	if out, errs, code := daemontest.CLI(ctx, a.Dir, "trace", "--json", string(got.Run.ID)); code != 0 || !strings.Contains(out, handSpan.ID) || !strings.Contains(out, toolThere.ID) {
		t.Errorf("keel trace --json %s = %d, stderr %q; want the hand-off span and route-b's call of bump in:\n%s", got.Run.ID, code, errs, out)
	}
	if jaeger != "" {
		// route-a's copy of route-b's spans (what crossed back), and
		// route-b's own export of them.
		jaegerJoined(t, jaeger, keel.TraceID(got.Run.ID), service)
		jaegerJoined(t, jaeger, keel.TraceID(got.Run.ID), service+"-b")
	}

	// The private step.
	priv := daemontest.RunToEnd(t, ca, protocol.RunStartParams{Kind: keel.KindDAG, Goal: "read it", Plan: &keel.Plan{Steps: []keel.PlanStep{
		{ID: "peek", Goal: "peek at the diary", Tools: []string{"peek"}},
	}}})
	if priv.Run.Status != keel.RunSucceeded {
		t.Fatalf("private run on route-a = %s %q; events %v", priv.Run.Status, priv.Run.Error, daemontest.Types(priv.Events))
	}
	b2, _ := json.Marshal(priv)
	if strings.Contains(string(b2), canary) {
		t.Errorf("route-a holds route-b's private result: %s", b2)
	}
	pc := crossEvents(t, priv.Events)
	if len(pc) != 3 {
		t.Fatalf("route-a's journal %v: want the three cross-environment events", daemontest.Types(priv.Events))
	}
	var pdone keel.StepCompletedElsewhereData
	json.Unmarshal(pc[2].Data, &pdone)
	if !pdone.Withheld || pdone.Status != keel.RunSucceeded || pdone.Result != "" || pdone.Spans != 1 {
		t.Errorf("private step's completion %+v, want succeeded, withheld, one stub span", pdone)
	}
	if pdone.Tokens <= 0 {
		t.Errorf("private step's completion %+v: want what it spent there, withheld or not", pdone)
	}
	var pacc keel.StepAcceptedData
	json.Unmarshal(pc[1].Data, &pacc)
	if r, err := cb.GetRun(ctx, pacc.RemoteRun); err != nil || !strings.Contains(r.Run.Result, canary) {
		t.Errorf("route-b's run = %+v, %v; want its result there", r.Run, err)
	}
	for _, sp := range priv.Spans {
		if sp.Kind == keel.SpanToolCall || sp.Kind == keel.SpanModelCall {
			t.Errorf("a span of the private step crossed: %+v", sp)
		}
	}
}

// crossEvents are the cross-environment events of a journal, in order.
func crossEvents(t *testing.T, evs []keel.Event) []keel.Event {
	t.Helper()
	var out []keel.Event
	for _, ev := range evs {
		switch ev.Type {
		case keel.EventStepHandedOff, keel.EventStepAccepted, keel.EventStepCompletedElsewhere:
			out = append(out, ev)
		}
	}
	return out
}

func countType(evs []keel.Event, typ keel.EventType) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

// descends reports whether sp is under the span ancestor.
func descends(byID map[string]keel.Span, sp keel.Span, ancestor string) bool {
	for i := 0; i < 16 && sp.ParentID != ""; i++ {
		if sp.ParentID == ancestor {
			return true
		}
		sp = byID[sp.ParentID]
	}
	return false
}

// TestPlanStepWaitsAcrossRestart: the daemon that handed a step off stops
// while the step's run on the other edge waits for a person (its call of
// tick, non-idempotent, needs approval there). Started again on its data
// directory, it resumes the plan and waits for that run, without handing
// the step off again; once the call is approved there, the plan
// finishes, and tick ran once. (Each test's tools are its own: the
// cloud routes a step to any edge that declares its tool.)
func TestPlanStepWaitsAcrossRestart(t *testing.T) {
	t.Parallel()
	_, _, cb := approvalEdge(t, "resume-b", "resume-a", "tick", "tick the clock", "ticked once")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dirA := daemontest.EmptyDataDir(t)
	cfgA := daemon.Config{DataDir: dirA, Provider: byPrefix(nil), Join: cluster.LeafURLs(), JoinCredentials: credentials(t),
		EdgeName: "resume-a", EdgeHeartbeat: 100 * time.Millisecond}
	a := daemontest.Start(t, cfgA)
	ca := daemontest.Dial(t, a.Dir)
	waitEdge(t, "resume-a", true)
	run, err := ca.StartRun(ctx, protocol.RunStartParams{Kind: keel.KindDAG, Goal: "count", Plan: &keel.Plan{Steps: []keel.PlanStep{
		{ID: "far", Goal: "tick the clock", Tools: []string{"tick"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	evs := daemontest.Follow(t, ca, run.ID, keel.EventStepAccepted)
	var acc keel.StepAcceptedData
	json.Unmarshal(evs[len(evs)-1].Data, &acc)
	asked := daemontest.Follow(t, cb, acc.RemoteRun, keel.EventApprovalAsked)
	var req keel.ApprovalRequestData
	json.Unmarshal(asked[len(asked)-1].Data, &req)
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}

	a2 := daemontest.Start(t, cfgA)
	ca2 := daemontest.Dial(t, a2.Dir)
	if _, err := cb.ApproveRun(ctx, protocol.RunApproveParams{RunID: acc.RemoteRun, CallID: "c1", ArgsSHA256: req.ArgsSHA256, Approved: true}); err != nil {
		t.Fatal(err)
	}
	daemontest.Follow(t, ca2, run.ID)
	got, err := ca2.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Run.Status != keel.RunSucceeded || !strings.Contains(got.Run.Result, "ticked once") {
		t.Fatalf("resumed run = %s %q %q; events %v", got.Run.Status, got.Run.Result, got.Run.Error, daemontest.Types(got.Events))
	}
	for typ, want := range map[keel.EventType]int{keel.EventStepHandedOff: 1, keel.EventStepAccepted: 1, keel.EventStepCompletedElsewhere: 1,
		keel.EventRunResumed: 1} {
		if n := countType(got.Events, typ); n != want {
			t.Errorf("%d %s events, want %d: %v", n, typ, want, daemontest.Types(got.Events))
		}
	}
	audit, err := cb.ToolAudit(ctx, "tick", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(audit) != 1 {
		t.Errorf("tick ran %d times on resume-b, want once", len(audit))
	}
}

// approvalEdge starts a joined daemon named name whose tool (canned,
// non-idempotent) needs approval there and whose model calls it once for
// goal and then answers answer; it returns once the cloud routes a need
// of tool, asked by origin, to an edge, with the daemon, its
// configuration (to start it again) and a client of it.
func approvalEdge(t *testing.T, name, origin, tool, goal, answer string) (*daemontest.Daemon, daemon.Config, *client.Client) {
	t.Helper()
	files := map[string][]byte{}
	canned(files, tool, "non_idempotent_write", false)
	cfg := daemon.Config{DataDir: daemontest.DataDir(t, files), Join: cluster.LeafURLs(), JoinCredentials: credentials(t),
		EdgeName: name, EdgeHeartbeat: 100 * time.Millisecond, RequireApproval: []keel.SideEffect{keel.SideEffectNonIdempotentWrite},
		Provider: byPrefix(map[string][]scripted.Step{
			goal: {scripted.CallTools(keel.ToolCall{ID: "c1", Name: tool, Arguments: json.RawMessage(`{}`)}), scripted.Answer(answer)},
		})}
	d := daemontest.Start(t, cfg)
	c := daemontest.Dial(t, d.Dir)
	daemontest.WaitTools(t, c, name+"'s tools", daemontest.HasTool(tool))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg, err := edge.Watch(ctx, js, ns, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if err := reg.Wait(ctx, func(tab *route.Table) bool {
		_, err := tab.Decide(route.Need{Tools: []string{tool}, Origin: origin, Kind: route.KindEdge})
		return err == nil
	}); err != nil {
		t.Fatalf("%s was not declared with %s: %v", name, tool, err)
	}
	return d, cfg, c
}

// jaegerJoined waits until Jaeger holds trace traceID with route-b's
// call of bump in it, exported by service, under route-b's root span,
// under the hand-off span: one trace for both sides. It polls (Jaeger
// offers nothing to wait on) and fails after a minute.
func jaegerJoined(t *testing.T, query, traceID, service string) {
	t.Helper()
	type span struct {
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		ProcessID     string `json:"processID"`
		References    []struct {
			RefType string `json:"refType"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
	}
	var last []span
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		resp, err := http.Get(query + "/api/traces/" + traceID)
		if err != nil {
			continue
		}
		var body struct {
			Data []struct {
				Spans     []span `json:"spans"`
				Processes map[string]struct {
					ServiceName string `json:"serviceName"`
				} `json:"processes"`
			} `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil || len(body.Data) != 1 {
			continue
		}
		last = body.Data[0].Spans
		byID := map[string]span{}
		for _, sp := range last {
			byID[sp.SpanID] = sp
		}
		parent := func(sp span) span {
			for _, r := range sp.References {
				if r.RefType == "CHILD_OF" {
					return byID[r.SpanID]
				}
			}
			return span{}
		}
		procs := body.Data[0].Processes
		for _, sp := range last {
			if sp.OperationName != "execute_tool bump" || procs[sp.ProcessID].ServiceName != service {
				continue
			}
			for p, i := parent(sp), 0; p.SpanID != "" && i < 8; p, i = parent(p), i+1 {
				if p.OperationName == string(keel.SpanHandOff) {
					return
				}
			}
		}
	}
	var names []string
	for _, sp := range last {
		names = append(names, sp.OperationName)
	}
	t.Fatalf("Jaeger's trace %s has no call of bump by %s under the hand-off span within a minute; its spans: %v", traceID, service, names)
}
