package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/openai/openaitest"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestPrivateGrantEndToEnd: readfile is granted a directory marked
// private (keel tools grant --private). In a run allowed to use a cloud
// model (an OpenAI-compatible server on loopback that records every
// request), the model has readfile read a file holding an SSN; from that
// step on the run is private, so the server receives nothing more:
// neither the SSN nor anything else. fetch, declared read_only but
// requesting the network, waits for approval as an external tool.
func TestPrivateGrantEndToEnd(t *testing.T) {
	t.Parallel()
	const canary = "078-05-1120"
	srv := openaitest.New(t)
	dir := withTools(t, "fetch", "readfile")
	writeCloudRoute(t, dir, srv)
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: scripted.New(nil), RequireApproval: []keel.SideEffect{keel.SideEffectExternal}})
	c := dial(t, d.dir)
	ctx := context.Background()
	secrets := t.TempDir()
	if err := os.WriteFile(filepath.Join(secrets, "secret.txt"), []byte("Jane Roe, SSN "+canary+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := runCLI(ctx, d.dir, "tools", "grant", "readfile", "fs:/workspace="+secrets, "--private"); code != 0 || !strings.Contains(out, "private") {
		t.Fatalf("keel tools grant --private = %d:\n%s%s", code, out, errs)
	}

	srv.Script(openaitest.Reply{ToolCalls: []openaitest.ToolCall{{ID: "call_1", Name: "readfile", Arguments: `{"path":"secret.txt"}`}}})
	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "What is in secret.txt?", Model: "default", MaxSteps: 4, Policy: keel.RunPolicy{AllowCloud: true}})
	if err != nil {
		t.Fatal(err)
	}
	evs := follow(t, c, run.ID)
	var read bool
	for _, ev := range evs {
		if ev.Type == keel.EventToolResult && strings.Contains(string(ev.Data), canary) {
			read = true
			if !strings.Contains(string(ev.Data), `"private":true`) {
				t.Errorf("tool result %s is not marked private", ev.Data)
			}
		}
	}
	if !read {
		t.Fatalf("readfile never read the secret; events %v", evTypes(evs))
	}
	var chats []openaitest.Request
	for _, r := range srv.Requests() {
		if r.Path == openaitest.ChatPath {
			chats = append(chats, r)
		}
		if strings.Contains(string(r.Body), canary) {
			t.Errorf("the cloud server received the SSN: %s %s", r.Path, r.Body)
		}
	}
	if len(chats) != 1 {
		t.Errorf("the cloud server received %d chat requests, want only the one before the private read", len(chats))
	}
	got, err := c.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Run.Status != keel.RunFailed || !strings.Contains(got.Run.Error, "private") {
		t.Errorf("run after the private read: %s %q, want failed by policy (private content, cloud-only route)", got.Run.Status, got.Run.Error)
	}

	// fetch sends its URL over the network: external for approvals.
	srv.Script(openaitest.Reply{ToolCalls: []openaitest.ToolCall{{ID: "call_2", Name: "fetch", Arguments: `{"url":"https://example.com/"}`}}})
	run, err = c.StartRun(ctx, protocol.RunStartParams{Goal: "fetch it", Model: "default", MaxSteps: 4, Policy: keel.RunPolicy{AllowCloud: true}})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(t, d.dir, run.ID, keel.EventApprovalAsked)
}

// TestPrivateSummaryEndToEnd: after a private read, a run whose route
// falls back to the local model goes on there, counting words of more
// text than its context holds, so its older steps, the private read
// among them, are summarized (the summary keeps the SSN). The cloud
// server (first target of the route) receives only the first step:
// neither the later steps nor the summary, though no private tool result
// is left in the context.
func TestPrivateSummaryEndToEnd(t *testing.T) {
	t.Parallel()
	const canary = "078-05-1120"
	srv := openaitest.New(t)
	dir := withTools(t, "readfile", "wordcount")
	writeModelsConfig(t, dir, map[string]any{
		"allow_cloud": true,
		"providers": map[string]any{"cloud": map[string]any{
			"base_url": srv.URL(), "max_retries": -1,
			"models": []any{map[string]any{"name": openaitest.ChatModel, "context_length": 1200,
				"capabilities": []string{"completion", "tools"}}},
		}},
		"routes": []any{map[string]any{"name": "default",
			"targets":  []any{map[string]any{"provider": "cloud", "model": openaitest.ChatModel}},
			"fallback": []any{map[string]any{"provider": "ollama", "model": scripted.DefaultModel.Name}}}},
	})
	p, counts := summarizingModel(canary)
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: p})
	c := dial(t, d.dir)
	ctx := context.Background()
	secrets := t.TempDir()
	secret := "Jane Roe, SSN " + canary + "\n" + strings.Repeat("dolor sit amet ", 60)
	if err := os.WriteFile(filepath.Join(secrets, "secret.txt"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := runCLI(ctx, d.dir, "tools", "grant", "readfile", "fs:/workspace="+secrets, "--private"); code != 0 {
		t.Fatalf("keel tools grant --private = %d:\n%s%s", code, out, errs)
	}
	srv.Script(openaitest.Reply{ToolCalls: []openaitest.ToolCall{{ID: "call_1", Name: "readfile", Arguments: `{"path":"secret.txt"}`}}})
	got := runToEnd(t, c, protocol.RunStartParams{Goal: "What is in secret.txt?", Model: "default", MaxSteps: 8, Policy: keel.RunPolicy{AllowCloud: true}})
	if got.Run.Status != keel.RunSucceeded {
		t.Errorf("run = %s %q", got.Run.Status, got.Run.Error)
	}
	if summaries, steps := counts(); summaries == 0 {
		t.Errorf("no summary was asked of the local model (%d steps); the test needs one", steps)
	}
	chats := 0
	for _, r := range srv.Requests() {
		if r.Path == openaitest.ChatPath {
			chats++
		}
		if strings.Contains(string(r.Body), canary) {
			t.Errorf("the cloud server received private content: %s %.300s", r.Path, r.Body)
		}
	}
	if chats != 1 {
		t.Errorf("the cloud server received %d chat requests, want only the one before the private read", chats)
	}
}

// summarizingModel is a local model of 1,200 tokens of context that
// counts words of text that is not private (four wordcount calls, then
// "done") and, asked for a summary, keeps the facts: a summary of a
// message holding canary holds it too. counts says how many summaries
// and steps it was asked for.
func summarizingModel(canary string) (p *scripted.Provider, counts func() (summaries, steps int)) {
	var mu sync.Mutex
	summaries, steps := 0, 0
	local := scripted.DefaultModel
	local.ContextLength = 1200
	p = scripted.New([]models.ModelInfo{local}, scripted.Repeat(scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(req.Messages[0].Content, "Summarize the following text") {
			summaries++
			sum := "SUMMARY: counted words"
			for _, m := range req.Messages {
				if strings.Contains(m.Content, canary) {
					sum += "; the text holds " + canary
				}
			}
			return models.ChatResponse{Message: models.Message{Content: sum}}, nil
		}
		if steps++; steps <= 4 {
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: fmt.Sprintf("local_%d", steps), Name: "wordcount",
				Arguments: json.RawMessage(`{"text":"` + strings.Repeat("lorem ipsum ", 90) + `"}`)}}}}, nil
		}
		return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
	})))
	return p, func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return summaries, steps
	}
}
