package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
)

// TestDeclassifyClearsAndIsJournaled: a run started with the label pii
// holds it (ContextLabels); declassifying a label it does not hold, or
// without a reason or who, is refused with nothing journaled; declassifying
// pii journals labels.declassified with who and why and the labels left,
// and ContextLabels no longer holds it; a finished run refuses.
func TestDeclassifyClearsAndIsJournaled(t *testing.T) {
	t.Parallel()
	p := scripted.New(nil, scripted.CallTool("write", `{"n":1}`), scripted.Answer("done"))
	st, eng := newEngine(t, engine.Config{Model: p, Tools: &echoTools{}, RequireApproval: []keel.SideEffect{keel.SideEffectNonIdempotentWrite}})
	ctx := context.Background()
	r, err := eng.Start(ctx, engine.StartRequest{Goal: "write it", Policy: keel.RunPolicy{Labels: []string{"pii", "secret"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitRun(t, eng, st, r.ID); got.Status != keel.RunWaiting {
		t.Fatalf("run = %s %q, want waiting", got.Status, got.Error)
	}
	if got, err := eng.ContextLabels(ctx, r.ID); err != nil || !slices.Equal(got, []string{"pii", "secret"}) {
		t.Fatalf("ContextLabels = %v, %v; want [pii secret]", got, err)
	}
	n := len(journal(t, st, r.ID))
	for _, bad := range []keel.DeclassifyRequest{
		{RunID: r.ID, Label: "private", By: "ada", Reason: "fine"},
		{RunID: r.ID, Label: "pii", By: "ada"},
		{RunID: r.ID, Label: "pii", Reason: "fine"},
		{RunID: r.ID, Label: "PII!", By: "ada", Reason: "fine"},
	} {
		if _, err := eng.Declassify(ctx, bad); !errors.Is(err, keel.ErrInvalid) {
			t.Errorf("Declassify(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := eng.Declassify(ctx, keel.DeclassifyRequest{RunID: r.ID, Label: "private", By: "ada", Reason: "fine"}); err == nil || !strings.Contains(err.Error(), "pii, secret") {
		t.Errorf("Declassify of a label not held = %v, want it to name what the context holds", err)
	}
	if _, err := eng.Declassify(ctx, keel.DeclassifyRequest{RunID: "run_nope", Label: "pii", By: "ada", Reason: "fine"}); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("Declassify of an unknown run = %v, want ErrNotFound", err)
	}
	if got := len(journal(t, st, r.ID)); got != n {
		t.Fatalf("refused declassifications journaled %d events", got-n)
	}
	d, err := eng.Declassify(ctx, keel.DeclassifyRequest{RunID: r.ID, Label: "pii", By: "ada", Reason: "the customer consented"})
	if err != nil {
		t.Fatal(err)
	}
	want := keel.DeclassifyData{Label: "pii", By: "ada", Reason: "the customer consented", Labels: []string{"secret"}}
	if !slices.Equal(d.Labels, want.Labels) || d.Label != want.Label || d.By != want.By || d.Reason != want.Reason {
		t.Errorf("Declassify = %+v, want %+v", d, want)
	}
	got, ok := eventData[keel.DeclassifyData](t, journal(t, st, r.ID), keel.EventDeclassified)
	if !ok || got.Label != "pii" || got.By != "ada" || got.Reason != want.Reason || !slices.Equal(got.Labels, want.Labels) {
		t.Errorf("journaled labels.declassified = %+v (%v), want %+v", got, ok, want)
	}
	if got, err := eng.ContextLabels(ctx, r.ID); err != nil || !slices.Equal(got, []string{"secret"}) {
		t.Errorf("ContextLabels after = %v, %v; want [secret]", got, err)
	}
	if _, err := eng.Cancel(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Declassify(ctx, keel.DeclassifyRequest{RunID: r.ID, Label: "secret", By: "ada", Reason: "fine"}); !errors.Is(err, keel.ErrConflict) {
		t.Errorf("Declassify on a cancelled run = %v, want ErrConflict", err)
	}
}

// TestStartRefusesMalformedLabels: a run's input labels are checked.
func TestStartRefusesMalformedLabels(t *testing.T) {
	t.Parallel()
	_, eng := newEngine(t, engine.Config{Model: scripted.New(nil), Tools: &echoTools{}})
	if _, err := eng.Start(context.Background(), engine.StartRequest{Goal: "g", Policy: keel.RunPolicy{Labels: []string{"Bad Label"}}}); !errors.Is(err, keel.ErrInvalid) {
		t.Errorf("Start with a malformed label = %v, want ErrInvalid", err)
	}
}

// labelTools is a tool host that records what each call touched, as
// wasmtools does: "read" opens a file under /data/hr and gets its
// grant's label from the host; "mail" touches nothing (the policy's tool
// source labels it); "fetch" requests the network (NetworkRequester) and
// asks the call's egress check before its request to the "url" argument
// (CallTargeter marks it); "sneaky" does the same without saying it
// reaches the network. onCall, if set, runs inside every call.
type labelTools struct {
	mu      sync.Mutex
	egress  map[string]error // by call ID: what the egress check said
	onCall  func(inv keel.ToolInvocation)
	outputs map[string]string // by tool: its output text, default "ok"
}

func (t *labelTools) Specs(context.Context) []keel.ToolSpec {
	obj := json.RawMessage(`{"type":"object"}`)
	return []keel.ToolSpec{
		{Name: "read", InputSchema: obj, SideEffects: keel.SideEffectReadOnly},
		{Name: "mail", InputSchema: obj, SideEffects: keel.SideEffectReadOnly},
		{Name: "fetch", InputSchema: obj, SideEffects: keel.SideEffectExternal},
		{Name: "sneaky", InputSchema: obj, SideEffects: keel.SideEffectReadOnly},
		{Name: "write", InputSchema: obj, SideEffects: keel.SideEffectNonIdempotentWrite},
		{Name: "many", InputSchema: obj, SideEffects: keel.SideEffectReadOnly},
	}
}

func (t *labelTools) RequestsNetwork(name string) bool { return name == "fetch" }

func (t *labelTools) CallTargets(name string, args json.RawMessage) keel.CallTargets {
	var in struct {
		URL string `json:"url"`
	}
	if json.Unmarshal(args, &in) == nil && in.URL != "" {
		return keel.CallTargets{URLs: []string{in.URL}}
	}
	return keel.CallTargets{}
}

func (t *labelTools) Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	if inv.Touched == nil {
		return nil, fmt.Errorf("call %s without a Touched to fill", inv.CallID)
	}
	if t.onCall != nil {
		t.onCall(inv)
	}
	switch inv.Name {
	case "read":
		inv.Touched.Paths = []string{"/data/hr/staff.csv"}
		inv.Touched.Labels = []string{"grant-x"}
	case "many": // opened more files than the host could list
		inv.Touched.Paths, inv.Touched.Truncated = []string{"/data/public/a.txt"}, true
	case "fetch", "sneaky":
		var in struct {
			URL string `json:"url"`
		}
		_ = json.Unmarshal(inv.Args, &in)
		err := inv.Egress(ctx, in.URL)
		t.mu.Lock()
		if t.egress == nil {
			t.egress = map[string]error{}
		}
		t.egress[inv.CallID] = err
		t.mu.Unlock()
		if err != nil {
			return nil, &keel.ToolError{Code: keel.ToolPermissionDenied, Message: err.Error()}
		}
	}
	out := "ok"
	t.mu.Lock()
	if o, ok := t.outputs[inv.Name]; ok {
		out = o
	}
	t.mu.Unlock()
	return json.Marshal(map[string]string{"text": out})
}

func (t *labelTools) egressOf(callID string) (error, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	err, ok := t.egress[callID]
	return err, ok
}

const labelSources = `{"sources": [
  {"path": "/data/hr/**", "labels": ["pii"]},
  {"tool": "mail", "labels": ["secret"]},
  {"source": "human", "labels": ["said"]},
  {"source": "input", "labels": ["goal"]}
]}`

// requestLabels returns a function for scripted replies that records the
// labels of each request it answers, and the recorded lists.
type labelLog struct {
	mu   sync.Mutex
	reqs [][]string
}

func (l *labelLog) see(req models.ChatRequest) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reqs = append(l.reqs, req.LabelSet())
	return len(l.reqs)
}

func (l *labelLog) get() [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs)
}

// TestLabelsFromEachSourceReachTheContext: labels from every source
// enter the run's context and the journal: the run's inputs (its own
// and the policy's input source), a tool result (the host's grant label
// and the policy's path source for the file it touched; the policy's
// tool source), a person's message (its own labels and the policy's
// human source). Each model call carries what the context held then,
// which is also what its model.result journals and what the fold of the
// journal before it gives (live == fold); spans carry them too; and the
// final ContextLabels is the union.
func TestLabelsFromEachSourceReachTheContext(t *testing.T) {
	t.Parallel()
	pol := &swappable{}
	pol.set(t, 1, labelSources)
	var seen labelLog
	p := scripted.New(nil, scripted.Repeat(scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
		switch seen.see(req) {
		case 1:
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "r1", Name: "read", Arguments: json.RawMessage(`{}`)}}}}, nil
		case 2:
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "m1", Name: "mail", Arguments: json.RawMessage(`{}`)}}}}, nil
		case 3:
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "e1", Name: "mail", Arguments: json.RawMessage(`{}`)}}}}, nil
		}
		return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
	})))
	tools := &labelTools{}
	st, eng := newEngine(t, engine.Config{Model: p, Tools: tools, Policy: pol})
	ctx := context.Background()
	said := make(chan error, 1)
	var id keel.RunID
	started := make(chan struct{}) // closed once id is set
	tools.onCall = func(inv keel.ToolInvocation) {
		<-started               // the call can come before Start has returned the run's ID
		if inv.CallID == "m1" { // a person speaks while the run works
			_, err := eng.SayLabeled(ctx, id, "use the 2025 list", []string{"mine"})
			said <- err
		}
	}
	run, err := eng.Start(ctx, engine.StartRequest{Goal: "summarize the staff list", Policy: keel.RunPolicy{Labels: []string{"in"}}})
	if err != nil {
		t.Fatal(err)
	}
	id = run.ID
	close(started)
	if r := waitRun(t, eng, st, run.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	if err := <-said; err != nil {
		t.Fatal(err)
	}
	evs := journal(t, st, run.ID)
	run, _ = st.GetRun(ctx, run.ID)
	for _, c := range []struct {
		call string
		want []string
	}{{"r1", []string{"grant-x", "pii"}}, {"m1", []string{"secret"}}} {
		for _, ev := range evs {
			var d keel.ToolResultData
			if ev.Type != keel.EventToolResult || json.Unmarshal(ev.Data, &d) != nil || d.CallID != c.call {
				continue
			}
			if !slices.Equal(d.Labels, c.want) {
				t.Errorf("tool.result %s labels = %q, want %q", c.call, d.Labels, c.want)
			}
			if c.call == "r1" && (d.Touched == nil || !slices.Equal(d.Touched.Paths, []string{"/data/hr/staff.csv"})) {
				t.Errorf("tool.result r1 touched = %+v, want the file it opened", d.Touched)
			}
		}
	}
	if d, _ := eventData[keel.HumanMessageData](t, evs, keel.EventHumanMessage); !slices.Equal(d.Labels, []string{"mine", "said"}) {
		t.Errorf("human.message labels = %q, want [mine said]", d.Labels)
	}
	// live == fold: each model call carried the fold of the journal
	// before its model.result, which journals the same.
	reqs := seen.get()
	step := 0
	for i, ev := range evs {
		if ev.Type != keel.EventModelResult {
			continue
		}
		var d keel.ModelResultData
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatal(err)
		}
		fold, err := engine.FoldLabels(run, evs[:i])
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(d.Labels, fold) || step >= len(reqs) || !slices.Equal(reqs[step], fold) {
			t.Errorf("step %d: model.result labels %q, request labels %q, fold of the journal before it %q; want all equal", d.Step, d.Labels, reqs[min(step, len(reqs)-1)], fold)
		}
		step++
	}
	want := []string{"goal", "grant-x", "in", "mine", "pii", "said", "secret"}
	if got := reqs[len(reqs)-1]; !slices.Equal(got, want) {
		t.Errorf("last request's labels = %q, want %q", got, want)
	}
	if got, err := eng.ContextLabels(ctx, run.ID); err != nil || !slices.Equal(got, want) {
		t.Errorf("ContextLabels = %q, %v; want %q", got, err, want)
	}
	if !slices.Equal(run.Policy.Labels, []string{"goal", "in"}) {
		t.Errorf("run's input labels = %q, want [goal in] (its own and the policy's input source)", run.Policy.Labels)
	}
	spans, err := st.Spans(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	var toolLabelled, modelLabelled bool
	for _, sp := range spans {
		var a struct {
			Labels []string `json:"labels"`
		}
		_ = json.Unmarshal(sp.Attrs, &a)
		toolLabelled = toolLabelled || sp.Kind == keel.SpanToolCall && slices.Equal(a.Labels, []string{"grant-x", "pii"})
		modelLabelled = modelLabelled || sp.Kind == keel.SpanModelCall && slices.Equal(a.Labels, want)
	}
	if !toolLabelled || !modelLabelled {
		t.Errorf("labels on spans: tool call %v, model call %v; want both", toolLabelled, modelLabelled)
	}
}

