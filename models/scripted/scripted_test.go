package scripted_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/modelstest"
	"github.com/keel-runtime/keel/models/scripted"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// conformanceReply answers the suite's requests the way a capable model
// would: JSON for a Format, a tool call when tools are offered and no
// result came back yet, else a story.
func conformanceReply(req models.ChatRequest) (models.ChatResponse, error) {
	last := req.Messages[len(req.Messages)-1]
	switch {
	case len(req.Format) > 0:
		return models.ChatResponse{Message: models.Message{Content: `{"ok":true,"count":2}`}}, nil
	case len(req.Tools) > 0 && last.Role != models.RoleTool:
		return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{
			{Name: "lookup", Arguments: json.RawMessage(`{"word":"cat"}`)},
		}}}, nil
	}
	return models.ChatResponse{Message: models.Message{Content: "Once upon a time a cat sat in the sun."}}, nil
}

func TestConformance(t *testing.T) {
	t.Run("New", func(t *testing.T) {
		modelstest.TestProvider(t, scripted.New(nil, scripted.Repeat(scripted.AnswerFunc(conformanceReply))), "scripted")
	})
	t.Run("ByGoal", func(t *testing.T) {
		p := scripted.ByGoal([]models.ModelInfo{{Name: "m", Capabilities: []models.Capability{models.CapCompletion}}},
			func(string) []scripted.Step {
				return []scripted.Step{scripted.Repeat(scripted.AnswerFunc(conformanceReply))}
			})
		modelstest.TestProvider(t, p, "m")
	})
}

func userRequest(goal string, more ...models.Message) models.ChatRequest {
	msgs := append([]models.Message{
		{Role: models.RoleSystem, Content: "be brief"},
		{Role: models.RoleUser, Content: goal},
	}, more...)
	return models.ChatRequest{Model: "scripted", Messages: msgs}
}

func TestSharedScript(t *testing.T) {
	p := scripted.New(nil,
		scripted.CallTool("search", `{"q":"go"}`),
		scripted.Answer("the answer is 42"),
	)
	ctx := t.Context()

	resp, err := p.Chat(ctx, userRequest("find it"), nil)
	if err != nil {
		t.Fatalf("Chat() 1 error = %v", err)
	}
	want := models.ChatResponse{
		Model: "scripted",
		Message: models.Message{Role: models.RoleAssistant, ToolCalls: []keel.ToolCall{
			{ID: "call_1", Name: "search", Arguments: json.RawMessage(`{"q":"go"}`)},
		}},
		// "be brief" "find it": 4 words; "search" + `{"q":"go"}`: 2 words.
		Usage:        models.Usage{PromptTokens: 4, CompletionTokens: 2},
		FinishReason: "stop",
	}
	if diff := cmp.Diff(want, resp); diff != "" {
		t.Errorf("Chat() 1 mismatch (-want +got):\n%s", diff)
	}

	var deltas []string
	resp, err = p.Chat(ctx, userRequest("another conversation"), func(d models.Delta) { deltas = append(deltas, d.Content) })
	if err != nil {
		t.Fatalf("Chat() 2 error = %v", err)
	}
	if resp.Message.Content != "the answer is 42" || strings.Join(deltas, "") != resp.Message.Content || len(deltas) != 3 {
		t.Errorf("Chat() 2 = %q in deltas %q, want %q in 3 deltas", resp.Message.Content, deltas, "the answer is 42")
	}
	if resp.Usage != (models.Usage{PromptTokens: 4, CompletionTokens: 4}) {
		t.Errorf("Chat() 2 usage = %+v, want {4 4}", resp.Usage)
	}

	if _, err := p.Chat(ctx, userRequest("find it"), nil); !errors.Is(err, scripted.ErrExhausted) {
		t.Errorf("Chat() 3 error = %v, want ErrExhausted", err)
	}
	if got := len(p.Requests()); got != 3 {
		t.Errorf("len(Requests()) = %d, want 3", got)
	}
}

