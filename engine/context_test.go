package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
)

// TestContextSummarized: when a run's steps outgrow the model's context,
// the older ones are summarized by the model into one message, journaled
// before the step that needed it, the recent steps are kept, every
// request fits, and a replay rebuilds the same events without asking for
// a summary.
func TestContextSummarized(t *testing.T) {
	t.Parallel()
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

// dumpTools has one read-only tool, dump, whose output is n bytes opening
// with tag: a big result from a small call.
type dumpTools struct{}

func (dumpTools) Specs(context.Context) []keel.ToolSpec {
	return []keel.ToolSpec{{Name: "dump", Description: "returns n bytes", SideEffects: keel.SideEffectReadOnly,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"},"tag":{"type":"string"}},"required":["n","tag"]}`)}}
}

func (dumpTools) Call(_ context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	input := inv.Args
	var in struct {
		N   int    `json:"n"`
		Tag string `json:"tag"`
	}
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, &keel.ToolError{Code: keel.ToolInvalidInput, Message: err.Error()}
	}
	return json.Marshal(map[string]string{"out": in.Tag + " " + strings.Repeat("z ", max(in.N-len(in.Tag)-12, 0)/2)})
}

func dump(n int, tag string) models.ChatResponse {
	return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{Name: "dump",
		Arguments: json.RawMessage(fmt.Sprintf(`{"n":%d,"tag":%q}`, n, tag))}}}}
}

// tokenizer stands for a model whose tokenizer counts ratio times
// models.EstimateTokens and which, like Ollama with truncate false,
// refuses a prompt over its context instead of cutting it. It reports
// that count as the prompt tokens, answers summary requests itself and
// the steps with step (their 1-based index).
type tokenizer struct {
	ratio  float64
	ctxLen int
	step   func(i int, req models.ChatRequest) (models.ChatResponse, error)

	mu       sync.Mutex
	steps    []models.ChatRequest
	counts   []int // the prompt count of every call
	refused  int
	summarys int
}

func (tk *tokenizer) answer(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
	n := int(tk.ratio * float64(models.EstimateTokens(req.Messages, req.Tools)))
	tk.mu.Lock()
	if n > tk.ctxLen {
		tk.refused++
		tk.mu.Unlock()
		return models.ChatResponse{}, &models.Error{Kind: models.KindContextTooLong, Msg: fmt.Sprintf("the input length exceeds the context length (%d > %d)", n, tk.ctxLen)}
	}
	tk.counts = append(tk.counts, n)
	for _, m := range req.Messages {
		if strings.Contains(m.Content, "Summarize the following text") {
			tk.summarys++
			tk.mu.Unlock()
			return models.ChatResponse{Message: models.Message{Content: fmt.Sprintf("SUMMARY-%d", tk.summarys)}, Usage: models.Usage{PromptTokens: n, CompletionTokens: 3}}, nil
		}
	}
	tk.steps = append(tk.steps, req)
	i := len(tk.steps)
	tk.mu.Unlock()
	resp, err := tk.step(i, req)
	resp.Usage = models.Usage{PromptTokens: n, CompletionTokens: 5}
	return resp, err
}

func (tk *tokenizer) provider() *scripted.Provider {
	model := scripted.DefaultModel
	model.ContextLength = tk.ctxLen
	return scripted.New([]models.ModelInfo{model}, scripted.Repeat(scripted.ReplyFunc(tk.answer)))
}

// stepText is the content of the messages of a step request.
func stepText(req models.ChatRequest) string {
	var b strings.Builder
	for _, m := range req.Messages {
		b.WriteString(m.Content + "\n")
	}
	return b.String()
}

func fitHarness(t *testing.T, m engine.Model) (*store.Store, *engine.Engine) {
	t.Helper()
	st, err := openDB(context.Background(), filepath.Join(t.TempDir(), "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Store: st, Model: m, Tools: dumpTools{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		eng.Close(context.Background())
		st.Close()
	})
	return st, eng
}

