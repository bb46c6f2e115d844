package acp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// call sends a request with id and reads until its response, answering
// each session/request_permission with the option optionID and keeping
// every session/update. It returns the response and the updates.
func (a *agent) call(t *testing.T, id int, method, params, optionID string) (reply, []map[string]any) {
	t.Helper()
	a.send(t, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, method, params))
	var updates []map[string]any
	for {
		m := a.next(t)
		switch {
		case m.Method == "session/update":
			var p struct {
				Update map[string]any `json:"update"`
			}
			json.Unmarshal(m.Params, &p)
			updates = append(updates, p.Update)
		case m.Method == "session/request_permission":
			a.send(t, fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"outcome":{"outcome":"selected","optionId":%q}}}`, m.ID, optionID))
		case m.Method == "" && string(m.ID) == fmt.Sprint(id):
			return m, updates
		}
	}
}

// TestTurnEnds: how a turn ends follows from its run. A model cut off by
// its token limit (finish reason "length") ends the turn with
// max_tokens, a provider's refusal ("content_filter") with refusal; a
// call the person rejects fails (keel's denied error) and the model goes
// on without it to end_turn.
func TestTurnEnds(t *testing.T) {
	t.Parallel()
	dir := newDataDir(t)
	answer := func(content, finish string) scripted.Step {
		return scripted.AnswerFunc(func(models.ChatRequest) (models.ChatResponse, error) {
			return models.ChatResponse{Message: models.Message{Content: content}, FinishReason: finish}, nil
		})
	}
	startDaemon(t, dir, scripted.ByGoal(nil, func(goal string) []scripted.Step {
		switch goal {
		case "write a lot":
			return []scripted.Step{answer("and so on and", "length")}
		case "say something bad":
			return []scripted.Step{answer("", "content_filter")}
		case "count, if allowed":
			return []scripted.Step{scripted.CallTool("tally", `{"text":"x"}`), answer("could not count", "stop")}
		}
		return nil
	}))
	a := startAgent(t, dir)
	id := 0
	for _, tt := range []struct {
		prompt, option, stop string
	}{
		{"write a lot", "", "max_tokens"},
		{"say something bad", "", "refusal"},
		{"count, if allowed", "reject_once", "end_turn"},
	} {
		id++
		r, _ := a.call(t, id, "session/new", fmt.Sprintf(`{"cwd":%q,"mcpServers":[]}`, t.TempDir()), "")
		var s struct {
			SessionID string `json:"sessionId"`
		}
		if r.Error != nil || json.Unmarshal(r.Result, &s) != nil {
			t.Fatalf("session/new = %s", r)
		}
		id++
		r, updates := a.call(t, id, "session/prompt", fmt.Sprintf(`{"sessionId":%q,"prompt":[{"type":"text","text":%q}]}`, s.SessionID, tt.prompt), tt.option)
		if want := fmt.Sprintf(`{"stopReason":%q}`, tt.stop); r.Error != nil || string(r.Result) != want {
			t.Errorf("%q: session/prompt = %s, want %s", tt.prompt, r, want)
		}
		if tt.option == "reject_once" {
			var failed bool
			for _, u := range updates {
				if u["sessionUpdate"] == "tool_call_update" && u["status"] == "failed" {
					raw, _ := json.Marshal(u["rawOutput"])
					failed = strings.Contains(string(raw), `"denied"`)
				}
			}
			if !failed {
				t.Errorf("%q: no failed tool_call_update with keel's denied error in %v", tt.prompt, updates)
			}
		}
	}
}

// TestDisconnectMidTurn: an editor that goes away while a turn runs
// (its end of the pipe closes) ends keel acp cleanly; the run goes on in
// the daemon and succeeds, and another keel acp serves as before.
func TestDisconnectMidTurn(t *testing.T) {
	t.Parallel()
	dir := newDataDir(t)
	busy, release := make(chan struct{}, 1), make(chan struct{})
	startDaemon(t, dir, scripted.ByGoal(nil, func(goal string) []scripted.Step {
		return []scripted.Step{scripted.ReplyFunc(func(ctx context.Context, _ models.ChatRequest) (models.ChatResponse, error) {
			busy <- struct{}{}
			select {
			case <-release:
				return models.ChatResponse{Message: models.Message{Content: "finished alone"}}, nil
			case <-ctx.Done():
				return models.ChatResponse{}, ctx.Err()
			}
		})}
	}))
	a := startAgent(t, dir)
	r, _ := a.call(t, 1, "session/new", fmt.Sprintf(`{"cwd":%q,"mcpServers":[]}`, t.TempDir()), "")
	if r.Error != nil {
		t.Fatalf("session/new = %s", r)
	}
	var s struct {
		SessionID string `json:"sessionId"`
	}
	json.Unmarshal(r.Result, &s)
	a.send(t, fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":%q,"prompt":[{"type":"text","text":"take your time"}]}}`, s.SessionID))
	select {
	case <-busy:
	case <-time.After(time.Minute):
		t.Fatalf("the model was not called within a minute (stderr %s)", a.stderr)
	}
	a.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- a.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("keel acp after its editor went away: %v (stderr %s)", err, a.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("keel acp did not end within 30 s of its editor going away")
	}
	close(release)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.DialDataDir(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	runs, err := c.ListRuns(ctx, 10)
	if err != nil || len(runs) != 1 {
		t.Fatalf("run.list = %v, %v; want the session's run", runs, err)
	}
	if _, err := c.Subscribe(ctx, runs[0].ID, 0); err != nil {
		t.Fatal(err)
	}
	for ev := range c.Events() {
		if ev.Type == keel.EventRunSucceeded {
			break
		}
		if ev.Type == keel.EventRunFailed || ev.Type == keel.EventRunCancelled {
			t.Fatalf("the run ended %s: %s", ev.Type, ev.Data)
		}
	}
	b := startAgent(t, dir)
	if r, _ := b.call(t, 1, "session/load", fmt.Sprintf(`{"sessionId":%q,"cwd":%q,"mcpServers":[]}`, s.SessionID, t.TempDir()), ""); r.Error != nil {
		t.Errorf("session/load in a new keel acp = %s", r)
	}
}