// TestResumeKeepsLabels: a run that read pii data and waits for an
// approval is picked up by another engine (a restarted daemon) over the
// same journal: its next model call still carries pii, and a replay
// reproduces the run, labels included.
func TestResumeKeepsLabels(t *testing.T) {
	t.Parallel()
	pol := &swappable{}
	pol.set(t, 1, labelSources)
	var seen labelLog
	p := scripted.New(nil, scripted.Repeat(scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
		switch seen.see(req) {
		case 1:
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "r1", Name: "read", Arguments: json.RawMessage(`{}`)}}}}, nil
		case 2:
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "w1", Name: "write", Arguments: json.RawMessage(`{}`)}}}}, nil
		}
		return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
	})))
	cfg := engine.Config{Model: p, Tools: &labelTools{}, Policy: pol, RequireApproval: []keel.SideEffect{keel.SideEffectNonIdempotentWrite}}
	st, eng := newEngine(t, cfg)
	ctx := context.Background()
	run, err := eng.Start(ctx, engine.StartRequest{Goal: "read then write"})
	if err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng, st, run.ID); r.Status != keel.RunWaiting {
		t.Fatalf("run = %s %q, want waiting", r.Status, r.Error)
	}
	if err := eng.Close(ctx); err != nil {
		t.Fatal(err)
	}
	cfg.Store = st
	eng2, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng2.Close(context.Background()) })
	asked, _ := eventData[keel.ApprovalRequestData](t, journal(t, st, run.ID), keel.EventApprovalAsked)
	if _, err := eng2.Approve(ctx, run.ID, keel.ApprovalData{CallID: "w1", ArgsSHA256: asked.ArgsSHA256, Approved: true}); err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng2, st, run.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("resumed run = %s %q", r.Status, r.Error)
	}
	reqs := seen.get()
	if len(reqs) != 3 || !slices.Equal(reqs[2], []string{"goal", "grant-x", "pii"}) {
		t.Errorf("requests' labels = %q, want the resumed call to carry [goal grant-x pii]", reqs)
	}
	replayMatches(t, eng2, st, run.ID)
}