// TestContextFitCalibrated: a model whose tokenizer counts twice the
// estimate gets steps that fit by its own count, learnt from the prompt
// tokens it reports, and summarized when they would not; nothing is
// refused, nothing is cut by the model.
func TestContextFitCalibrated(t *testing.T) {
	t.Parallel()
	tk := &tokenizer{ratio: 2, ctxLen: 2048, step: func(i int, _ models.ChatRequest) (models.ChatResponse, error) {
		if i <= 8 {
			return dump(600, fmt.Sprintf("R%d", i)), nil
		}
		return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
	}}
	st, eng := fitHarness(t, tk.provider())
	run, err := eng.Start(context.Background(), engine.StartRequest{Goal: "dump a lot", MaxSteps: 12})
	if err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng, st, run.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	tk.mu.Lock()
	defer tk.mu.Unlock()
	if tk.summarys == 0 || tk.refused > 1 {
		t.Errorf("%d summaries, %d prompts refused; want summaries and at most one refusal (before the first count)", tk.summarys, tk.refused)
	}
	for i, n := range tk.counts {
		if n > tk.ctxLen {
			t.Errorf("call %d: prompt of %d tokens over the context of %d", i+1, n, tk.ctxLen)
		}
	}
	replayMatches(t, eng, st, run.ID)
}

// TestContextKeepsNewestResult: when the newest tool result is over
// half the room, older steps are summarized and the newest result is
// kept verbatim; when it alone is over the room, it is cut with a note,
// and a fork rebuilds the same context from the journal.
func TestContextKeepsNewestResult(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		big  int // bytes of the third result
		cut  bool
	}{
		{"over half the room", 1800, false},
		{"over the room", 4000, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tk := &tokenizer{ratio: 1, ctxLen: 1200, step: func(i int, _ models.ChatRequest) (models.ChatResponse, error) {
				switch i {
				case 1, 2:
					return dump(300, fmt.Sprintf("R%d", i)), nil
				case 3:
					return dump(tt.big, "R3"), nil
				}
				return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
			}}
			st, eng := fitHarness(t, tk.provider())
			ctx := context.Background()
			run, err := eng.Start(ctx, engine.StartRequest{Goal: "dump", MaxSteps: 6})
			if err != nil {
				t.Fatal(err)
			}
			if r := waitRun(t, eng, st, run.ID); r.Status != keel.RunSucceeded {
				t.Fatalf("run = %s %q", r.Status, r.Error)
			}
			tk.mu.Lock()
			last := tk.steps[3]
			tk.mu.Unlock()
			text := stepText(last)
			var r3 string
			for _, m := range last.Messages {
				if m.Role == models.RoleTool {
					r3 = m.Content
				}
			}
			full, _ := dumpTools{}.Call(ctx, keel.ToolInvocation{Name: "dump", Args: json.RawMessage(fmt.Sprintf(`{"n":%d,"tag":"R3"}`, tt.big))})
			switch {
			case !strings.Contains(text, "SUMMARY-"):
				t.Errorf("step 4 reads no summary of the older steps:\n%.400s", text)
			case strings.Contains(text, `"out":"R1`):
				t.Errorf("step 4 reads step 1's result verbatim; it should be summarized")
			case !tt.cut && r3 != string(full):
				t.Errorf("step 4 reads the newest result as %.120q…, want it verbatim", r3)
			case tt.cut && (!strings.HasPrefix(r3, `{"out":"R3 z z`) || !strings.Contains(r3, "was cut to fit the model's context")):
				t.Errorf("step 4 reads the newest result as %.120q … %.120q; want its start and a note", r3, r3[max(0, len(r3)-120):])
			}
			for i, req := range tk.steps {
				if n := models.EstimateTokens(req.Messages, req.Tools); n > tk.ctxLen {
					t.Errorf("step %d is %d tokens, over the context of %d", i+1, n, tk.ctxLen)
				}
			}
			replayMatches(t, eng, st, run.ID)

			// A fork after step 3 rebuilds step 4's context from the
			// journal, summary and cut included.
			fork, err := eng.Fork(ctx, engine.ForkRequest{From: run.ID, Step: 3})
			if err != nil {
				t.Fatal(err)
			}
			if r := waitRun(t, eng, st, fork.ID); r.Status != keel.RunSucceeded {
				t.Fatalf("fork = %s %q", r.Status, r.Error)
			}
			tk.mu.Lock()
			again := stepText(tk.steps[len(tk.steps)-1])
			tk.mu.Unlock()
			if again != text {
				t.Errorf("the fork's step reads\n%.600s\nthe original's\n%.600s", again, text)
			}
		})
	}
}

