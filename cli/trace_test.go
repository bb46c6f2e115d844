package cli_test

import (
	"context"
	"encoding/json"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/internal/wasmtest"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
)

// traceLine returns the line of a waterfall that holds label, failing
// the test when none does.
func traceLine(t *testing.T, out, label string) string {
	t.Helper()
	for l := range strings.Lines(out) {
		if strings.Contains(l, label) {
			return l
		}
	}
	t.Fatalf("no line with %q in the waterfall:\n%s", label, out)
	return ""
}

// indent is the column where label starts in its line: the span column
// starts at one column on every line, so deeper spans start further.
// Columns, not bytes: a duration such as 675µs is wider in bytes.
func indent(t *testing.T, out, label string) int {
	t.Helper()
	l := traceLine(t, out, label)
	return utf8.RuneCountInString(l[:strings.Index(l, label)])
}

// TestTrace runs a real daemon (SQLite, WebSocket, a tool in wazero, a
// scripted model): `keel trace --follow` of a run waiting for
// an approval exits with the run's code once the call is approved and
// the run ends, printing the final waterfall (spans indented by depth,
// the critical path marked, no terminal codes in a pipe); a DAG run's
// sub-agent runs are nested under the plan steps they carry out, down
// to --depth levels; --json gives the tree.
func TestTrace(t *testing.T) {
	t.Parallel()
	p := scripted.ByGoal(nil, func(goal string) []scripted.Step {
		if goal == "count words" {
			return []scripted.Step{
				scripted.CallTools(keel.ToolCall{ID: "c1", Name: "tally", Arguments: json.RawMessage(`{"text":"one two three"}`)}),
				scripted.Answer("three words"),
			}
		}
		return []scripted.Step{scripted.Repeat(scripted.Answer("done"))}
	})
	d := startDaemon(t, daemon.Config{RequireApproval: []keel.SideEffect{keel.SideEffectReadOnly}}, p,
		map[string]string{
			filepath.Join("tools", "tally.wasm"):          string(wasmtest.CannedReactor(`{"output":{"words":3}}`)),
			filepath.Join("tools", "tally.manifest.json"): tallyManifest,
		})
	bg := context.Background()

	out, errs, code := d.keel(bg, "run", "--detach", "count words")
	if code != cli.ExitOK {
		t.Fatalf("keel run --detach: exit %d, stderr %q", code, errs)
	}
	id := keel.RunID(strings.TrimSpace(out))
	if _, err := d.c.Subscribe(bg, id, 0); err != nil {
		t.Fatal(err)
	}
	for ev := range d.c.Events() {
		if ev.RunID == id && ev.Type == keel.EventApprovalAsked {
			break
		}
	}

	// --follow, stdout a pipe: it says on stderr that it follows, then
	// prints the waterfall once, when the run ends.
	stdout, stderr := newWatchWriter("\x00"), newWatchWriter("following run "+string(id))
	done := make(chan int, 1)
	go func() {
		done <- cli.Main(bg, []string{"trace", "--follow", "--width", "140", string(id), "--data-dir", d.dir}, stdout, stderr)
	}()
	wait(t, stderr.seen, "keel trace --follow says it follows")
	if s := stdout.String(); s != "" {
		t.Fatalf("keel trace --follow printed before the run ended:\n%s", s)
	}
	if _, errs, code := d.keel(bg, "approve", string(id), "c1"); code != cli.ExitOK {
		t.Fatalf("keel approve: exit %d, stderr %q", code, errs)
	}
	if code := wait(t, done, "keel trace --follow exits when the run ends"); code != cli.ExitOK {
		t.Fatalf("keel trace --follow: exit %d, want %d\n%s%s", code, cli.ExitOK, stdout, stderr)
	}
	agent := stdout.String()
	if strings.Contains(agent, "\x1b") {
		t.Errorf("keel trace --follow into a pipe wrote terminal codes:\n%q", agent)
	}
	if !strings.HasPrefix(agent, "run "+string(id)+" (agent, succeeded): 7 spans") {
		t.Errorf("waterfall's summary = %q, want the run, its status and 7 spans", strings.SplitN(agent, "\n", 2)[0])
	}
	runAt, step1At, waitAt, toolAt := indent(t, agent, "run agent "+string(id)), indent(t, agent, "step 1"), indent(t, agent, "human.wait approve tally"), indent(t, agent, "tool.call tally")
	if !(runAt < step1At && step1At < waitAt && waitAt == toolAt) {
		t.Errorf("spans not indented by depth (run %d, step %d, wait %d, tool %d):\n%s", runAt, step1At, waitAt, toolAt, agent)
	}
	if l := strings.TrimSpace(traceLine(t, agent, "tool.call tally")); !strings.HasSuffix(l, " ok") || !strings.Contains(l, "=") {
		t.Errorf("tool call line = %q, want a bar and ok", l)
	}
	// The critical path: the run, its last step, that step's model call.
	for label, critical := range map[string]bool{"run agent": true, "step 2": true, "step 1": false, "tool.call tally": false} {
		if got := strings.HasPrefix(traceLine(t, agent, label), "*"); got != critical {
			t.Errorf("%s marked critical: %v, want %v\n%s", label, got, critical, agent)
		}
	}
	if first, second := traceLine(t, agent, "model.call"), traceLine(t, agent[strings.Index(agent, "step 2"):], "model.call"); strings.HasPrefix(first, "*") || !strings.HasPrefix(second, "*") {
		t.Errorf("critical path: want step 2's model call on it, not step 1's:\n%s", agent)
	}

	// A DAG run: each step's sub-agent run under the step's span.
	dag, err := d.c.StartRun(bg, protocol.RunStartParams{Goal: "count and report", Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{
		{ID: "count", Goal: "count the words"},
		{ID: "report", Goal: "report the count", DependsOn: []string{"count"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	// --follow of a run that is (or soon is) over: it ends with the run.
	out, errs, code = d.keel(bg, "trace", "--follow", "--width", "140", string(dag.ID))
	if code != cli.ExitOK {
		t.Fatalf("keel trace --follow DAG: exit %d, stderr %q\n%s", code, errs, out)
	}
	count, report := string(dag.ID)+".count.1", string(dag.ID)+".report.1"
	stepAt, subAt := indent(t, out, "step count"), indent(t, out, "run agent "+count)
	if !(indent(t, out, "run dag "+string(dag.ID)) < stepAt && stepAt < subAt) {
		t.Errorf("sub-agent %s not nested under its step:\n%s", count, out)
	}
	if !strings.HasPrefix(traceLine(t, out, "run agent "+report), "*") || strings.HasPrefix(traceLine(t, out, "run agent "+count), "*") {
		t.Errorf("critical path: want it through the report step's sub-agent (it ends last), not the count step's:\n%s", out)
	}
	if !strings.Contains(out, "with 2 sub-agent runs") {
		t.Errorf("summary does not count the sub-agent runs:\n%s", out)
	}

	// --depth 0: the run alone, saying what it left out.
	out, _, code = d.keel(bg, "trace", "--depth", "0", string(dag.ID))
	if code != cli.ExitOK || strings.Contains(out, "run agent") || !strings.Contains(out, "2 sub-agent runs not shown") {
		t.Errorf("keel trace --depth 0: exit %d, want the DAG run alone and a note of 2 runs not shown:\n%s", code, out)
	}

	// --json: the same tree, with offsets and the critical flags.
	out, _, code = d.keel(bg, "trace", "--json", string(dag.ID))
	var tree struct {
		Run   keel.Run `json:"run"`
		Roots []*jsonNode
	}
	if err := json.Unmarshal([]byte(out), &tree); code != cli.ExitOK || err != nil || len(tree.Roots) != 1 {
		t.Fatalf("keel trace --json: exit %d, %v, %d roots; want one\n%s", code, err, len(tree.Roots), out)
	}
	var kinds []string
	critical := map[string]bool{}
	var walk func(n *jsonNode, depth int)
	walk = func(n *jsonNode, depth int) {
		label := string(n.Span.Kind) + "@" + strings.TrimPrefix(string(n.Span.RunID), string(dag.ID))
		if n.Span.RunID != dag.ID {
			kinds = append(kinds, strings.Repeat(">", depth)+label)
		}
		if n.Span.Kind == keel.SpanRun {
			critical[label] = n.Critical
		}
		if n.OffsetNS < 0 {
			t.Errorf("node %s: offset %d", label, n.OffsetNS)
		}
		for _, c := range n.Children {
			walk(c, depth+1)
		}
	}
	walk(tree.Roots[0], 0)
	if got, want := strings.Join(kinds, " "), ">>run@.count.1 >>>step@.count.1 >>>>model.call@.count.1 >>run@.report.1 >>>step@.report.1 >>>>model.call@.report.1"; got != want {
		t.Errorf("keel trace --json: sub-agent spans %s\nwant %s", got, want)
	}
	if want := map[string]bool{"run@": true, "run@.count.1": false, "run@.report.1": true}; !maps.Equal(critical, want) {
		t.Errorf("keel trace --json: run spans critical %v, want %v", critical, want)
	}

	// Bad input.
	if _, errs, code := d.keel(bg, "trace", "run_nope"); code != cli.ExitFailure || errs == "" {
		t.Errorf("keel trace run_nope: exit %d, stderr %q; want %d and why", code, errs, cli.ExitFailure)
	}
	if _, errs, code := d.keel(bg, "trace", "--width", "-1", string(id)); code != cli.ExitUsage {
		t.Errorf("keel trace --width -1: exit %d, stderr %q; want %d", code, errs, cli.ExitUsage)
	}
}

// jsonNode is a node of keel trace --json.
type jsonNode struct {
	Span     keel.Span   `json:"span"`
	OffsetNS int64       `json:"offset_ns"`
	Critical bool        `json:"critical"`
	Children []*jsonNode `json:"children"`
}

// tallyManifest is the sidecar manifest of the tally tool: read only, so
// a daemon started with --require-approval read_only asks for each call.
const tallyManifest = `{"name":"tally","description":"Count words.","side_effects":"read_only",
"input_schema":{"type":"object","properties":{"text":{"type":"string"}}}}`
