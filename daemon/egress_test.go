package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
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
	"github.com/keel-runtime/keel/policy"
)

// egressCanary is the text of a file that must not leave the machine
// once its grant labels it private: the tests grep every byte the cloud
// endpoint received for it. Letters, digits and dashes: JSON carries it
// unescaped.
const egressCanary = "KEEL-CANARY-5c1e0d9b-private"

// egress is a daemon set up for the egress tests: a cloud provider (an
// OpenAI-compatible endpoint on loopback that records every request),
// allowed by allow_cloud, as the route "default"'s first target, with
// the daemon's local provider as its fallback; readfile granted the
// directory secrets, which holds secret.txt with the canary.
type egress struct {
	d     *started
	c     *client.Client
	cloud *openaitest.Server
}

// egressConfig says how to set up an egress daemon.
type egressConfig struct {
	labelled   bool            // grant readfile's directory --private
	grantLabel string          // grant readfile's directory --label grantLabel
	local      models.Provider // the daemon's local provider ("ollama")
	localModel string          // the route's fallback: a model of local; "": none
	ctxLength  int             // of the cloud model; 0: 16384
	tools      []string        // bundled tools installed; readfile is granted
	secret     string          // secret.txt's content; "": a line with the canary
	ollama     map[string]any  // the "ollama" entry of models.json, if any
	managed    string          // the managed policy file's content; "": none
	user       string          // the user policy file's content ($SECRETS: readfile's directory); "": none
	fetchNet   []string        // fetch's network grants (net:...); loopback is then reachable
}

