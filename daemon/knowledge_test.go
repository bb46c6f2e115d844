package daemon_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/openai/openaitest"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/recall"
)

// notesDir writes files (name → content) into a new directory.
func notesDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// citeFirst answers with the citation of the first hit of the last
// knowledge_search result, or says there was none.
func citeFirst(req models.ChatRequest) (models.ChatResponse, error) {
	answer := "no hits"
	for _, m := range req.Messages {
		if m.Role != models.RoleTool || m.ToolName != recall.ToolName {
			continue
		}
		var out struct {
			Hits []struct {
				Cite string `json:"cite"`
			} `json:"hits"`
		}
		answer = "the search failed: " + m.Content
		if !strings.HasPrefix(m.Content, `{"error"`) && json.Unmarshal([]byte(m.Content), &out) == nil {
			answer = "no hits"
			if len(out.Hits) > 0 {
				answer = "It needs 1.21 gigawatts " + strings.Fields(out.Hits[0].Cite)[0]
			}
		}
	}
	return models.ChatResponse{Message: models.Message{Content: answer}}, nil
}

// TestKnowledgeInRuns: notes indexed with keel knowledge add into a
// workspace's scope are searched by a run in that workspace with the
// knowledge_search tool, with no policy at all: its result cites them, a
// retrieval span hangs under the call's span, the audit trail has the
// call. The user scope is not searched unless the run's policy allows
// it (a run rule); a run with no workspace is not offered the tool. A
// run's outcome remembered with keel run --remember is found by a later
// search.
func TestKnowledgeInRuns(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	notes := notesDir(t, map[string]string{"design.md": "# Design\n\nThe flux capacitor needs 1.21 gigawatts.\n"})
	diary := notesDir(t, map[string]string{"diary.md": "# Diary\n\nMy flux capacitor secret: zebra-canary.\n"})
	p := scripted.ByGoal(nil, func(goal string) []scripted.Step {
		switch {
		case strings.HasPrefix(goal, "user:"):
			return []scripted.Step{scripted.CallTool(recall.ToolName, `{"query":"flux capacitor","scope":"user"}`), scripted.AnswerFunc(citeFirst)}
		case strings.HasPrefix(goal, "remember:"):
			return []scripted.Step{scripted.Answer("The meeting moved to Thursday, room quokka.")}
		}
		return []scripted.Step{scripted.CallTool(recall.ToolName, `{"query":"flux capacitor"}`), scripted.AnswerFunc(citeFirst)}
	})
	d := startDaemon(t, daemon.Config{Provider: p})
	c := dial(t, d.dir)
	ctx := context.Background()
	if out, errs, code := runCLI(ctx, d.dir, "knowledge", "add", notes, "--scope", "workspace:"+ws); code != 0 || !strings.Contains(out, "1 added") {
		t.Fatalf("keel knowledge add = %d:\n%s%s", code, out, errs)
	}
	if out, errs, code := runCLI(ctx, d.dir, "knowledge", "add", diary, "--scope", "user", "--label", "private"); code != 0 {
		t.Fatalf("keel knowledge add --scope user = %d:\n%s%s", code, out, errs)
	}

	got := runToEnd(t, c, protocol.RunStartParams{Goal: "How much power does the flux capacitor need?", Workspace: ws, MaxSteps: 3})
	if got.Run.Status != keel.RunSucceeded || !strings.HasPrefix(got.Run.Result, "It needs 1.21 gigawatts [1]") {
		t.Fatalf("run = %s %q %q, want an answer citing [1]", got.Run.Status, got.Run.Result, got.Run.Error)
	}
	var res keel.ToolResultData
	for _, ev := range got.Events {
		switch ev.Type {
		case keel.EventRunStarted:
			var d keel.RunStartedData
			json.Unmarshal(ev.Data, &d)
			if !slices.Contains(d.Tools, recall.ToolName) {
				t.Errorf("run.started tools = %v, want %s", d.Tools, recall.ToolName)
			}
		case keel.EventToolResult:
			json.Unmarshal(ev.Data, &res)
		}
	}
	if out := string(res.Output); !strings.Contains(out, `"cite":"[1] `+filepath.Join(notes, "design.md")+":") || !strings.Contains(out, "gigawatts") || strings.Contains(out, "zebra-canary") {
		t.Errorf("knowledge_search output %s: want design.md cited [1], nothing of the user scope", res.Output)
	}
	if len(res.Labels) != 0 {
		t.Errorf("labels of the workspace's hits = %v, want none", res.Labels)
	}
	var call, retrieval *keel.Span
	for i, sp := range got.Spans {
		switch sp.Kind {
		case keel.SpanToolCall:
			call = &got.Spans[i]
		case keel.SpanRetrieval:
			retrieval = &got.Spans[i]
		}
	}
	if call == nil || retrieval == nil || retrieval.ParentID != call.ID || retrieval.Status != keel.SpanOK {
		t.Fatalf("trace %s: want a retrieval span under the tool call's", traceTree(t, got.Spans))
	}
	var at recall.RetrievalAttrs
	if err := json.Unmarshal(retrieval.Attrs, &at); err != nil || at.Query != "flux capacitor" || !slices.Equal(at.Scopes, []string{"workspace:" + ws}) ||
		len(at.Hits) != 1 || at.Hits[0].Source != filepath.Join(notes, "design.md") || at.Hits[0].Score == 0 {
		t.Errorf("retrieval span attrs %s (%v)", retrieval.Attrs, err)
	}
	if a := auditOf(t, c, got.Run.ID, recall.ToolName); a.Outcome != "ok" || !slices.Contains(a.Grants, "knowledge:workspace:"+ws) {
		t.Errorf("audit record %+v, want ok with the scope read as its grant", a)
	}

	// The user scope: denied with nothing to say, allowed by a rule.
	got = runToEnd(t, c, protocol.RunStartParams{Goal: "user: what is my secret?", Workspace: ws, MaxSteps: 3})
	if !strings.Contains(got.Run.Result, "policy_denied") || strings.Contains(got.Run.Result, "zebra") {
		t.Errorf("run without a rule for user: %q, want the search denied by the policy", got.Run.Result)
	}
	rules := json.RawMessage(`{"rules":[{"action":"knowledge","scope":"user","decision":"allow"}]}`)
	got = runToEnd(t, c, protocol.RunStartParams{Goal: "user: what is my secret, allowed?", Workspace: ws, MaxSteps: 3, Policy: keel.RunPolicy{Rules: rules}})
	if !strings.HasSuffix(got.Run.Result, "[1]") {
		t.Errorf("run allowed the user scope: %q %q, want a hit cited", got.Run.Result, got.Run.Error)
	}
	labels, err := c.GetRun(ctx, got.Run.ID)
	if err != nil || !slices.Contains(labels.Labels, "private") {
		t.Errorf("context labels after reading the private user scope = %v (%v), want private", labels.Labels, err)
	}

	// A run that may read no scope holding anything is not offered the
	// tool.
	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "remember: no workspace", MaxSteps: 2})
	if err != nil {
		t.Fatal(err)
	}
	evs := follow(t, c, run.ID)
	var started keel.RunStartedData
	json.Unmarshal(evs[0].Data, &started)
	if evs[0].Type != keel.EventRunStarted || slices.Contains(started.Tools, recall.ToolName) {
		t.Errorf("a run without a workspace was offered %v", started.Tools)
	}

	// keel run --remember saves the outcome into the workspace's scope.
	out, errs, code := runCLI(ctx, d.dir, "run", "--workspace", ws, "--remember", "remember: when is the meeting?")
	if code != 0 || !strings.Contains(errs, "remembered run") {
		t.Fatalf("keel run --remember = %d:\n%s%s", code, out, errs)
	}
	hits, err := client.Do(ctx, c, client.KnowledgeSearch, protocol.KnowledgeSearchParams{Query: "quokka", Scopes: []string{"workspace:" + ws}})
	if err != nil || len(hits.Hits) != 1 || !strings.HasPrefix(hits.Hits[0].Source, "keel:run/") || !strings.Contains(hits.Hits[0].Text, "room quokka") {
		t.Errorf("search for the remembered outcome = %+v (%v)", hits, err)
	}
}