// TestLoadRunningSession: the daemon stops while a turn's model works;
// the next daemon resumes the run. session/load, while the resumed model
// still works, replays the history and then follows the run: its answer
// reaches the editor as it comes, and the next prompt goes on after it.
func TestLoadRunningSession(t *testing.T) {
	t.Parallel()
	dir := newDataDir(t)
	busy := make(chan struct{}, 1)
	d := startDaemon(t, dir, scripted.ByGoal(nil, func(string) []scripted.Step {
		return []scripted.Step{scripted.ReplyFunc(func(ctx context.Context, _ models.ChatRequest) (models.ChatResponse, error) {
			busy <- struct{}{}
			<-ctx.Done()
			return models.ChatResponse{}, ctx.Err()
		})}
	}))
	a := startAgent(t, dir)
	cwd := t.TempDir()
	r, _ := a.call(t, 1, "session/new", fmt.Sprintf(`{"cwd":%q,"mcpServers":[]}`, cwd), "")
	var s struct {
		SessionID string `json:"sessionId"`
	}
	if r.Error != nil || json.Unmarshal(r.Result, &s) != nil {
		t.Fatalf("session/new = %s", r)
	}
	a.send(t, fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":%q,"prompt":[{"type":"text","text":"slow work"}]}}`, s.SessionID))
	select {
	case <-busy:
	case <-time.After(time.Minute):
		t.Fatalf("the model was not called within a minute (stderr %s)", a.stderr)
	}
	d.stop() // the run is interrupted; keel acp loses its daemon

	resumed, release := make(chan struct{}, 1), make(chan struct{})
	startDaemon(t, dir, scripted.ByGoal(nil, func(string) []scripted.Step {
		return []scripted.Step{
			scripted.ReplyFunc(func(ctx context.Context, _ models.ChatRequest) (models.ChatResponse, error) {
				resumed <- struct{}{}
				select {
				case <-release:
					return models.ChatResponse{Message: models.Message{Content: "resumed answer"}}, nil
				case <-ctx.Done():
					return models.ChatResponse{}, ctx.Err()
				}
			}),
			scripted.Answer("next answer"),
		}
	}))
	select {
	case <-resumed:
	case <-time.After(time.Minute):
		t.Fatal("the next daemon did not resume the run within a minute")
	}
	b := startAgent(t, dir)
	r, history := b.call(t, 1, "session/load", fmt.Sprintf(`{"sessionId":%q,"cwd":%q,"mcpServers":[]}`, s.SessionID, cwd), "")
	if r.Error != nil || len(history) == 0 || history[0]["sessionUpdate"] != "user_message_chunk" {
		t.Fatalf("session/load = %s, history %v", r, history)
	}
	close(release)
	var seen []string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("keel acp wrote after session/load:\n%s", strings.Join(seen, "\n"))
		}
	})
	// The answer comes as it is streamed, in chunks.
	for answer := ""; answer != "resumed answer"; {
		m := b.next(t)
		seen = append(seen, m.String())
		var p struct {
			Update struct {
				Kind    string `json:"sessionUpdate"`
				Content struct {
					Text string `json:"text"`
				} `json:"content"`
			} `json:"update"`
		}
		json.Unmarshal(m.Params, &p)
		if m.Method == "session/update" && p.Update.Kind == "agent_message_chunk" {
			answer += p.Update.Content.Text
		}
	}
	r, updates := b.call(t, 2, "session/prompt", fmt.Sprintf(`{"sessionId":%q,"prompt":[{"type":"text","text":"and then?"}]}`, s.SessionID), "")
	if r.Error != nil || string(r.Result) != `{"stopReason":"end_turn"}` {
		t.Fatalf("the prompt after the resumed turn = %s (updates %v)", r, updates)
	}
}