// routerHarness is an engine over a router with a cloud target that
// falls back (when fallback) to a local one, both scripted.
func routerHarness(t *testing.T, pol engine.Policy, fallback bool) (*store.Store, *engine.Engine, *scripted.Provider, *scripted.Provider) {
	t.Helper()
	local := scripted.New(nil, scripted.Repeat(scripted.Answer("local answer")))
	cloud := scripted.New(nil, scripted.Repeat(scripted.Answer("cloud answer")))
	route := models.Route{Name: "default", Targets: []models.Target{{Provider: "cloud", Model: scripted.DefaultModel.Name}}}
	if fallback {
		route.Fallback = []models.Target{{Provider: "local", Model: scripted.DefaultModel.Name}}
	}
	r, err := models.NewRouter(models.RouterConfig{
		Providers:  map[string]models.ProviderConfig{"local": {Provider: local}, "cloud": {Provider: cloud, Cloud: true}},
		Routes:     []models.Route{route},
		AllowCloud: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	st, eng := newEngine(t, engine.Config{Model: r, Tools: &labelTools{}, Policy: pol})
	return st, eng, local, cloud
}

// TestLabelledContextStaysOffTheCloud: a run whose context holds pii
// (its input) and allows the cloud is refused by the cloud target before
// anything is sent, with no policy files at all (nothing is cleared by
// default), and falls back to the local target; without a fallback the
// step fails with the refusal. Clearing pii for the cloud provider lets
// it through; a run without labels reaches the cloud (the control).
func TestLabelledContextStaysOffTheCloud(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pii := engine.StartRequest{Goal: "about Ada", Model: "default", Policy: keel.RunPolicy{AllowCloud: true, Labels: []string{"pii"}}}
	plain := engine.StartRequest{Goal: "about the weather", Model: "default", Policy: keel.RunPolicy{AllowCloud: true}}

	st, eng, _, cloud := routerHarness(t, nil, true)
	r, err := eng.Start(ctx, pii)
	if err != nil {
		t.Fatal(err)
	}
	r = waitRun(t, eng, st, r.ID)
	spans := modelSpans(t, st, r.ID)
	if r.Result != "local answer" || len(cloud.Requests()) != 0 || len(spans) != 1 || !strings.Contains(string(spans[0].Attrs), "not cleared for cloud") {
		t.Errorf("pii run: %s %q, %d cloud requests, spans %+v; want the local answer, nothing sent to the cloud, the refusal on the span", r.Status, r.Result, len(cloud.Requests()), spans)
	}
	replayMatches(t, eng, st, r.ID)
	r, err = eng.Start(ctx, plain)
	if err != nil {
		t.Fatal(err)
	}
	if r = waitRun(t, eng, st, r.ID); r.Result != "cloud answer" {
		t.Errorf("run without labels: %s %q, want the cloud answer", r.Status, r.Result)
	}

	st, eng, _, cloud = routerHarness(t, nil, false)
	r, err = eng.Start(ctx, pii)
	if err != nil {
		t.Fatal(err)
	}
	if r = waitRun(t, eng, st, r.ID); r.Status != keel.RunFailed || !strings.Contains(r.Error, "labelled pii, not cleared for cloud") || len(cloud.Requests()) != 0 {
		t.Errorf("pii run without a fallback: %s %q, %d cloud requests; want failed with the policy's refusal, nothing sent", r.Status, r.Error, len(cloud.Requests()))
	}

	pol := &swappable{}
	pol.set(t, 1, `{"clear": {"pii": ["cloud"]}}`)
	st, eng, _, cloud = routerHarness(t, pol, false)
	r, err = eng.Start(ctx, pii)
	if err != nil {
		t.Fatal(err)
	}
	if r = waitRun(t, eng, st, r.ID); r.Result != "cloud answer" || len(cloud.Requests()) != 1 {
		t.Errorf("pii run with pii cleared for cloud: %s %q %q, want the cloud answer", r.Status, r.Result, r.Error)
	}
}

// TestSummaryOfLabelledContextIsLabelled: once a tool result labelled
// pii entered the context, the summary of older steps is asked for with
// pii, journaled with pii, and the summary message the later steps read
// carries it.
func TestSummaryOfLabelledContextIsLabelled(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("lorem ipsum ", 85)
	var mu sync.Mutex
	var summaryLabels [][]string
	var later [][]string
	steps := 0
	model := scripted.DefaultModel
	model.ContextLength = 1200
	p := scripted.New([]models.ModelInfo{model}, scripted.Repeat(scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(req.Messages[0].Content, "Summarize the following text") {
			summaryLabels = append(summaryLabels, req.LabelSet())
			return models.ChatResponse{Message: models.Message{Content: "SUMMARY"}}, nil
		}
		for _, m := range req.Messages {
			if strings.Contains(m.Content, "SUMMARY") {
				later = append(later, m.Labels)
			}
		}
		steps++
		if steps <= 5 {
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: fmt.Sprintf("c%d", steps), Name: "read", Arguments: json.RawMessage(`{}`)}}}}, nil
		}
		return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
	})))
	pol := &swappable{}
	pol.set(t, 1, `{"sources": [{"path": "/data/hr/**", "labels": ["pii"]}]}`)
	st, eng := newEngine(t, engine.Config{Model: p, Tools: &labelTools{outputs: map[string]string{"read": big}}, Policy: pol})
	r, err := eng.Start(context.Background(), engine.StartRequest{Goal: "read a lot", MaxSteps: 10})
	if err != nil {
		t.Fatal(err)
	}
	if r = waitRun(t, eng, st, r.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	sums := eventsOf(t, st, r.ID, keel.EventContextSummary)
	if len(sums) == 0 {
		t.Fatal("no summary; the test needs one")
	}
	for _, ev := range sums {
		var d keel.ContextSummaryData
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatal(err)
		}
		if d.Messages > 0 && !slices.Equal(d.Labels, []string{"grant-x", "pii"}) {
			t.Errorf("context.summarized labels = %q, want [grant-x pii]", d.Labels)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(summaryLabels) == 0 || len(later) == 0 {
		t.Fatalf("%d summary requests, %d later requests reading the summary; the test needs both", len(summaryLabels), len(later))
	}
	for _, ls := range slices.Concat(summaryLabels, later) {
		if !slices.Contains(ls, "pii") {
			t.Errorf("a summary request or summary message carries %q, want pii", ls)
		}
	}
}

// TestEgressAfterLabelsAsks: with no policy files, a tool that requests
// the network runs by itself while the context holds no label; after a
// result labelled pii it waits for a person's approval (the built-in
// egress_after_labels ask, journaled), and once approved its request
// passes the egress check. A tool that does not say it reaches the
// network is refused by the check at its request: no one approved its
// egress. A deny rule for the destination denies the call before it
// runs.
func TestEgressAfterLabelsAsks(t *testing.T) {
	t.Parallel()
	call := func(id, name, args string) scripted.Step {
		return scripted.CallTools(keel.ToolCall{ID: id, Name: name, Arguments: json.RawMessage(args)})
	}
	p := scripted.New(nil,
		call("f1", "fetch", `{"url":"https://api.test/a"}`),
		call("r1", "read", `{}`),
		call("f2", "fetch", `{"url":"https://api.test/b"}`),
		call("s1", "sneaky", `{"url":"https://api.test/c"}`),
		scripted.Answer("done"))
	tools := &labelTools{}
	pol := &swappable{}
	pol.set(t, 1, `{"sources": [{"path": "/data/hr/**", "labels": ["pii"]}]}`)
	st, eng := newEngine(t, engine.Config{Model: p, Tools: tools, Policy: pol})
	ctx := context.Background()
	r, err := eng.Start(ctx, engine.StartRequest{Goal: "fetch, read, fetch"})
	if err != nil {
		t.Fatal(err)
	}
	if r = waitRun(t, eng, st, r.ID); r.Status != keel.RunWaiting {
		t.Fatalf("run = %s %q, want waiting for the second fetch", r.Status, r.Error)
	}
	evs := journal(t, st, r.ID)
	asked, ok := eventData[keel.ApprovalRequestData](t, evs, keel.EventApprovalAsked)
	if !ok || asked.Call.Arguments == nil || !strings.Contains(string(asked.Call.Arguments), "api.test/b") || asked.Policy == nil ||
		asked.Policy.Outcome != "ask" || !strings.Contains(asked.Policy.Explanation, "network egress after labelled data") {
		t.Fatalf("approval.requested = %+v, want the second fetch asked by egress_after_labels", asked)
	}
	if err, ran := tools.egressOf("f1"); !ran || err != nil {
		t.Errorf("first fetch (no labels yet): egress check %v (ran %v), want allowed", err, ran)
	}
	if _, err := eng.Approve(ctx, r.ID, keel.ApprovalData{CallID: asked.Call.ID, ArgsSHA256: asked.ArgsSHA256, Approved: true}); err != nil {
		t.Fatal(err)
	}
	if r = waitRun(t, eng, st, r.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	if err, ran := tools.egressOf(asked.Call.ID); !ran || err != nil {
		t.Errorf("approved fetch: egress check %v (ran %v), want allowed", err, ran)
	}
	err, ran := tools.egressOf("s1")
	var refusal *engine.EgressRefusal
	if !ran || !errors.As(err, &refusal) || refusal.Decision.Outcome != "ask" || refusal.Destination != "https://api.test/c" {
		t.Errorf("sneaky's request after labelled data: egress check %v (ran %v), want an ask refusal naming the destination", err, ran)
	}
	if te := (*keel.ToolError)(nil); !errors.As(err, &te) || te.Code != keel.ToolPolicyDenied {
		t.Errorf("the refusal as a tool error = %v, want policy_denied", te)
	}

	// A deny rule on the destination: the call does not run.
	pol.set(t, 2, `{"sources": [{"path": "/data/hr/**", "labels": ["pii"]}], "rules": [{"action": "egress", "host": "evil.test", "decision": "deny"}]}`)
	p2 := scripted.New(nil, call("r1", "read", `{}`), call("f9", "fetch", `{"url":"https://evil.test/x"}`), scripted.Answer("done"))
	st2, eng2 := newEngine(t, engine.Config{Model: p2, Tools: tools, Policy: pol})
	r, err = eng2.Start(ctx, engine.StartRequest{Goal: "read then leak"})
	if err != nil {
		t.Fatal(err)
	}
	if r = waitRun(t, eng2, st2, r.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	if _, ran := tools.egressOf("f9"); ran {
		t.Error("the denied fetch ran")
	}
	var denied bool
	for _, ev := range eventsOf(t, st2, r.ID, keel.EventToolResult) {
		var d keel.ToolResultData
		_ = json.Unmarshal(ev.Data, &d)
		denied = denied || d.Error != nil && d.Error.Code == keel.ToolPolicyDenied && d.Policy != nil && d.Policy.Outcome == "deny"
	}
	if !denied {
		t.Error("no policy_denied result for the fetch to evil.test")
	}
}

// TestDeclassifyReachesTheLiveRun: a run whose context holds pii waits
// for an approval; a person declassifies pii; the run's next model call
// carries no pii, although its goal message was labelled with it.
func TestDeclassifyReachesTheLiveRun(t *testing.T) {
	t.Parallel()
	var seen labelLog
	p := scripted.New(nil, scripted.Repeat(scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
		if seen.see(req) == 1 {
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "w1", Name: "write", Arguments: json.RawMessage(`{}`)}}}}, nil
		}
		return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
	})))
	st, eng := newEngine(t, engine.Config{Model: p, Tools: &labelTools{}, RequireApproval: []keel.SideEffect{keel.SideEffectNonIdempotentWrite}})
	ctx := context.Background()
	r, err := eng.Start(ctx, engine.StartRequest{Goal: "write it", Policy: keel.RunPolicy{Labels: []string{"pii", "secret"}}})
	if err != nil {
		t.Fatal(err)
	}
	if r = waitRun(t, eng, st, r.ID); r.Status != keel.RunWaiting {
		t.Fatalf("run = %s %q, want waiting", r.Status, r.Error)
	}
	if _, err := eng.Declassify(ctx, keel.DeclassifyRequest{RunID: r.ID, Label: "pii", By: "ada", Reason: "consented"}); err != nil {
		t.Fatal(err)
	}
	asked, _ := eventData[keel.ApprovalRequestData](t, journal(t, st, r.ID), keel.EventApprovalAsked)
	if _, err := eng.Approve(ctx, r.ID, keel.ApprovalData{CallID: "w1", ArgsSHA256: asked.ArgsSHA256, Approved: true}); err != nil {
		t.Fatal(err)
	}
	if r = waitRun(t, eng, st, r.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	if reqs := seen.get(); len(reqs) != 2 || !slices.Equal(reqs[0], []string{"pii", "secret"}) || !slices.Equal(reqs[1], []string{"secret"}) {
		t.Errorf("requests' labels = %q, want [[pii secret] [secret]]", reqs)
	}
}