// TestKnowledgePrivateScopeStaysLocal: text retrieved from a scope
// labelled private makes the run's context private, so that a run on a
// cloud route (an OpenAI-compatible server on loopback recording every
// request) sends nothing more to the cloud once it has read it: the
// server never receives the text, and the run fails for want of a local
// model.
func TestKnowledgePrivateScopeStaysLocal(t *testing.T) {
	t.Parallel()
	const canary = "078-05-1120"
	srv := openaitest.New(t)
	dir := noTools(t)
	writeCloudRoute(t, dir, srv)
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: scripted.New(nil)})
	c := dial(t, d.dir)
	ctx := context.Background()
	secrets := notesDir(t, map[string]string{"ssn.md": "# Jane Roe\n\nSSN " + canary + "\n"})
	if _, err := client.Do(ctx, c, client.KnowledgeAdd, protocol.KnowledgeAddParams{Paths: []string{secrets}, Scope: "user", Labels: []string{"private"}}); err != nil {
		t.Fatal(err)
	}
	srv.Script(openaitest.Reply{ToolCalls: []openaitest.ToolCall{{ID: "call_1", Name: recall.ToolName, Arguments: `{"query":"Jane Roe SSN"}`}}})
	rules := json.RawMessage(`{"rules":[{"action":"knowledge","scope":"user","decision":"allow"}]}`)
	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "What is Jane Roe's SSN?", Model: "default", MaxSteps: 4,
		Policy: keel.RunPolicy{AllowCloud: true, Rules: rules}})
	if err != nil {
		t.Fatal(err)
	}
	evs := follow(t, c, run.ID)
	var read bool
	for _, ev := range evs {
		if ev.Type == keel.EventToolResult && strings.Contains(string(ev.Data), canary) {
			read = true
			var res keel.ToolResultData
			json.Unmarshal(ev.Data, &res)
			if !slices.Contains(res.Labels, "private") {
				t.Errorf("tool result labels = %v, want private", res.Labels)
			}
		}
	}
	if !read {
		t.Fatalf("knowledge_search never read the private scope; events %v", evTypes(evs))
	}
	chats := 0
	for _, r := range srv.Requests() {
		if r.Path == openaitest.ChatPath {
			chats++
		}
		if strings.Contains(string(r.Body), canary) {
			t.Errorf("the cloud server received the private text: %s %.300s", r.Path, r.Body)
		}
	}
	if chats != 1 {
		t.Errorf("the cloud server received %d chat requests, want only the one before the private read", chats)
	}
	got, err := c.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Run.Status != keel.RunFailed || !strings.Contains(got.Run.Error, "private") {
		t.Errorf("run after the private read: %s %q, want failed by policy (private content, cloud-only route)", got.Run.Status, got.Run.Error)
	}
}

