package engine_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/ollama"
)

// forcedTools is a model that asks the real one and, for its first steps
// step calls, replaces the reply with a call of dump: the prompts are real and
// counted by the real tokenizer, and the history is sure to grow.
type forcedTools struct {
	engine.Model
	steps int

	mu sync.Mutex
	n  int
}

func (f *forcedTools) Chat(ctx context.Context, req models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
	resp, err := f.Model.Chat(ctx, req, onDelta)
	if err != nil || len(req.Tools) == 0 { // a summary call has no tools
		return resp, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n++; f.n <= f.steps {
		resp.Message.Content = ""
		resp.Message.ToolCalls = []keel.ToolCall{{ID: fmt.Sprintf("forced%d", f.n), Name: "dump",
			Arguments: json.RawMessage(fmt.Sprintf(`{"n":900,"tag":"R%d"}`, f.n))}}
	}
	return resp, err
}

// TestRealOllamaContextFit runs against the real Ollama and its tiny
// models (num_ctx 2048), whose tokenizer counts about twice keel's
// estimate: a run whose history grows past num_ctx is summarized, and no
// model call's prompt reaches num_ctx (Ollama reports exactly num_ctx
// for a prompt it cut).
func TestRealOllamaContextFit(t *testing.T) {
	t.Parallel()
	host := os.Getenv("OLLAMA_HOST")
	if host == "" {
		t.Skip("OLLAMA_HOST is unset; start a test server with ../shared/ollama/start")
	}
	// The completion-only model: its tool instruction is a large part of
	// the prompt that keel's estimate does not see. (The tools model takes
	// minutes more on a busy machine and shares the path.)
	for _, model := range []string{cmp.Or(os.Getenv("KEEL_TEST_OLLAMA_MODEL"), "keel-tiny")} {
		t.Run(model, func(t *testing.T) {
			hc := &http.Client{Transport: &http.Transport{}}
			// One thread: several stall each other on a busy machine (ollama.Config.NumThread).
			p, err := ollama.New(ollama.Config{Host: host, HTTPClient: hc, NumThread: 1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				p.Close()
				hc.CloseIdleConnections() // not a leak, but the package's goleak check would say so
			})
			r, err := models.NewRouter(models.RouterConfig{Providers: map[string]models.ProviderConfig{"ollama": {Provider: p, DefaultMaxTokens: 24}}})
			if err != nil {
				t.Fatal(err)
			}
			st, eng := fitHarness(t, &forcedTools{Model: r, steps: 4})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			run, err := eng.Start(ctx, engine.StartRequest{Goal: "Dump some text four times, then say what you saw.", Model: model, MaxSteps: 12})
			if err != nil {
				t.Fatal(err)
			}
			if err := eng.Wait(ctx, run.ID); err != nil {
				t.Fatal(err)
			}
			got, err := st.GetRun(ctx, run.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != keel.RunSucceeded {
				t.Errorf("run = %s %q, want succeeded", got.Status, got.Error)
			}
			if n := len(eventsOf(t, st, run.ID, keel.EventContextSummary)); n == 0 {
				t.Errorf("no context.summarized: the history never outgrew the context?")
			}
			spans, err := st.Spans(ctx, run.ID)
			if err != nil {
				t.Fatal(err)
			}
			calls := 0
			for _, sp := range spans {
				if sp.Kind != keel.SpanModelCall {
					continue
				}
				t.Logf("step %d: %d prompt tokens, %s %s", sp.Step, sp.PromptTokens, sp.Status, sp.Error)
				if sp.Status != keel.SpanOK {
					continue // refused before or by Ollama, then fitted again
				}
				calls++
				if sp.PromptTokens <= 0 || sp.PromptTokens >= 2048 {
					t.Errorf("step %d: Ollama counted %d prompt tokens; want some, under num_ctx 2048 (2048 is a cut prompt)", sp.Step, sp.PromptTokens)
				}
			}
			if calls < 5 {
				t.Errorf("%d model calls served, want at least 5 (4 forced steps and the answer)", calls)
			}
		})
	}
}
