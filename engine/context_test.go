package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestContextSummarized: when a run's steps outgrow the model's context,
// the older ones are summarized by the model into one message, journaled
// before the step that needed it, the recent steps are kept, every
// request fits, and a replay rebuilds the same events without asking for
// a summary.
func TestContextSummarized(t *testing.T) {
	const ctxLen = 1200 // tokens; each echo result is ~340
	big := strings.Repeat("lorem ipsum ", 85)
	var mu sync.Mutex
	var stepRequests []models.ChatRequest
	summaries := 0
	model := scripted.DefaultModel
	model.ContextLength = ctxLen
	p := scripted.New([]models.ModelInfo{model}, scripted.Repeat(scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range req.Messages {
			if strings.Contains(m.Content, "Summarize the following text") {
				summaries++
				return models.ChatResponse{Message: models.Message{Content: fmt.Sprintf("SUMMARY-%d: echoed three times", summaries)}}, nil
			}
		}
		stepRequests = append(stepRequests, req)
		if n := len(stepRequests); n <= 6 {
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: fmt.Sprintf("c%d", n), Name: "echo",
				Arguments: json.RawMessage(fmt.Sprintf(`{"text":"%d %s"}`, n, big))}}}}, nil
		}
		return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
	})))
	st, eng, _ := resumeHarness(t, p)
	ctx := context.Background()
	run, err := eng.Start(ctx, engine.StartRequest{Goal: "echo a lot", MaxSteps: 10})
	if err != nil {
		t.Fatal(err)
	}
	r := waitRun(t, eng, st, run.ID)
	if r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	sums := eventsOf(t, st, run.ID, keel.EventContextSummary)
	if len(sums) == 0 || summaries < len(sums) {
		t.Fatalf("%d context.summarized events and %d summary calls; want at least one, each made by the model", len(sums), summaries)
	}
	var d keel.ContextSummaryData
	_ = json.Unmarshal(sums[0].Data, &d)
	if d.Messages < 2 || d.TokensAfter >= d.TokensBefore || !strings.HasPrefix(d.Summary, "SUMMARY-") {
		t.Errorf("first summary = %+v", d)
	}
	for i, req := range stepRequests {
		if n := models.EstimateTokens(req.Messages, req.Tools); n > ctxLen {
			t.Errorf("step request %d is %d tokens, over the context of %d", i+1, n, ctxLen)
		}
	}
	last := stepRequests[len(stepRequests)-1]
	all := ""
	for _, m := range last.Messages {
		all += m.Content + "\n"
	}
	if !strings.Contains(all, "SUMMARY-") || strings.Contains(all, `"echoed":"1 lorem`) || !strings.Contains(all, "echo a lot") {
		t.Errorf("the last request should keep the goal, hold a summary and not step 1's result:\n%.600s", all)
	}
	spans, _ := st.Spans(ctx, run.ID)
	var sumSpans int
	for _, sp := range spans {
		if sp.Kind == keel.SpanSummarize {
			sumSpans++
		}
	}
	if sumSpans != len(sums) {
		t.Errorf("%d summarize spans for %d summaries", sumSpans, len(sums))
	}
	before := summaries
	replayMatches(t, eng, st, run.ID)
	if summaries != before {
		t.Errorf("the replay asked for %d summaries", summaries-before)
	}

	// A fork from step 6 rebuilds the context from the journal (its
	// summaries included): its model sees what step 7 saw.
	fork, err := eng.Fork(ctx, engine.ForkRequest{From: run.ID, Step: 6})
	if err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng, st, fork.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("fork = %s %q", r.Status, r.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stepRequests) != 8 {
		t.Fatalf("%d step requests, want 8", len(stepRequests))
	}
	a, b := stepRequests[6].Messages, stepRequests[7].Messages
	if len(a) != len(b) {
		t.Fatalf("the rebuilt context has %d messages, the original %d", len(b), len(a))
	}
	for i := range a {
		if a[i].Content != b[i].Content || a[i].Role != b[i].Role {
			t.Errorf("message %d differs: %s %.80q vs %s %.80q", i, a[i].Role, a[i].Content, b[i].Role, b[i].Content)
		}
	}
}