// TestKnowledgeProtocol: the knowledge.* methods over the daemon's
// WebSocket: a client token with the read scope may search and list but
// not add (forbidden); a watched directory is listed, and still after a
// restart; forget takes a path and then nothing is found.
func TestKnowledgeProtocol(t *testing.T) {
	t.Parallel()
	dir := noTools(t)
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: scripted.New(nil)})
	c := dial(t, d.dir)
	ctx := context.Background()
	notes := notesDir(t, map[string]string{"a.md": "# A\n\nalpha bravo\n", "b.md": "# B\n\ncharlie\n"})
	// An add streams its progress, all of it before its result.
	var last protocol.KnowledgeProgress
	n := 0
	added, err := client.DoStream(ctx, c, client.KnowledgeAdd, protocol.KnowledgeAddParams{Paths: []string{notes}, Scope: "user"}, func(p protocol.KnowledgeProgress) {
		n, last = n+1, p
	})
	if err != nil || added.Added != 2 || n == 0 || last.Files != 2 || last.FilesDone != 2 || string(last.ID) == "" {
		t.Errorf("knowledge.add = %+v, %v; %d progress notifications, the last %+v: want 2 files added and their progress", added, err, n, last)
	}
	w, err := client.Do(ctx, c, client.KnowledgeWatch, protocol.KnowledgeWatchParams{Dir: notes, Scope: "user"})
	if err != nil || w.Dir != notes {
		t.Fatalf("knowledge.watch = %+v, %v", w, err)
	}
	tok, err := client.Do(ctx, c, client.TokenCreate, protocol.TokenCreateParams{Name: "editor", Scopes: []string{keel.ScopeRead}})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := client.Dial(ctx, d.info.URL, tok.Token)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	res, err := client.Do(ctx, rc, client.KnowledgeSearch, protocol.KnowledgeSearchParams{Query: "alpha"})
	if err != nil || len(res.Hits) != 1 || res.Hits[0].Source != filepath.Join(notes, "a.md") || res.Hits[0].Cite == "" {
		t.Errorf("knowledge.search with a read token = %+v, %v", res, err)
	}
	_, err = client.Do(ctx, rc, client.KnowledgeAdd, protocol.KnowledgeAddParams{Paths: []string{notes}, Scope: "user"})
	if pe := wantCode(t, err, protocol.CodeForbidden, "knowledge.add with a read token"); !strings.Contains(pe.Message, keel.ScopeKnowledge) {
		t.Errorf("forbidden: %s, want it to name the knowledge scope", pe.Message)
	}
	_, err = client.Do(ctx, c, client.KnowledgeAdd, protocol.KnowledgeAddParams{Paths: []string{"relative/notes"}, Scope: "user"})
	wantCode(t, err, protocol.CodeInvalidParams, "knowledge.add of a relative path")
	_, err = client.Do(ctx, c, client.KnowledgeAdd, protocol.KnowledgeAddParams{Paths: []string{notes}, Scope: "team"})
	wantCode(t, err, protocol.CodeInvalidParams, "knowledge.add to a malformed scope")

	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	d = startDaemon(t, daemon.Config{DataDir: dir, Provider: scripted.New(nil)})
	c = dial(t, d.dir)
	list, err := client.Do(ctx, c, client.KnowledgeList, protocol.KnowledgeListParams{})
	if err != nil || len(list.Watches) != 1 || list.Watches[0].Dir != notes || len(list.Docs) != 2 {
		t.Fatalf("knowledge.list after a restart = %+v, %v; want the watch and its 2 documents", list, err)
	}
	out, errs, code := runCLI(ctx, dir, "knowledge", "forget", filepath.Join(notes, "a.md"))
	if code != 0 || !strings.Contains(out, "forgot 1") {
		t.Errorf("keel knowledge forget = %d:\n%s%s", code, out, errs)
	}
	res, err = client.Do(ctx, c, client.KnowledgeSearch, protocol.KnowledgeSearchParams{Query: "alpha"})
	if err != nil || len(res.Hits) != 0 {
		t.Errorf("search after forget = %+v, %v", res, err)
	}
}