func TestSteps(t *testing.T) {
	errBoom := errors.New("boom")
	tests := []struct {
		name    string
		step    scripted.Step
		want    models.Message
		wantErr error
	}{
		{"answer", scripted.Answer("hi"), models.Message{Role: models.RoleAssistant, Content: "hi"}, nil},
		{"call with empty args", scripted.CallTool("t", ""), models.Message{Role: models.RoleAssistant,
			ToolCalls: []keel.ToolCall{{ID: "call_1", Name: "t", Arguments: json.RawMessage(`{}`)}}}, nil},
		{"calls", scripted.CallTools(keel.ToolCall{ID: "mine", Name: "a"}, keel.ToolCall{Name: "b"}), models.Message{Role: models.RoleAssistant,
			ToolCalls: []keel.ToolCall{{ID: "mine", Name: "a"}, {ID: "call_1", Name: "b"}}}, nil},
		{"answer func sees request", scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
			return models.ChatResponse{Message: models.Message{Content: "goal was " + scripted.Goal(req)}}, nil
		}), models.Message{Role: models.RoleAssistant, Content: "goal was g"}, nil},
		{"fail", scripted.Fail(fmt.Errorf("down: %w", models.ErrUnavailable)), models.Message{}, models.ErrUnavailable},
		{"fail plain", scripted.Fail(errBoom), models.Message{}, errBoom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := scripted.New(nil, tt.step)
			resp, err := p.Chat(t.Context(), userRequest("g"), nil)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Chat() error = %v, want %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, resp.Message); diff != "" {
				t.Errorf("Chat() message mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestUnknownModel(t *testing.T) {
	p := scripted.New(nil, scripted.Answer("x"))
	req := userRequest("g")
	req.Model = "other"
	if _, err := p.Chat(t.Context(), req, nil); !errors.Is(err, models.ErrModelNotFound) {
		t.Errorf("Chat(model other) error = %v, want ErrModelNotFound", err)
	}
	// The failed call used up no step.
	if resp, err := p.Chat(t.Context(), userRequest("g"), nil); err != nil || resp.Message.Content != "x" {
		t.Errorf("Chat() = %q, %v, want x", resp.Message.Content, err)
	}
}

func TestBlock(t *testing.T) {
	p := scripted.New(nil, scripted.Block(), scripted.Answer("after"))
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := p.Chat(ctx, userRequest("g"), nil)
		errc <- err
	}()
	// Wait until the call is in, then check it stays blocked.
	if _, err := p.WaitRequests(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		t.Fatalf("Chat() returned %v before cancel", err)
	case <-time.After(20 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Chat() error = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Chat() still blocked 5s after cancel")
	}
	if resp, err := p.Chat(t.Context(), userRequest("g"), nil); err != nil || resp.Message.Content != "after" {
		t.Errorf("Chat() after block = %q, %v, want after", resp.Message.Content, err)
	}
}

func TestCancelledCallUsesNoStep(t *testing.T) {
	p := scripted.New(nil, scripted.Answer("first"))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := p.Chat(ctx, userRequest("g"), nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Chat(cancelled) error = %v, want context.Canceled", err)
	}
	if resp, err := p.Chat(t.Context(), userRequest("g"), nil); err != nil || resp.Message.Content != "first" {
		t.Errorf("Chat() = %q, %v, want first", resp.Message.Content, err)
	}
}

func TestRepeat(t *testing.T) {
	p := scripted.New(nil, scripted.Answer("one"), scripted.Repeat(scripted.Answer("again")), scripted.Answer("never"))
	var got []string
	for range 4 {
		resp, err := p.Chat(t.Context(), userRequest("g"), nil)
		if err != nil {
			t.Fatalf("Chat() error = %v", err)
		}
		got = append(got, resp.Message.Content)
	}
	if want := []string{"one", "again", "again", "again"}; !cmp.Equal(got, want) {
		t.Errorf("replies = %q, want %q", got, want)
	}
}

func TestDeltasSplitRunes(t *testing.T) {
	for _, text := range []string{"a", "ab", "héllo wörld ✓", strings.Repeat("猫", 10)} {
		p := scripted.New(nil, scripted.Answer(text))
		var got []string
		resp, err := p.Chat(t.Context(), userRequest("g"), func(d models.Delta) { got = append(got, d.Content) })
		if err != nil {
			t.Fatalf("Chat() error = %v", err)
		}
		if strings.Join(got, "") != text || resp.Message.Content != text || len(got) > 3 {
			t.Errorf("Chat(%q) deltas = %q, want at most 3 joining to it", text, got)
		}
		for _, d := range got {
			if d == "" || !strings.ContainsRune(text, []rune(d)[0]) {
				t.Errorf("Chat(%q) delta %q is empty or cuts a rune", text, d)
			}
		}
	}
}

// TestByGoalConcurrent runs 50 conversations at once, each following its
// own script: call a tool, then answer with what the tool returned.
func TestByGoalConcurrent(t *testing.T) {
	p := scripted.ByGoal(nil, func(goal string) []scripted.Step {
		return []scripted.Step{
			scripted.CallTool("echo", fmt.Sprintf(`{"text":%q}`, goal)),
			scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
				last := req.Messages[len(req.Messages)-1]
				return models.ChatResponse{Message: models.Message{Content: "tool said " + last.Content}}, nil
			}),
		}
	})
	const runs = 50
	var wg sync.WaitGroup
	for i := range runs {
		wg.Go(func() {
			goal := fmt.Sprintf("goal %d", i)
			req := userRequest(goal)
			resp, err := p.Chat(t.Context(), req, nil)
			if err != nil || len(resp.Message.ToolCalls) != 1 {
				t.Errorf("run %d: Chat() 1 = %+v, %v, want one tool call", i, resp.Message, err)
				return
			}
			call := resp.Message.ToolCalls[0]
			var args struct{ Text string }
			if err := json.Unmarshal(call.Arguments, &args); err != nil || args.Text != goal {
				t.Errorf("run %d: tool arguments %s, want text %q", i, call.Arguments, goal)
			}
			req.Messages = append(req.Messages, resp.Message, models.Message{
				Role: models.RoleTool, ToolCallID: call.ID, ToolName: call.Name, Content: "output " + args.Text,
			})
			resp, err = p.Chat(t.Context(), req, nil)
			if want := "tool said output " + goal; err != nil || resp.Message.Content != want {
				t.Errorf("run %d: Chat() 2 = %q, %v, want %q", i, resp.Message.Content, err, want)
			}
		})
	}
	wg.Wait()

	reqs := p.Requests()
	if len(reqs) != 2*runs {
		t.Fatalf("len(Requests()) = %d, want %d", len(reqs), 2*runs)
	}
	ids := map[string]bool{}
	for _, r := range reqs {
		if len(r.Messages) == 4 {
			if want := "output " + scripted.Goal(r); r.Messages[3].Content != want {
				t.Errorf("request for %q carries tool output %q, want %q", scripted.Goal(r), r.Messages[3].Content, want)
			}
			ids[r.Messages[2].ToolCalls[0].ID] = true
		}
	}
	if len(ids) != runs {
		t.Errorf("%d distinct tool call IDs, want %d", len(ids), runs)
	}
}

