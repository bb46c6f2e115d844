package daemon_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestDAGRunOverProtocol: a DAG run started over the real WebSocket runs
// its steps as sub-agents and succeeds; an invalid plan is refused as
// invalid params; `keel show` prints the run's kind and plan, and a
// sub-agent's parent; `keel run --dag FILE` runs a plan file.
func TestDAGRunOverProtocol(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil, scripted.Repeat(scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
		first, _, _ := strings.Cut(scripted.Goal(req), "\n")
		return models.ChatResponse{Message: models.Message{Content: "did: " + first}}, nil
	})))
	d := startDaemon(t, daemon.Config{DataDir: withTools(t, "wordcount"), Provider: p})
	c := dial(t, d.dir)
	ctx := context.Background()

	_, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "loop", Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{
		{ID: "a", Goal: "x", DependsOn: []string{"b"}}, {ID: "b", Goal: "y", DependsOn: []string{"a"}}}}})
	if pe := wantCode(t, err, protocol.CodeInvalidParams, "start a cyclic DAG"); !strings.Contains(pe.Message, "cycle") {
		t.Errorf("message %q does not name the cycle", pe.Message)
	}

	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "count and report", Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{
		{ID: "count", Goal: "count the words", Tools: []string{"wordcount"}},
		{ID: "report", Goal: "report the count", DependsOn: []string{"count"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if run.Kind != keel.KindDAG {
		t.Errorf("run.start result kind = %q, want dag", run.Kind)
	}
	evs := follow(t, c, run.ID)
	if last := evs[len(evs)-1]; last.Type != keel.EventRunSucceeded {
		t.Fatalf("run ended with %s: %s", last.Type, last.Data)
	}
	detail, err := c.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if detail.Run.Result != "[report]\ndid: report the count" {
		t.Errorf("result = %q, want the sink's result", detail.Run.Result)
	}

	out, errs, code := runCLI(ctx, d.dir, "show", string(run.ID))
	child := string(run.ID) + ".report.1"
	for _, want := range []string{"kind    dag", "plan revision 0, 2 steps", "count", "wordcount", child, "step  ← report succeeded"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("keel show: code %d, want %q in\n%s%s", code, want, out, errs)
		}
	}
	out, _, code = runCLI(ctx, d.dir, "show", child)
	if code != 0 || !strings.Contains(out, "kind    agent") || !strings.Contains(out, "parent  "+string(run.ID)+" (step report)") {
		t.Errorf("keel show of the sub-agent: code %d\n%s", code, out)
	}

	file := filepath.Join(t.TempDir(), "plan.json")
	if err := os.WriteFile(file, []byte(`{"steps":[{"id":"one","goal":"first"},{"id":"two","goal":"second","depends_on":["one"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errs, code = runCLI(ctx, d.dir, "run", "--dag", file, "two steps")
	if code != cli.ExitOK || !strings.Contains(out, "plan revision 0: 2 steps") || !strings.Contains(out, "[two]\ndid: second") {
		t.Errorf("keel run --dag: code %d\n%s%s", code, out, errs)
	}
	if _, errs, code = runCLI(ctx, d.dir, "run", "--dag", file, "--plan", "both"); code != cli.ExitUsage {
		t.Errorf("keel run --dag --plan: code %d, want usage error\n%s", code, errs)
	}
}
