package daemon_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// traceTree renders a trace as kind/status(children...), children in
// start order (the order run.get gives), and fails the test unless it
// is one tree under one root span of kind run.
func traceTree(t *testing.T, spans []keel.Span) string {
	t.Helper()
	in := map[string]bool{}
	for _, sp := range spans {
		in[sp.ID] = true
	}
	kids := map[string][]keel.Span{}
	var roots []keel.Span
	for _, sp := range spans {
		switch {
		case sp.Kind == keel.SpanRun:
			roots = append(roots, sp)
		case !in[sp.ParentID]:
			t.Errorf("span %s (%s) has parent %q, which is not in the trace", sp.ID, sp.Kind, sp.ParentID)
		default:
			kids[sp.ParentID] = append(kids[sp.ParentID], sp)
		}
	}
	if len(roots) != 1 {
		t.Fatalf("trace has %d root spans, want 1: %+v", len(roots), spans)
	}
	var render func(sp keel.Span) string
	render = func(sp keel.Span) string {
		s := string(sp.Kind) + "/" + string(sp.Status)
		var parts []string
		for _, c := range kids[sp.ID] {
			parts = append(parts, render(c))
		}
		if len(parts) > 0 {
			s += "(" + strings.Join(parts, " ") + ")"
		}
		return s
	}
	return render(roots[0])
}

