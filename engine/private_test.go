package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// privateEcho is echoTools whose echo reads a directory marked private.
type privateEcho struct{ *echoTools }

func (privateEcho) ReadsPrivate(name string) bool { return name == "echo" }

// TestPrivateToolMakesRunPrivate: once a tool that reads private data
// returned, every later request of the run is private, the summaries of
// older steps included (the context is small, so they are summarized);
// the first step, before the read, is not. The journal marks the result
// private, so a replay and a fork from a later step agree.
func TestPrivateToolMakesRunPrivate(t *testing.T) {
	t.Parallel()
	const ctxLen = 1200 // tokens; each echo result is ~340
	big := strings.Repeat("lorem ipsum ", 85)
	var mu sync.Mutex
	type seen struct {
		summary bool
		private bool
	}
	var reqs []seen
	steps := 0
	model := scripted.DefaultModel
	model.ContextLength = ctxLen
	p := scripted.New([]models.ModelInfo{model}, scripted.Repeat(scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		summary := strings.Contains(req.Messages[0].Content, "Summarize the following text")
		reqs = append(reqs, seen{summary: summary, private: req.IsPrivate()})
		if summary {
			return models.ChatResponse{Message: models.Message{Content: "SUMMARY: echoed"}}, nil
		}
		steps++
		if steps <= 5 {
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: fmt.Sprintf("c%d", steps), Name: "echo",
				Arguments: json.RawMessage(fmt.Sprintf(`{"text":"%d %s"}`, steps, big))}}}}, nil
		}
		return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
	})))
	st, err := openDB(context.Background(), filepath.Join(t.TempDir(), "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Store: st, Model: p, Tools: privateEcho{&echoTools{}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		eng.Close(context.Background())
		st.Close()
	})
	ctx := context.Background()
	run, err := eng.Start(ctx, engine.StartRequest{Goal: "echo a lot", MaxSteps: 10, Policy: keel.RunPolicy{AllowCloud: true}})
	if err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng, st, run.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	mu.Lock()
	summaries := 0
	for i, r := range reqs {
		if r.summary {
			summaries++
		}
		if want := i > 0; r.private != want {
			t.Errorf("request %d (summary %v) private = %v, want %v", i+1, r.summary, r.private, want)
		}
	}
	n := len(reqs)
	mu.Unlock()
	if summaries == 0 {
		t.Fatal("no summary was asked for; the test needs one")
	}
	for _, ev := range eventsOf(t, st, run.ID, keel.EventToolResult) {
		if !strings.Contains(string(ev.Data), `"private":true`) {
			t.Errorf("tool result %.80s is not marked private", ev.Data)
		}
	}
	replayMatches(t, eng, st, run.ID)

	// A fork from step 3 starts private: its first request is.
	fork, err := eng.Fork(ctx, engine.ForkRequest{From: run.ID, Step: 3})
	if err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng, st, fork.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("fork = %s %q", r.Status, r.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reqs) == n || !reqs[n].private {
		t.Errorf("the fork's first request is not private (%d requests)", len(reqs)-n)
	}
}

// privateFlowTools is flowTools whose echo reads a directory marked
// private.
type privateFlowTools struct{ *flowTools }

func (privateFlowTools) ReadsPrivate(name string) bool { return name == "echo" }

// TestPlanPrivateSubAgent: a sub-agent that reads private data makes its
// parent private: the step that depends on it (whose goal carries its
// result) and the composition of the answer send only private requests.
func TestPlanPrivateSubAgent(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	private := map[string][]bool{} // by step, whether each request was private
	m := &fakeModel{plan: func(int, models.ChatRequest) string {
		return `{"steps":[{"id":"a","goal":"read it","tools":["echo"]},{"id":"b","goal":"use it","depends_on":["a"]}]}`
	}, step: func(_ context.Context, step string, req models.ChatRequest) (models.ChatResponse, error) {
		mu.Lock()
		private[step] = append(private[step], req.IsPrivate())
		mu.Unlock()
		if _, ok := lastTool(req); step == "a" && !ok {
			return callTool("echo"), nil
		}
		return text("result of " + step), nil
	}}
	st, err := openDB(context.Background(), filepath.Join(t.TempDir(), "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Store: st, Model: m.provider(), Tools: privateFlowTools{newFlowTools()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		eng.Close(context.Background())
		st.Close()
	})
	h := &flowHarness{st: st, eng: eng}
	r := h.start(t, engine.StartRequest{Kind: keel.KindPlan, Goal: "answer the question"})
	r = waitRun(t, eng, st, r.ID)
	if r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := private["a"]; len(got) != 2 || got[0] || !got[1] {
		t.Errorf("step a's requests private = %v, want [false true] (before and after the read)", got)
	}
	if got := private["b"]; len(got) == 0 || slices.Contains(got, false) {
		t.Errorf("step b's requests private = %v, want all private", got)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.compose) == 0 {
		t.Fatal("no composition request")
	}
	for i, req := range m.compose {
		if !req.IsPrivate() {
			t.Errorf("composition request %d is not private", i+1)
		}
	}
}