// searchFirst is a real local model whose first step of each run is a
// knowledge_search call made for it (the tiny test models never choose
// to call a tool): every later step, which reads the search's result, is
// the real model's. seen collects what the real model was sent.
type searchFirst struct {
	models.Provider
	query string
	mu    sync.Mutex
	seen  []models.ChatRequest
}

// Embed is the real model's: the store embeds with it.
func (p *searchFirst) Embed(ctx context.Context, req models.EmbedRequest) (models.EmbedResponse, error) {
	return p.Provider.(models.Embedder).Embed(ctx, req)
}

func (p *searchFirst) Chat(ctx context.Context, req models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
	if !slices.ContainsFunc(req.Messages, func(m models.Message) bool { return m.Role == models.RoleTool }) {
		return models.ChatResponse{Model: req.Model, Message: models.Message{Role: models.RoleAssistant,
			ToolCalls: []keel.ToolCall{{ID: "call_search", Name: recall.ToolName, Arguments: json.RawMessage(`{"query":` + strconv.Quote(p.query) + `}`)}}}}, nil
	}
	p.mu.Lock()
	p.seen = append(p.seen, req)
	p.mu.Unlock()
	return p.Provider.Chat(ctx, req, onDelta)
}

// TestKnowledgeWithRealOllama: a run asks about indexed notes with a
// real local model: its first step searches them (made for it: see
// searchFirst), the real model answers from the result, which it reads
// with each hit's citation; the search is under a retrieval span naming
// the notes' file, found by full text and by the vectors the real model
// embedded (--embed-model: hybrid search).
func TestKnowledgeWithRealOllama(t *testing.T) {
	t.Parallel()
	p := &searchFirst{Provider: realOllama(t), query: "little dog park"}
	d := startDaemon(t, daemon.Config{Provider: p, EmbedModel: envOr("KEEL_TEST_OLLAMA_MODEL", "keel-tiny")})
	c := dial(t, d.dir)
	ctx := context.Background()
	ws := t.TempDir()
	notes := notesDir(t, map[string]string{"story.md": "# The dog\n\nOnce upon a time the little dog found a big red ball in the park.\n"})
	if _, err := client.Do(ctx, c, client.KnowledgeAdd, protocol.KnowledgeAddParams{Paths: []string{notes}, Scope: "workspace:" + ws}); err != nil {
		t.Fatal(err)
	}
	// Short replies keep the test quick on a busy machine.
	got := runToEnd(t, c, protocol.RunStartParams{Goal: "What did the little dog find in the park?", Model: envOr("KEEL_TEST_OLLAMA_TOOLS_MODEL", "keel-tiny-tools"),
		Workspace: ws, MaxSteps: 2})
	if got.Run.Status != keel.RunSucceeded || got.Run.Result == "" {
		t.Fatalf("run = %s %q %q, want the real model's answer", got.Run.Status, got.Run.Result, got.Run.Error)
	}
	var call, retrieval, answer *keel.Span
	for i, sp := range got.Spans {
		switch sp.Kind {
		case keel.SpanToolCall:
			call = &got.Spans[i]
		case keel.SpanRetrieval:
			retrieval = &got.Spans[i]
		case keel.SpanModelCall:
			answer = &got.Spans[i]
		}
	}
	if call == nil || retrieval == nil || retrieval.ParentID != call.ID || answer == nil || answer.CompletionTokens == 0 {
		t.Fatalf("trace %s: want the search's retrieval span under its call, then the real model's answer", traceTree(t, got.Spans))
	}
	var at recall.RetrievalAttrs
	if err := json.Unmarshal(retrieval.Attrs, &at); err != nil || at.Query != p.query || len(at.Hits) != 1 || at.Hits[0].Source != filepath.Join(notes, "story.md") ||
		at.Hits[0].BM25Rank != 1 || at.Hits[0].VectorRank != 1 {
		t.Errorf("retrieval span attrs %s (%v)", retrieval.Attrs, err)
	}
	cite := `[1] ` + filepath.Join(notes, "story.md") + ":"
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.seen) != 1 || !slices.ContainsFunc(p.seen[0].Messages, func(m models.Message) bool {
		return m.Role == models.RoleTool && strings.Contains(m.Content, cite) && strings.Contains(m.Content, "big red ball")
	}) {
		t.Errorf("the real model was not sent the hit cited %s: %+v", cite, p.seen)
	}
}