// labelledFlowTools is flowTools whose echo's host labels its output pii.
type labelledFlowTools struct{ *flowTools }

func (t labelledFlowTools) Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	out, err := t.flowTools.Call(ctx, inv)
	if inv.Name == "echo" && inv.Touched != nil {
		inv.Touched.Labels = []string{"pii"}
	}
	return out, err
}

// TestSubAgentLabelsReachTheParent: a sub-agent whose tool result is
// labelled pii ends with pii in its context; the parent's step.finished
// carries it, the parent's context holds it, and the step that depends
// on it and the composition of the answer are asked with pii.
func TestSubAgentLabelsReachTheParent(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	labels := map[string][][]string{} // by step, each request's labels
	m := &fakeModel{plan: func(int, models.ChatRequest) string {
		return `{"steps":[{"id":"a","goal":"read it","tools":["echo"]},{"id":"b","goal":"use it","depends_on":["a"]}]}`
	}, step: func(_ context.Context, step string, req models.ChatRequest) (models.ChatResponse, error) {
		mu.Lock()
		labels[step] = append(labels[step], req.LabelSet())
		mu.Unlock()
		if _, ok := lastTool(req); step == "a" && !ok {
			return callTool("echo"), nil
		}
		return text("result of " + step), nil
	}}
	st, eng := newEngine(t, engine.Config{Model: m.provider(), Tools: labelledFlowTools{newFlowTools()}})
	h := &flowHarness{st: st, eng: eng}
	r := h.start(t, engine.StartRequest{Kind: keel.KindPlan, Goal: "answer the question"})
	if r = waitRun(t, eng, st, r.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	var finished []string
	for _, ev := range eventsOf(t, st, r.ID, keel.EventStepFinished) {
		var d keel.StepData
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatal(err)
		}
		if d.StepID == "a" {
			finished = d.Labels
		}
	}
	if !slices.Equal(finished, []string{"pii"}) {
		t.Errorf("step a's step.finished labels = %q, want [pii]", finished)
	}
	if got, err := eng.ContextLabels(context.Background(), r.ID); err != nil || !slices.Equal(got, []string{"pii"}) {
		t.Errorf("parent's ContextLabels = %q, %v; want [pii]", got, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := labels["a"]; len(got) != 2 || len(got[0]) != 0 || !slices.Equal(got[1], []string{"pii"}) {
		t.Errorf("step a's requests' labels = %q, want [[] [pii]] (before and after the read)", got)
	}
	if got := labels["b"]; len(got) == 0 || slices.ContainsFunc(got, func(ls []string) bool { return !slices.Contains(ls, "pii") }) {
		t.Errorf("step b's requests' labels = %q, want pii on each", got)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.compose) == 0 || slices.ContainsFunc(m.compose, func(req models.ChatRequest) bool { return !slices.Contains(req.LabelSet(), "pii") }) {
		t.Errorf("composition requests (%d) do not all carry pii", len(m.compose))
	}
}

// TestTruncatedTouchedGetsEveryPathLabel: a call that opened more files
// than the host could list is labelled as if it had read every path the
// policy's sources label, although the paths listed match none.
func TestTruncatedTouchedGetsEveryPathLabel(t *testing.T) {
	t.Parallel()
	pol := &swappable{}
	pol.set(t, 1, `{"sources": [{"path": "/data/hr/**", "labels": ["pii"]}, {"path": "/keys/**", "labels": ["secret"]}, {"tool": "mail", "labels": ["mail"]}]}`)
	p := scripted.New(nil, scripted.CallTool("many", `{}`), scripted.Answer("done"))
	st, eng := newEngine(t, engine.Config{Model: p, Tools: &labelTools{}, Policy: pol})
	r, err := eng.Start(context.Background(), engine.StartRequest{Goal: "read everything"})
	if err != nil {
		t.Fatal(err)
	}
	if r = waitRun(t, eng, st, r.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	d, _ := eventData[keel.ToolResultData](t, journal(t, st, r.ID), keel.EventToolResult)
	if !slices.Equal(d.Labels, []string{"pii", "secret"}) || d.Touched == nil || !d.Touched.Truncated {
		t.Errorf("tool.result labels %q, touched %+v; want [pii secret] and the truncation recorded", d.Labels, d.Touched)
	}
}

// TestLiveLabelsMatchTheFoldUnderConcurrency: while a run's tool call is
// in flight, people say labelled messages and declassify labels from
// many goroutines at once; the run's next model call carries exactly
// what the fold of its journal gives at its model.result, whatever
// order the appends took.
func TestLiveLabelsMatchTheFoldUnderConcurrency(t *testing.T) {
	t.Parallel()
	var seen labelLog
	p := scripted.New(nil, scripted.Repeat(scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
		if seen.see(req) == 1 {
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "m1", Name: "mail", Arguments: json.RawMessage(`{}`)}}}}, nil
		}
		return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
	})))
	tools := &labelTools{}
	st, eng := newEngine(t, engine.Config{Model: p, Tools: tools})
	ctx := context.Background()
	var id keel.RunID
	started := make(chan struct{}) // closed once id is set
	errs := make(chan error, 64)
	tools.onCall = func(inv keel.ToolInvocation) {
		<-started // the call can come before Start has returned the run's ID
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, err := eng.SayLabeled(ctx, id, "note", []string{fmt.Sprintf("l%d", i%4)})
				errs <- err
			}()
			go func() {
				defer wg.Done()
				// Some find the label gone already: ErrInvalid.
				if _, err := eng.Declassify(ctx, keel.DeclassifyRequest{RunID: id, Label: fmt.Sprintf("l%d", i%4), By: "ada", Reason: "fine"}); err != nil && !errors.Is(err, keel.ErrInvalid) {
					errs <- err
				}
			}()
		}
		wg.Wait()
	}
	run, err := eng.Start(ctx, engine.StartRequest{Goal: "mail", Policy: keel.RunPolicy{Labels: []string{"l0", "l1", "l2", "l3"}}})
	if err != nil {
		t.Fatal(err)
	}
	id = run.ID
	close(started)
	if r := waitRun(t, eng, st, run.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	evs := journal(t, st, run.ID)
	run, _ = st.GetRun(ctx, run.ID)
	var last int
	for i, ev := range evs {
		if ev.Type == keel.EventModelResult {
			last = i
		}
	}
	fold, err := engine.FoldLabels(run, evs[:last])
	if err != nil {
		t.Fatal(err)
	}
	reqs := seen.get()
	if len(reqs) != 2 || !slices.Equal(reqs[1], fold) {
		t.Errorf("second request's labels = %q, fold of the journal before its result %q; want equal", reqs[len(reqs)-1], fold)
	}
}