func startEgress(t *testing.T, cfg egressConfig) egress {
	t.Helper()
	cloud := openaitest.New(t)
	dir := withTools(t, cfg.tools...)
	route := map[string]any{"name": "default", "targets": []any{map[string]any{"provider": "cloud", "model": openaitest.ChatModel}}}
	if cfg.localModel != "" {
		route["fallback"] = []any{map[string]any{"provider": "ollama", "model": cfg.localModel}}
	}
	mc := map[string]any{
		"allow_cloud": true,
		"providers": map[string]any{"cloud": map[string]any{
			"base_url": cloud.URL(), "max_retries": -1,
			"models": []any{map[string]any{"name": openaitest.ChatModel, "context_length": cmpOr(cfg.ctxLength, 16384),
				"capabilities": []string{"completion", "tools"}}},
		}},
		"routes": []any{route},
	}
	if cfg.ollama != nil {
		mc["ollama"] = cfg.ollama
	}
	writeModelsConfig(t, dir, mc)
	// secret.txt, in the directory readfile is granted.
	secrets, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	secret := cmpOr(cfg.secret, "Jane Roe's account: "+egressCanary+"\n")
	if err := os.WriteFile(filepath.Join(secrets, "secret.txt"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	managed := filepath.Join(t.TempDir(), "policy.json")
	for file, content := range map[string]string{managed: cfg.managed, policy.UserPath(dir): cfg.user} {
		if content == "" {
			continue
		}
		if err := os.WriteFile(file, []byte(strings.ReplaceAll(content, "$SECRETS", secrets)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: cfg.local, ManagedPolicyFile: managed, ToolsAllowPrivateNetwork: len(cfg.fetchNet) > 0})
	c := dial(t, d.dir)
	grant := func(args ...string) {
		t.Helper()
		args = append([]string{"tools", "grant"}, args...)
		if out, errs, code := runCLI(context.Background(), d.dir, args...); code != 0 {
			t.Fatalf("keel %s = %d:\n%s%s", strings.Join(args, " "), code, out, errs)
		}
	}
	if len(cfg.fetchNet) > 0 {
		grant(append([]string{"fetch"}, cfg.fetchNet...)...)
	}
	if slices.Contains(cfg.tools, "readfile") {
		args := []string{"readfile", "fs:/workspace=" + secrets}
		if cfg.labelled {
			args = append(args, "--private")
		}
		if cfg.grantLabel != "" {
			args = append(args, "--label", cfg.grantLabel)
		}
		grant(args...)
	}
	return egress{d: d, c: c, cloud: cloud}
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// chats returns the chat requests the cloud endpoint received.
func (e egress) chats() []openaitest.Request {
	var out []openaitest.Request
	for _, r := range e.cloud.Requests() {
		if r.Path == openaitest.ChatPath {
			out = append(out, r)
		}
	}
	return out
}

// noLeak fails the test if any byte sequence of the canary reached the
// cloud endpoint: in any request, header or body.
func (e egress) noLeak(t *testing.T) {
	t.Helper()
	for _, r := range e.cloud.Find(egressCanary) {
		t.Errorf("the cloud endpoint received the labelled file's content: %s %s %.400s", r.Method, r.Path, r.Body)
	}
}

// readResult returns the data of the tool.result of readfile that read
// the canary, failing the test if none did.
func readResult(t *testing.T, evs []keel.Event) keel.ToolResultData {
	t.Helper()
	for _, ev := range evs {
		if ev.Type != keel.EventToolResult || !strings.Contains(string(ev.Data), egressCanary) {
			continue
		}
		var d keel.ToolResultData
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	t.Fatalf("readfile never read secret.txt; events %v", evTypes(evs))
	return keel.ToolResultData{}
}

// cloudRefusals returns the errors of the attempts a model span records
// at the cloud provider that the policy refused (nothing sent).
func cloudRefusals(t *testing.T, sp keel.Span) []string {
	t.Helper()
	if len(sp.Attrs) == 0 {
		return nil
	}
	var attrs struct {
		Attempts []models.Attempt `json:"attempts"`
	}
	if err := json.Unmarshal(sp.Attrs, &attrs); err != nil {
		t.Fatalf("span %s attrs %s: %v", sp.ID, sp.Attrs, err)
	}
	var out []string
	for _, a := range attrs.Attempts {
		if a.Provider == "cloud" && a.Kind == models.KindPolicy {
			out = append(out, a.Error)
		}
	}
	return out
}

// modelSpans returns the run's model call spans, by step.
func modelSpans(spans []keel.Span) map[int]keel.Span {
	out := map[int]keel.Span{}
	for _, sp := range spans {
		if sp.Kind == keel.SpanModelCall {
			out[sp.Step] = sp
		}
	}
	return out
}

// wantRefusedForLabel checks that the model span of a step after the
// labelled read did not go to the cloud: the cloud target was refused by
// the policy naming the label, and the call was served locally.
func wantRefusedForLabel(t *testing.T, sp keel.Span, what string) {
	t.Helper()
	wantRefusedFor(t, sp, "private", what)
}

// wantRefusedFor is wantRefusedForLabel for the label label.
func wantRefusedFor(t *testing.T, sp keel.Span, label, what string) {
	t.Helper()
	refusals := cloudRefusals(t, sp)
	if len(refusals) == 0 || !strings.Contains(refusals[0], label) {
		t.Errorf("%s: model span (provider %q, attrs %s) records no policy refusal of the cloud naming the label %s", what, sp.Provider, sp.Attrs, label)
	}
	if sp.Provider != "ollama" {
		t.Errorf("%s: served by %q, want the local fallback (ollama)", what, sp.Provider)
	}
}

// docExample returns the JSON example that follows heading in
// docs/policy.md.
func docExample(t *testing.T, heading string) string {
	t.Helper()
	page, err := os.ReadFile(filepath.Join("..", "docs", "policy.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(page), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/policy.md has no heading %q", heading)
	}
	_, block, ok := strings.Cut(after, "```json\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatalf("docs/policy.md has no JSON example after %q", heading)
	}
	return block
}

// target is an HTTP server on loopback that a fetch may reach: it
// counts the requests it receives.
type target struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []string // request paths
}

func newTarget(t *testing.T) *target {
	tg := &target{}
	tg.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tg.mu.Lock()
		tg.got = append(tg.got, r.URL.Path)
		tg.mu.Unlock()
		io.WriteString(w, "items: none")
	}))
	t.Cleanup(tg.srv.Close)
	return tg
}

// requests returns the paths of the requests the target received.
func (tg *target) requests() []string {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return slices.Clone(tg.got)
}

// grant is the fetch grant that reaches the target.
func (tg *target) grant() string { return "net:" + tg.srv.URL }

// fetchResults returns the tool.result data of the run's fetch calls, in
// order.
func fetchResults(t *testing.T, evs []keel.Event) []keel.ToolResultData {
	t.Helper()
	var out []keel.ToolResultData
	for _, ev := range evs {
		var d keel.ToolResultData
		if ev.Type == keel.EventToolResult && json.Unmarshal(ev.Data, &d) == nil && d.Name == "fetch" {
			out = append(out, d)
		}
	}
	return out
}

// resultText shows a tool result in a failure message.
func resultText(d keel.ToolResultData) string {
	if d.Error != nil {
		return fmt.Sprintf("error %s: %s", d.Error.Code, d.Error.Message)
	}
	return string(d.Output)
}

// hasLabel reports whether labels holds label.
func hasLabel(labels []string, label string) bool { return slices.Contains(labels, label) }

// TestEgressEndToEnd is issue 16's egress test, through the real daemon,
// WebSocket, SQLite and bundled tools, against an OpenAI-compatible
// endpoint on loopback that records every byte it receives, allowed by
// allow_cloud: a run reads a file from a grant labelled private and then
// asks the cloud route: the endpoint receives no byte of that file, the
// call goes local; the same run with the grant unlabelled does reach the
// cloud (so the grep can fail); a fetch after the labelled read waits for
// approval; a summary of the labelled text is labelled, and the cloud
// stays refused after it. And docs/policy.md's two examples, read from
// the page, in force in the daemon: under the "no data leaves this
// laptop" managed file the cloud endpoint receives nothing and fetch
// reaches nothing; in a run whose workspace has the project file, fetch
// reaches the project's API (a loopback server) and not another
// destination it is granted.
// Also: on a route with no local target the call is denied, the reason
// journaled; a label of one's own, from the grant (--label) or the
// policy's sources, keeps the file off the cloud, the decision journaled
// on model.result, unless clear lets it go to that provider; clear does
// not let private data go.
func TestEgressEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	readCall := openaitest.Reply{ToolCalls: []openaitest.ToolCall{{ID: "call_read", Name: "readfile", Arguments: `{"path":"secret.txt"}`}}}
	const fetchArgs = `{"url":"https://example.com/"}`

	// The real local model answers after the cloud is refused.
	t.Run("labelled read goes to the real Ollama", func(t *testing.T) {
		t.Parallel()
		e := startEgress(t, egressConfig{labelled: true, local: realOllama(t), localModel: envOr("KEEL_TEST_OLLAMA_MODEL", "keel-tiny"),
			tools: []string{"readfile"}, ollama: map[string]any{"default_max_tokens": 32}})
		e.cloud.Script(readCall)
		run, err := e.c.StartRun(ctx, protocol.RunStartParams{Goal: "What is in secret.txt?", Model: "default", MaxSteps: 2,
			Policy: keel.RunPolicy{AllowCloud: true, Tools: []string{"readfile"}}})
		if err != nil {
			t.Fatal(err)
		}
		evs := follow(t, e.c, run.ID)
		if res := readResult(t, evs); !hasLabel(res.Labels, "private") {
			t.Errorf("the labelled read's tool.result has labels %v, want private", res.Labels)
		}
		e.noLeak(t)
		if n := len(e.chats()); n != 1 {
			t.Errorf("the cloud endpoint received %d chat requests, want only the one before the labelled read", n)
		}
		got, err := e.c.GetRun(ctx, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		sp, ok := modelSpans(got.Spans)[2]
		if !ok {
			t.Fatalf("no model call after the labelled read; run %s %q, events %v", got.Run.Status, got.Run.Error, evTypes(evs))
		}
		wantRefusedForLabel(t, sp, "step 2")
		if sp.Status != keel.SpanOK || sp.CompletionTokens <= 0 {
			t.Errorf("step 2 on the real Ollama: span %s %q with %d completion tokens, want an answer", sp.Status, sp.Error, sp.CompletionTokens)
		}
		for _, ev := range evs {
			var d keel.ModelResultData
			if ev.Type == keel.EventModelResult && json.Unmarshal(ev.Data, &d) == nil && d.Step == 2 && !hasLabel(d.Labels, "private") {
				t.Errorf("model.result of step 2 (answered from the labelled context) has labels %v, want private", d.Labels)
			}
		}
	})

	// The labelled read, then the local model asks for fetch: the call
	// waits for a person, whatever its side-effect class, because
	// labelled data is in the context.
	t.Run("labelled read stays local and fetch asks", func(t *testing.T) {
		t.Parallel()
		local := scripted.New(nil, scripted.CallTool("fetch", fetchArgs), scripted.Answer("done"))
		e := startEgress(t, egressConfig{labelled: true, local: local, localModel: scripted.DefaultModel.Name, tools: []string{"readfile", "fetch"}})
		e.cloud.Script(readCall)
		run, err := e.c.StartRun(ctx, protocol.RunStartParams{Goal: "What is in secret.txt?", Model: "default", MaxSteps: 4, Policy: keel.RunPolicy{AllowCloud: true}})
		if err != nil {
			t.Fatal(err)
		}
		ev := waitEvent(t, e.d.dir, run.ID, keel.EventApprovalAsked)
		var ask keel.ApprovalRequestData
		if err := json.Unmarshal(ev.Data, &ask); err != nil {
			t.Fatal(err)
		}
		if ask.Call.Name != "fetch" || ask.Policy == nil || ask.Policy.Outcome != "ask" || !strings.Contains(ask.Policy.Explanation, "label") {
			t.Errorf("approval.requested = %s, want fetch asked by the policy for egress after labelled data", ev.Data)
		}
		e.noLeak(t)
		if n := len(e.chats()); n != 1 {
			t.Errorf("the cloud endpoint received %d chat requests, want only the one before the labelled read", n)
		}
		// The labelled data went to the local model instead.
		reqs := local.Requests()
		if len(reqs) == 0 || !slices.ContainsFunc(reqs[0].Messages, func(m models.Message) bool { return strings.Contains(m.Content, egressCanary) }) {
			t.Errorf("the local model was not sent the labelled read (%d requests)", len(reqs))
		}
		got, err := e.c.GetRun(ctx, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		if res := readResult(t, got.Events); !hasLabel(res.Labels, "private") {
			t.Errorf("the labelled read's tool.result has labels %v, want private", res.Labels)
		}
		if sp, ok := modelSpans(got.Spans)[2]; !ok {
			t.Errorf("no model span for step 2")
		} else {
			wantRefusedForLabel(t, sp, "step 2")
		}
		if got.Run.Status != keel.RunWaiting {
			t.Errorf("run = %s %q, want waiting for the approval of fetch", got.Run.Status, got.Run.Error)
		}
	})

	// The control: the same run with the grant unlabelled sends the file
	// to the cloud (the grep above finds what leaks) and its fetch runs
	// without asking.
	t.Run("unlabelled read reaches the cloud", func(t *testing.T) {
		t.Parallel()
		e := startEgress(t, egressConfig{local: scripted.New(nil), localModel: scripted.DefaultModel.Name, tools: []string{"readfile", "fetch"}})
		e.cloud.Script(readCall, openaitest.Reply{ToolCalls: []openaitest.ToolCall{{ID: "call_fetch", Name: "fetch", Arguments: fetchArgs}}})
		got := runToEnd(t, e.c, protocol.RunStartParams{Goal: "What is in secret.txt?", Model: "default", MaxSteps: 4, Policy: keel.RunPolicy{AllowCloud: true}})
		if got.Run.Status != keel.RunSucceeded {
			t.Errorf("run = %s %q, want succeeded on the cloud", got.Run.Status, got.Run.Error)
		}
		if res := readResult(t, got.Events); len(res.Labels) != 0 || res.Private {
			t.Errorf("the unlabelled read's tool.result has labels %v (private %v), want none", res.Labels, res.Private)
		}
		if leaked := e.cloud.Find(egressCanary); len(leaked) == 0 {
			t.Errorf("the cloud endpoint never received the unlabelled file: the leak check would not see a leak")
		}
		if n := len(e.chats()); n != 3 {
			t.Errorf("the cloud endpoint received %d chat requests, want 3 (read, fetch, answer)", n)
		}
		var fetched bool
		for _, ev := range got.Events {
			switch {
			case ev.Type == keel.EventApprovalAsked:
				t.Errorf("approval asked with no labelled data in the context: %s", ev.Data)
			case ev.Type == keel.EventToolResult && strings.Contains(string(ev.Data), `"name":"fetch"`):
				fetched = true
			}
		}
		if !fetched {
			t.Errorf("fetch did not run; events %v", evTypes(got.Events))
		}
	})

	// The run goes on locally, counting words of more text than the
	// context holds, so its older steps, the labelled read among them,
	// are summarized: the summary (which keeps the canary) is labelled,
	// and every later model call still refuses the cloud, though no
	// labelled tool result is left in the context.
	t.Run("summary of labelled text is labelled", func(t *testing.T) {
		t.Parallel()
		p, counts := summarizingModel(egressCanary)
		e := startEgress(t, egressConfig{labelled: true, local: p, localModel: scripted.DefaultModel.Name, ctxLength: 1200,
			tools: []string{"readfile", "wordcount"}, secret: "Jane Roe's account: " + egressCanary + "\n" + strings.Repeat("dolor sit amet ", 60)})
		e.cloud.Script(readCall)
		got := runToEnd(t, e.c, protocol.RunStartParams{Goal: "What is in secret.txt?", Model: "default", MaxSteps: 8, Policy: keel.RunPolicy{AllowCloud: true}})
		if got.Run.Status != keel.RunSucceeded {
			t.Errorf("run = %s %q", got.Run.Status, got.Run.Error)
		}
		if summaries, steps := counts(); summaries == 0 {
			t.Fatalf("no summary was asked of the local model (%d steps); the test needs one", steps)
		}
		first := 0 // the step of the first summary of the labelled read
		for _, ev := range got.Events {
			var d keel.ContextSummaryData
			if ev.Type != keel.EventContextSummary || json.Unmarshal(ev.Data, &d) != nil || d.Messages == 0 {
				continue
			}
			if !strings.Contains(d.Summary, egressCanary) {
				continue // a summary of other steps
			}
			if first == 0 {
				first = d.Step
			}
			if !hasLabel(d.Labels, "private") {
				t.Errorf("context.summarized of step %d holds the labelled text but has labels %v, want private", d.Step, d.Labels)
			}
		}
		if first == 0 {
			t.Fatalf("no summary holds the labelled text; events %v", evTypes(got.Events))
		}
		spans := modelSpans(got.Spans)
		after := 0
		for step, sp := range spans {
			if step >= first {
				after++
				wantRefusedForLabel(t, sp, fmt.Sprintf("step %d, after the summary", step))
			}
		}
		if after == 0 {
			t.Errorf("no model call after the summary of step %d", first)
		}
		e.noLeak(t)
		if n := len(e.chats()); n != 1 {
			t.Errorf("the cloud endpoint received %d chat requests, want only the one before the labelled read", n)
		}
	})
	// docs/policy.md's "no data leaves this laptop" managed file, as the
	// daemon's managed layer: a run allowed to use the cloud sends the
	// cloud endpoint nothing at all (the route goes local), and a fetch
	// granted a destination reaches nothing.
	t.Run("no data leaves this laptop", func(t *testing.T) {
		t.Parallel()
		api := newTarget(t)
		local := scripted.New(nil, scripted.CallTool("fetch", `{"url":"`+api.srv.URL+`/v1/items"}`), scripted.Answer("done"))
		e := startEgress(t, egressConfig{local: local, localModel: scripted.DefaultModel.Name, tools: []string{"fetch"},
			managed: docExample(t, "### No data leaves this laptop (managed)"), fetchNet: []string{api.grant()}})
		got := runToEnd(t, e.c, protocol.RunStartParams{Goal: "fetch the items", Model: "default", MaxSteps: 3, Policy: keel.RunPolicy{AllowCloud: true}})
		if got.Run.Status != keel.RunSucceeded {
			t.Errorf("run = %s %q, want succeeded on the local model", got.Run.Status, got.Run.Error)
		}
		if n := len(e.chats()); n != 0 {
			t.Errorf("the cloud endpoint received %d chat requests under the no-data-leaves managed file", n)
		}
		sp := modelSpans(got.Spans)[1]
		if r := cloudRefusals(t, sp); len(r) == 0 || !strings.Contains(r[0], "no cloud model calls") || !strings.Contains(r[0], "managed") {
			t.Errorf("step 1's refusals of the cloud = %q, want the managed file's cloud setting named", r)
		}
		if reqs := api.requests(); len(reqs) != 0 {
			t.Errorf("fetch reached %v under the no-data-leaves managed file", reqs)
		}
		if res := fetchResults(t, got.Events); len(res) != 1 || res[0].Error == nil || res[0].Error.Code != keel.ToolPolicyDenied {
			for _, r := range res {
				t.Errorf("fetch result: %s", resultText(r))
			}
			t.Errorf("fetch results: %d, want one refused by the policy", len(res))
		}
	})

	// docs/policy.md's project example, with its API at a loopback
	// server, as the .keel/policy.json of the workspace a run names:
	// fetch reaches the project's API and not another destination it is
	// granted; the same run outside the workspace reaches both.
	t.Run("fetch only to the project's API", func(t *testing.T) {
		t.Parallel()
		api, other := newTarget(t), newTarget(t)
		ws := t.TempDir()
		project := strings.ReplaceAll(docExample(t, "### A project whose `fetch` may only reach its own API (workspace)"), "https://api.myproject.dev", api.srv.URL)
		if err := os.MkdirAll(filepath.Join(ws, ".keel"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ws, ".keel", "policy.json"), []byte(project), 0o600); err != nil {
			t.Fatal(err)
		}
		local := scripted.ByGoal(nil, func(string) []scripted.Step {
			return []scripted.Step{scripted.CallTool("fetch", `{"url":"`+api.srv.URL+`/v1/items"}`),
				scripted.CallTool("fetch", `{"url":"`+other.srv.URL+`/v1/other"}`), scripted.Answer("done")}
		})
		e := startEgress(t, egressConfig{local: local, localModel: scripted.DefaultModel.Name, tools: []string{"fetch"},
			fetchNet: []string{api.grant(), other.grant()}})
		fetches := func(p protocol.RunStartParams) []keel.ToolResultData {
			t.Helper()
			got := runToEnd(t, e.c, p)
			if got.Run.Status != keel.RunSucceeded {
				t.Errorf("%s: run = %s %q", p.Goal, got.Run.Status, got.Run.Error)
			}
			res := fetchResults(t, got.Events)
			if len(res) != 2 {
				t.Fatalf("%s: %d fetch results, want 2", p.Goal, len(res))
			}
			return res
		}

		res := fetches(protocol.RunStartParams{Goal: "fetch the items in the workspace", Model: scripted.DefaultModel.Name, MaxSteps: 4, Workspace: ws})
		if reqs := api.requests(); len(reqs) != 1 || res[0].Error != nil {
			t.Errorf("fetch to the project's API: result %s, the API received %v; want one request answered", resultText(res[0]), reqs)
		}
		if reqs := other.requests(); len(reqs) != 0 || res[1].Error == nil || res[1].Error.Code != keel.ToolPolicyDenied {
			t.Errorf("fetch to another destination: result %s, it received %v; want refused by the policy, nothing sent", resultText(res[1]), reqs)
		}

		res = fetches(protocol.RunStartParams{Goal: "fetch the items outside the workspace", Model: scripted.DefaultModel.Name, MaxSteps: 4})
		if reqs := other.requests(); len(reqs) != 1 || res[1].Error != nil {
			t.Errorf("outside the workspace, fetch to another destination: result %s, it received %v; want it answered", resultText(res[1]), reqs)
		}
	})

	// With no local target on the route, the call after the labelled
	// read is denied, and the journal says why.
	t.Run("labelled read on a cloud-only route is denied", func(t *testing.T) {
		t.Parallel()
		e := startEgress(t, egressConfig{labelled: true, local: scripted.New(nil), tools: []string{"readfile"}})
		e.cloud.Script(readCall)
		got := runToEnd(t, e.c, protocol.RunStartParams{Goal: "What is in secret.txt?", Model: "default", MaxSteps: 3, Policy: keel.RunPolicy{AllowCloud: true}})
		readResult(t, got.Events)
		e.noLeak(t)
		if n := len(e.chats()); n != 1 {
			t.Errorf("the cloud endpoint received %d chat requests, want only the one before the labelled read", n)
		}
		last := got.Events[len(got.Events)-1]
		var end keel.RunEndData
		if err := json.Unmarshal(last.Data, &end); err != nil {
			t.Fatal(err)
		}
		if last.Type != keel.EventRunFailed || !strings.Contains(end.Reason, string(models.KindPolicy)) || !strings.Contains(end.Reason, "private") {
			t.Errorf("the run's last event = %s %s, want run.failed by the policy naming the label private", last.Type, last.Data)
		}
	})

	// A label of one's own, given by the policy's sources (a path
	// pattern in the user's policy file) or by the grant (--label),
	// keeps the file off the cloud, and clearing it for the cloud
	// provider lets it go there.
	sources := func(label string) string { return `"sources": [{"path": "$SECRETS/**", "labels": ["` + label + `"]}]` }
	clear := func(label string) string { return `"clear": {"` + label + `": ["cloud"]}` }
	const own = "acme-confidential"
	for _, tt := range []struct {
		name, label, grantLabel, policy string
		cleared                         bool
	}{
		{"label from the policy's sources", own, "", "{" + sources(own) + "}", false},
		{"label from the policy's sources cleared for the provider", own, "", "{" + sources(own) + ", " + clear(own) + "}", true},
		{"label of the grant", own, own, "", false},
		{"label of the grant cleared for the provider", own, own, "{" + clear(own) + "}", true},
		// private is the one label clear cannot clear (docs/policy.md).
		{"private is never cleared", "private", "", "{" + sources("private") + ", " + clear("private") + "}", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := startEgress(t, egressConfig{local: scripted.New(nil, scripted.Answer("done")), localModel: scripted.DefaultModel.Name,
				tools: []string{"readfile"}, user: tt.policy, grantLabel: tt.grantLabel})
			e.cloud.Script(readCall)
			got := runToEnd(t, e.c, protocol.RunStartParams{Goal: "What is in secret.txt?", Model: "default", MaxSteps: 3, Policy: keel.RunPolicy{AllowCloud: true}})
			if got.Run.Status != keel.RunSucceeded {
				t.Errorf("run = %s %q", got.Run.Status, got.Run.Error)
			}
			if res := readResult(t, got.Events); !slices.Equal(res.Labels, []string{tt.label}) {
				t.Errorf("the read's tool.result has labels %v, want [%s]", res.Labels, tt.label)
			}
			if tt.cleared {
				if len(e.cloud.Find(egressCanary)) == 0 {
					t.Errorf("the label is cleared for the cloud provider, yet the file never reached it (%d chat requests)", len(e.chats()))
				}
				return
			}
			e.noLeak(t)
			if sp, ok := modelSpans(got.Spans)[2]; !ok {
				t.Errorf("no model span for step 2")
			} else {
				wantRefusedFor(t, sp, tt.label, "step 2")
			}
			// The journal records the decision that kept the call local
			// (for private too: the policy is asked before the model
			// layer's own private rule).
			var journaled bool
			for _, ev := range got.Events {
				var d keel.ModelResultData
				if ev.Type != keel.EventModelResult || json.Unmarshal(ev.Data, &d) != nil || d.Step != 2 {
					continue
				}
				for _, md := range d.Policy {
					journaled = journaled || md.Provider == "cloud" && md.Outcome == "deny" && strings.Contains(md.Explanation, tt.label)
				}
			}
			if !journaled {
				t.Errorf("step 2's model.result journals no policy decision denying the cloud for the label %s", tt.label)
			}
		})
	}
}