// TestTraceOverProtocol: run.get gives a run's trace as a tree (span
// parent_id): a run whose tool call waited for an approval has its model
// call, the wait and the tool call under their step, under the run's
// root; `keel show` indents each span under its parent. A DAG run's
// trace has a root and a step span per sub-agent, whose root span names
// that step span as parent.
func TestTraceOverProtocol(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil,
		scripted.CallTools(keel.ToolCall{ID: "c1", Name: "wordcount", Arguments: json.RawMessage(`{"text":"one two three"}`)}),
		scripted.Repeat(scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
			return models.ChatResponse{Message: models.Message{Content: "counted"}}, nil
		})),
	)
	d := startDaemon(t, daemon.Config{DataDir: withTools(t, "wordcount"), Provider: p, RequireApproval: []keel.SideEffect{keel.SideEffectReadOnly}})
	c := dial(t, d.dir)
	ctx := context.Background()
	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "count"})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(t, d.dir, run.ID, keel.EventApprovalAsked)
	if out, errOut, code := runCLI(ctx, d.dir, "approve", string(run.ID), "c1"); code != 0 {
		t.Fatalf("keel approve = %d: %s%s", code, out, errOut)
	}
	follow(t, c, run.ID)
	det, err := c.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	const want = "run/ok(step/ok(model.call/ok human.wait/ok tool.call/ok) step/ok(model.call/ok))"
	if got := traceTree(t, det.Spans); got != want {
		t.Errorf("trace over the protocol = %s, want %s", got, want)
	}
	for _, sp := range det.Spans {
		if sp.Kind == keel.SpanModelCall && (len(sp.TemplateHash) != 16 || len(sp.PromptHash) != 16) {
			t.Errorf("model span %s: prompt template hash %q, prompt hash %q; want 16 hex digits each", sp.ID, sp.TemplateHash, sp.PromptHash)
		}
	}
	out, errs, code := runCLI(ctx, d.dir, "show", string(run.ID))
	if code != 0 {
		t.Fatalf("keel show = %d: %s", code, errs)
	}
	_, trace, _ := strings.Cut(out, "\ntrace (")
	var kinds []string
	for line := range strings.Lines(trace) {
		if f := strings.Fields(line); len(f) > 2 && f[0] != "STEP" {
			// The kind column, indented by depth: what precedes it in the
			// line after the step number and its padding.
			at := strings.Index(line, f[1])
			kinds = append(kinds, strings.TrimLeft(line[:at], "0123456789")+f[1])
		}
	}
	indents := map[string]int{}
	for _, k := range kinds {
		kind := strings.TrimSpace(k)
		indents[kind] = len(k) - len(kind)
	}
	if !(indents["run"] < indents["step"] && indents["step"] < indents["model.call"] &&
		indents["model.call"] == indents["tool.call"] && indents["tool.call"] == indents["human.wait"]) {
		t.Errorf("keel show does not indent spans by depth (indents %v):\n%s", indents, trace)
	}

	dag, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "count and report", Kind: keel.KindDAG, Plan: &keel.Plan{Steps: []keel.PlanStep{
		{ID: "count", Goal: "count the words"},
		{ID: "report", Goal: "report the count", DependsOn: []string{"count"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if evs := follow(t, c, dag.ID); evs[len(evs)-1].Type != keel.EventRunSucceeded {
		t.Fatalf("DAG run ended with %s", evs[len(evs)-1].Type)
	}
	det, err = c.GetRun(ctx, dag.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := traceTree(t, det.Spans), "run/ok(step/ok step/ok)"; got != want {
		t.Errorf("DAG run's trace = %s, want %s", got, want)
	}
	for _, step := range []string{"count", "report"} {
		child := keel.RunID(string(dag.ID) + "." + step + ".1")
		i := slices.IndexFunc(det.Spans, func(sp keel.Span) bool { return sp.Kind == keel.SpanStep && sp.Name == step })
		if i < 0 || !strings.Contains(string(det.Spans[i].Attrs), string(child)) {
			t.Fatalf("no step span of %q naming sub-agent %s: %+v", step, child, det.Spans)
		}
		cd, err := c.GetRun(ctx, child)
		if err != nil {
			t.Fatal(err)
		}
		traceTree(t, cd.Spans)
		if root := cd.Spans[slices.IndexFunc(cd.Spans, func(sp keel.Span) bool { return sp.Kind == keel.SpanRun })]; root.ParentID != det.Spans[i].ID {
			t.Errorf("root span of %s has parent %q, want the DAG run's step span %s", child, root.ParentID, det.Spans[i].ID)
		}
	}
}

// TestTraceRealOllamaDigest: against the real Ollama, a model span
// carries the digest /api/tags reports for the model, and the hashes of
// keel's system prompt and of the whole prompt.
func TestTraceRealOllamaDigest(t *testing.T) {
	t.Parallel()
	p := realOllama(t)
	host := os.Getenv("OLLAMA_HOST")
	model := envOr("KEEL_TEST_OLLAMA_MODEL", "keel-tiny")
	ctx := context.Background()
	// Short replies keep the test quick on a busy machine: the tiny
	// model may go on to its context's end.
	dir := noTools(t)
	writeModelsConfig(t, dir, map[string]any{"ollama": map[string]any{"default_max_tokens": 64}})
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: p})
	c := dial(t, d.dir)
	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "Say hello.", Model: model, MaxSteps: 1})
	if err != nil {
		t.Fatal(err)
	}
	follow(t, c, run.ID)
	det, err := c.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}

	if !strings.Contains(host, "://") {
		host = "http://" + host
	}
	resp, err := http.Get(host + "/api/tags")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tags struct {
		Models []struct {
			Name   string `json:"name"`
			Digest string `json:"digest"`
		} `json:"models"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&tags); err != nil {
		t.Fatal(err)
	}
	digest := ""
	for _, m := range tags.Models {
		if m.Name == model || m.Name == model+":latest" {
			digest = m.Digest
		}
	}
	if digest == "" {
		t.Fatalf("/api/tags lists no %s: %+v", model, tags.Models)
	}
	template, _ := models.PromptHashes(models.ChatRequest{Messages: []models.Message{{Role: models.RoleSystem, Content: engine.DefaultSystemPrompt}}})
	n := 0
	for _, sp := range det.Spans {
		if sp.Kind != keel.SpanModelCall {
			continue
		}
		n++
		if sp.ModelDigest != digest || sp.TemplateHash != template || len(sp.PromptHash) != 16 {
			t.Errorf("model span: digest %q, prompt template hash %q, prompt hash %q; want digest %q (from /api/tags), template hash %q and a prompt hash",
				sp.ModelDigest, sp.TemplateHash, sp.PromptHash, digest, template)
		}
	}
	if n == 0 {
		t.Errorf("no model span in %+v", det.Spans)
	}
}