// eventReads is a real store that counts reads of a run's journal.
type eventReads struct {
	*store.Store
	n atomic.Int64
}

func (s *eventReads) Events(ctx context.Context, id keel.RunID, after int64) ([]keel.Event, error) {
	s.n.Add(1)
	return s.Store.Events(ctx, id, after)
}

// TestFreshRunLabelsWithoutReadingTheJournal: a run Start creates has
// its labels live from its inputs before it exists, so its loop reads
// nothing back (a read per run cost 3% of a short run's CPU), and a
// labelled message journaled right after Start still reaches the
// context: every model request holds exactly the fold of the journal
// before its result.
func TestFreshRunLabelsWithoutReadingTheJournal(t *testing.T) {
	t.Parallel()
	var seen labelLog
	said := make(chan struct{}) // the first model call answers once the message is journaled
	p := scripted.New(nil, scripted.Repeat(scripted.ReplyFunc(func(ctx context.Context, req models.ChatRequest) (models.ChatResponse, error) {
		if seen.see(req) == 1 {
			select {
			case <-said:
			case <-ctx.Done():
				return models.ChatResponse{}, ctx.Err()
			}
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: "m1", Name: "mail", Arguments: json.RawMessage(`{}`)}}}}, nil
		}
		return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
	})))
	st := &eventReads{Store: openStore(t)}
	eng, err := engine.New(engine.Config{Store: st, Model: p, Tools: &labelTools{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(context.Background()) })
	ctx := context.Background()
	run, err := eng.Start(ctx, engine.StartRequest{Goal: "mail", Policy: keel.RunPolicy{Labels: []string{"input"}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = eng.SayLabeled(ctx, run.ID, "note", []string{"said"})
	close(said)
	if err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng, st.Store, run.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q", r.Status, r.Error)
	}
	reads := st.n.Load()
	evs := journal(t, st.Store, run.ID)
	run, _ = st.GetRun(ctx, run.ID)
	reqs := seen.get()
	last := -1
	for k, ev := range evs {
		if ev.Type == keel.EventModelResult {
			last = k
		}
	}
	fold, err := engine.FoldLabels(run, evs[:max(last, 0)])
	if err != nil {
		t.Fatal(err)
	}
	// The first request went out before or after the message; the last,
	// after the first answer, which waited for it.
	if len(reqs) != 2 || !slices.Contains(reqs[0], "input") || !slices.Equal(reqs[1], fold) || !slices.Contains(fold, "said") {
		t.Errorf("requests' labels = %q; want input's in the first, and the last equal to the fold of the journal before its result, %q, with said's", reqs, fold)
	}
	if reads != 0 {
		t.Errorf("the engine read the fresh run's journal %d times, want none", reads)
	}
}