// TestContextFitCountsHumanMessages: what a person ran and said during a
// take-over counts in the fit: older steps are summarized so that it
// fits, instead of the step going over the model's context.
func TestContextFitCountsHumanMessages(t *testing.T) {
	t.Parallel()
	release, third := make(chan struct{}), make(chan struct{})
	tk := &tokenizer{ratio: 1, ctxLen: 1200, step: func(i int, _ models.ChatRequest) (models.ChatResponse, error) {
		switch i {
		case 1, 2:
			return dump(600, fmt.Sprintf("R%d", i)), nil
		case 3:
			close(third)
			<-release
			return dump(30, "R3"), nil
		}
		return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
	}}
	st, eng := fitHarness(t, tk.provider())
	ctx := context.Background()
	run, err := eng.Start(ctx, engine.StartRequest{Goal: "dump", MaxSteps: 6})
	if err != nil {
		t.Fatal(err)
	}
	// The third model call has started when its step func runs: no event
	// follows it until release, so wait on the call itself.
	select {
	case <-third:
	case <-time.After(30 * time.Second):
		t.Fatal("the third model call did not start in 30s")
	}
	if _, err := eng.TakeOver(ctx, run.ID, "let me"); err != nil {
		t.Fatal(err)
	}
	close(release)
	if r := waitRun(t, eng, st, run.ID); r.Status != keel.RunPaused {
		t.Fatalf("after take over: %s %q", r.Status, r.Error)
	}
	if _, err := eng.RunTool(ctx, run.ID, "dump", json.RawMessage(`{"n":2100,"tag":"BYHAND"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.HandBack(ctx, run.ID, "use my dump"); err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng, st, run.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("after hand back: %s %q", r.Status, r.Error)
	}
	tk.mu.Lock()
	defer tk.mu.Unlock()
	text := stepText(tk.steps[len(tk.steps)-1])
	for _, want := range []string{"SUMMARY-", "BYHAND", "use my dump", `"out":"R3`} {
		if !strings.Contains(text, want) {
			t.Errorf("the step after the hand-back does not read %q:\n%.600s", want, text)
		}
	}
	if tk.refused > 0 {
		t.Errorf("%d prompts went over the model's context", tk.refused)
	}
}

// TestContextFitOnRoute: a run on a route fits its context to the
// context length of the target the route chose.
func TestContextFitOnRoute(t *testing.T) {
	t.Parallel()
	tk := &tokenizer{ratio: 1, ctxLen: 1200, step: func(i int, _ models.ChatRequest) (models.ChatResponse, error) {
		if i <= 6 {
			return dump(600, fmt.Sprintf("R%d", i)), nil
		}
		return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
	}}
	r, err := models.NewRouter(models.RouterConfig{
		Providers: map[string]models.ProviderConfig{"scripted": {Provider: tk.provider(), MaxRetries: -1}},
		Routes:    []models.Route{{Name: "small", Targets: []models.Target{{Provider: "scripted", Model: "scripted"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	st, eng := fitHarness(t, r)
	run, err := eng.Start(context.Background(), engine.StartRequest{Goal: "dump", Model: "small", MaxSteps: 10})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, run.ID); got.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", got.Status, got.Error)
	}
	if n := len(eventsOf(t, st, run.ID, keel.EventContextSummary)); n == 0 {
		t.Errorf("no context.summarized: a run on a route was not fitted")
	}
}