func TestRequestsAreCopies(t *testing.T) {
	p := scripted.New(nil, scripted.Answer("x"))
	req := userRequest("g")
	if _, err := p.Chat(t.Context(), req, nil); err != nil {
		t.Fatal(err)
	}
	req.Messages[1].Content = "changed by caller"
	got := p.Requests()
	got[0].Messages[0].Content = "changed by reader"
	if g := scripted.Goal(p.Requests()[0]); g != "g" {
		t.Errorf("recorded goal = %q, want g", g)
	}
	if c := p.Requests()[0].Messages[0].Content; c != "be brief" {
		t.Errorf("recorded system message = %q, want be brief", c)
	}
}

func TestModels(t *testing.T) {
	ms := []models.ModelInfo{{Name: "a", Capabilities: []models.Capability{models.CapCompletion}, ContextLength: 100}}
	p := scripted.New(ms)
	got, err := p.Models(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []models.ModelInfo{{Name: "a", Provider: "scripted", Capabilities: []models.Capability{models.CapCompletion}, ContextLength: 100}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Models() mismatch (-want +got):\n%s", diff)
	}
	ms[0].Name = "mutated"
	if got, _ := p.Models(t.Context()); got[0].Name != "a" {
		t.Errorf("Models() after caller mutation = %q, want a", got[0].Name)
	}
	if p.Name() != "scripted" {
		t.Errorf("Name() = %q, want scripted", p.Name())
	}
}

// TestWaitRequests: WaitRequests returns once the nth request is in,
// with every request so far, and gives up with ctx's error.
func TestWaitRequests(t *testing.T) {
	p := scripted.New(nil, scripted.Repeat(scripted.Answer("ok")))
	got := make(chan []models.ChatRequest, 1)
	go func() {
		reqs, err := p.WaitRequests(t.Context(), 2)
		if err != nil {
			t.Error(err)
		}
		got <- reqs
	}()
	for _, goal := range []string{"first", "second"} {
		if _, err := p.Chat(t.Context(), userRequest(goal), nil); err != nil {
			t.Fatal(err)
		}
	}
	if reqs := <-got; len(reqs) != 2 || scripted.Goal(reqs[1]) != "second" {
		t.Errorf("WaitRequests(2) = %d requests, want first and second", len(reqs))
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if reqs, err := p.WaitRequests(ctx, 3); !errors.Is(err, context.Canceled) || reqs != nil {
		t.Errorf("WaitRequests(3) with a done ctx = %d requests, %v; want context.Canceled", len(reqs), err)
	}
}
