package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/policy"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeRuns is a hand-written Runs over a map.
type fakeRuns struct {
	mu    sync.Mutex
	runs  map[keel.RunID]keel.Run
	reads int // GetRun's calls
}

func (f *fakeRuns) GetRun(_ context.Context, id keel.RunID) (keel.Run, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	r, ok := f.runs[id]
	if !ok {
		return keel.Run{}, keel.ErrNotFound
	}
	return r, nil
}

func (f *fakeRuns) RunsWithStatus(_ context.Context, states ...keel.RunStatus) ([]keel.Run, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []keel.Run
	for _, r := range f.runs {
		for _, s := range states {
			if r.Status == s {
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// nopTracer is the store's tracer under the exporter: it keeps nothing.
type nopTracer struct{}

func (nopTracer) StartSpan(context.Context, keel.Span) error              { return nil }
func (nopTracer) FinishSpan(context.Context, keel.Span) error             { return nil }
func (nopTracer) Sync(context.Context) error                              { return nil }
func (nopTracer) Spans(context.Context, keel.RunID) ([]keel.Span, error)  { return nil, nil }
func (nopTracer) RunsWithOpenSpans(context.Context) ([]keel.RunID, error) { return nil, nil }

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// agentRun is the spans of an agent run: its root, a step holding a
// model call, a wait for approval and a tool call; then a sub-agent run
// whose root hangs under a step span of the first.
func agentRun(id keel.RunID) []keel.Span {
	root := "root_" + string(id)
	step := "step_" + string(id)
	toolAttrs := `{"call_id":"call_1","policy":{"outcome":"ask","explanation":"ask: rule 1 of the user layer (policy.json:3:5)","version":1,"digest":"d"},"labels":[]}`
	return []keel.Span{
		{ID: "model_" + string(id), RunID: id, ParentID: step, Kind: keel.SpanModelCall, Name: "keel-tiny", Step: 1, Start: t0.Add(time.Millisecond), Duration: 40 * time.Millisecond,
			Status: keel.SpanOK, PromptTokens: 12, CompletionTokens: 7, Provider: "ollama", CostUSD: 0.5, FinishReason: "tool_calls",
			Attrs: json.RawMessage(`{"route":"default","policy":[{"provider":"ollama","model":"keel-tiny","outcome":"allow","explanation":"allow: no rule","version":1,"digest":"d"}]}`)},
		{ID: "human_" + string(id), RunID: id, ParentID: step, Kind: keel.SpanHuman, Name: "approve echo", Step: 1, Start: t0.Add(50 * time.Millisecond), Duration: time.Second,
			Status: keel.SpanOK, Attrs: json.RawMessage(toolAttrs)},
		{ID: "tool_" + string(id), RunID: id, ParentID: step, Kind: keel.SpanToolCall, Name: "echo", Step: 1, Start: t0.Add(1100 * time.Millisecond), Duration: 3 * time.Millisecond,
			Status: keel.SpanError, Error: "crashed: the secret word is swordfish", Attrs: json.RawMessage(`{"call_id":"call_1","error_type":"crashed"}`)},
		{ID: step, RunID: id, ParentID: root, Kind: keel.SpanStep, Name: "step", Step: 1, Start: t0, Duration: 1200 * time.Millisecond, Status: keel.SpanOK},
		{ID: root, RunID: id, Kind: keel.SpanRun, Name: "agent", Start: t0, Duration: 2 * time.Second, Status: keel.SpanOK},
	}
}

// memClient is an in-memory OTLP client: it keeps a copy of what it is
// sent (the exporter reuses the messages).
type memClient struct {
	mu    sync.Mutex
	spans tracetest.SpanStubs
}

func (*memClient) Start(context.Context) error { return nil }
func (*memClient) Stop(context.Context) error  { return nil }

func (m *memClient) UploadTraces(_ context.Context, rss []*tracepb.ResourceSpans) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, rs := range decoded(rss) {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				m.spans = append(m.spans, stubOf(rs.Resource, s))
			}
		}
	}
	return nil
}

// decoded returns rss as a collector reads them: encoded, then decoded
// (the exporter hands the clients its spans already encoded).
func decoded(rss []*tracepb.ResourceSpans) []*tracepb.ResourceSpans {
	b, err := proto.Marshal(&collectortrace.ExportTraceServiceRequest{ResourceSpans: rss})
	if err != nil {
		panic(err)
	}
	var req collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		panic(err)
	}
	return req.ResourceSpans
}

// spanCount is the number of spans in rss.
func spanCount(rss []*tracepb.ResourceSpans) int {
	n := 0
	for _, rs := range decoded(rss) {
		for _, ss := range rs.ScopeSpans {
			n += len(ss.Spans)
		}
	}
	return n
}

// GetSpans returns the spans received.
func (m *memClient) GetSpans() tracetest.SpanStubs {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.spans)
}

// stubOf reads an OTLP span, of resource res, back as an SDK span.
func stubOf(res *resourcepb.Resource, s *tracepb.Span) tracetest.SpanStub {
	var tid trace.TraceID
	var sid, pid trace.SpanID
	copy(tid[:], s.TraceId)
	copy(sid[:], s.SpanId)
	st := tracetest.SpanStub{
		Name:        s.Name,
		SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(s.Flags & 0xff)}),
		StartTime:   time.Unix(0, int64(s.StartTimeUnixNano)).UTC(),
		EndTime:     time.Unix(0, int64(s.EndTimeUnixNano)).UTC(),
		SpanKind:    trace.SpanKind(s.Kind), // the same numbers
		Attributes:  attrsFrom(s.Attributes),
		Resource:    resource.NewSchemaless(attrsFrom(res.GetAttributes())...),
	}
	if copy(pid[:], s.ParentSpanId) == len(pid) {
		st.Parent = trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: pid, Remote: s.Flags&uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK) != 0})
	}
	switch s.Status.GetCode() {
	case tracepb.Status_STATUS_CODE_OK:
		st.Status.Code = codes.Ok
	case tracepb.Status_STATUS_CODE_ERROR:
		st.Status.Code = codes.Error
	}
	st.Status.Description = s.Status.GetMessage()
	return st
}

func attrsFrom(kvs []*commonpb.KeyValue) []attribute.KeyValue {
	var out []attribute.KeyValue
	for _, kv := range kvs {
		k := attribute.Key(kv.Key)
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			out = append(out, k.String(v.StringValue))
		case *commonpb.AnyValue_IntValue:
			out = append(out, k.Int64(v.IntValue))
		case *commonpb.AnyValue_DoubleValue:
			out = append(out, k.Float64(v.DoubleValue))
		case *commonpb.AnyValue_BoolValue:
			out = append(out, k.Bool(v.BoolValue))
		case *commonpb.AnyValue_ArrayValue:
			var ss []string
			for _, el := range v.ArrayValue.Values {
				ss = append(ss, el.GetStringValue())
			}
			out = append(out, k.StringSlice(ss))
		default:
			panic(fmt.Sprintf("attribute %s of an unknown type %T", k, v))
		}
	}
	return out
}

// newTest returns an exporter to an in-memory collector over runs.
func newTest(t *testing.T, cfg Config, runs *fakeRuns, pol func(keel.Run) *policy.Policy) (*Exporter, *memClient, Tracer) {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "http://127.0.0.1:4317"
		cfg.Insecure = true
	}
	mem := &memClient{}
	x, err := New(Options{Config: cfg, Runs: runs, Policy: pol, Client: mem})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close(context.Background()) })
	return x, mem, x.Tracer(nopTracer{})
}

func finish(t *testing.T, tr Tracer, spans ...keel.Span) {
	t.Helper()
	for _, sp := range spans {
		if err := tr.FinishSpan(context.Background(), sp); err != nil {
			t.Fatal(err)
		}
	}
}

func attrsOf(s tracetest.SpanStub) map[string]attribute.Value {
	m := map[string]attribute.Value{}
	for _, kv := range s.Attributes {
		m[string(kv.Key)] = kv.Value
	}
	return m
}

func byName(spans tracetest.SpanStubs) map[string]tracetest.SpanStub {
	m := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		m[s.Name] = s
	}
	return m
}

func TestExportShapeAndAttributes(t *testing.T) {
	t.Parallel()
	runs := &fakeRuns{runs: map[keel.RunID]keel.Run{
		"run_a":   {ID: "run_a", Model: "keel-tiny", Status: keel.RunSucceeded, Kind: keel.KindPlan},
		"run_sub": {ID: "run_sub", Model: "keel-tiny", Status: keel.RunFailed, ParentID: "run_a", ParentStep: "s1"},
		"run_b":   {ID: "run_b", Model: "keel-tiny", Status: keel.RunSucceeded},
	}}
	x, mem, tr := newTest(t, Config{FlushIntervalMS: 10}, runs, nil)
	finish(t, tr, agentRun("run_a")...)
	// A sub-agent: its root's parent is the run_a step span.
	finish(t, tr, keel.Span{ID: "root_run_sub", RunID: "run_sub", ParentID: "step_run_a", Kind: keel.SpanRun, Name: "agent", Start: t0, Duration: time.Second, Status: keel.SpanError, Error: "failed: boom"})
	finish(t, tr, agentRun("run_b")...)
	// A running span is not exported (it is exported when it finishes).
	finish(t, tr, keel.Span{ID: "open", RunID: "run_b", Kind: keel.SpanStep, Status: keel.SpanRunning})
	if err := x.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := mem.GetSpans()
	if len(got) != 11 {
		t.Fatalf("exported %d spans, want 11: %v", len(got), got)
	}
	if s := x.Stats(); s.Exported != 11 || s.Dropped != 0 || s.Failed != 0 || s.Denied != 0 {
		t.Errorf("Stats() = %+v, want 11 exported and nothing else", s)
	}
	var a, b tracetest.SpanStubs
	for _, s := range got {
		if attrsOf(s)[keyRunID].AsString() == "run_b" {
			b = append(b, s)
		} else {
			a = append(a, s)
		}
	}
	// One trace per top-level run; the sub-agent is in its parent's.
	for _, spans := range []tracetest.SpanStubs{a, b} {
		for _, s := range spans {
			if s.SpanContext.TraceID() != spans[0].SpanContext.TraceID() {
				t.Errorf("span %s in trace %s, want %s", s.Name, s.SpanContext.TraceID(), spans[0].SpanContext.TraceID())
			}
		}
	}
	if a[0].SpanContext.TraceID() == b[0].SpanContext.TraceID() {
		t.Errorf("two top-level runs share trace %s", a[0].SpanContext.TraceID())
	}
	if want := traceIDOf("run_a"); a[0].SpanContext.TraceID() != want {
		t.Errorf("trace of run_a = %s, want the hash of its ID %s", a[0].SpanContext.TraceID(), want)
	}
	// Parent/child: model, wait and tool under the step, the step and the
	// sub-agent under the root / the step, the root with no parent.
	ids := map[string]string{}
	var sub tracetest.SpanStub
	for _, s := range a {
		ids[s.SpanContext.SpanID().String()] = s.Name
	}
	parentOf := map[string]string{}
	spans := map[string]tracetest.SpanStub{}
	for _, s := range a {
		if attrsOf(s)[keyRunID].AsString() == "run_sub" {
			sub = s
			continue
		}
		spans[s.Name] = s
		parentOf[s.Name] = ids[s.Parent.SpanID().String()]
		if !s.Parent.IsValid() {
			parentOf[s.Name] = "-"
		}
	}
	wantParents := map[string]string{
		"invoke_agent agent":      "-",
		"step 1":                  "invoke_agent agent",
		"chat keel-tiny":          "step 1",
		"execute_tool echo":       "step 1",
		"human.wait approve echo": "step 1",
	}
	for name, want := range wantParents {
		if parentOf[name] != want {
			t.Errorf("parent of %q = %q, want %q (all: %v)", name, parentOf[name], want, parentOf)
		}
	}
	if ids[sub.Parent.SpanID().String()] != "step 1" {
		t.Errorf("the sub-agent's root has parent %q, want the step span of its parent run", ids[sub.Parent.SpanID().String()])
	}
	if sub.Status.Code != codes.Error || attrsOf(sub)[keyErrorType].AsString() != "failed" {
		t.Errorf("sub-agent root: status %v, error.type %q; want error, failed", sub.Status, attrsOf(sub)[keyErrorType].AsString())
	}

	model := attrsOf(spans["chat keel-tiny"])
	for k, want := range map[string]any{
		keyOperation: "chat", keyProvider: "ollama", keyRequestModel: "keel-tiny", keyResponseModel: "keel-tiny",
		keyInputTokens: int64(12), keyOutputTokens: int64(7), keyCost: 0.5, keyRunID: "run_a", keyStep: int64(1), keyRoute: "default",
	} {
		if got := model[k].AsInterface(); got != want {
			t.Errorf("chat span %s = %v, want %v", k, got, want)
		}
	}
	if d := model[keyPolicyList].AsStringSlice(); len(d) != 1 || !strings.Contains(d[0], "ollama/keel-tiny: allow") {
		t.Errorf("chat span %s = %q, want the model decision", keyPolicyList, d)
	}
	if spans["chat keel-tiny"].SpanKind.String() != "client" {
		t.Errorf("chat span kind %s, want client", spans["chat keel-tiny"].SpanKind)
	}
	tool := spans["execute_tool echo"]
	ta := attrsOf(tool)
	for k, want := range map[string]any{keyOperation: "execute_tool", keyToolName: "echo", keyToolCallID: "call_1", keyErrorType: "crashed"} {
		if got := ta[k].AsInterface(); got != want {
			t.Errorf("tool span %s = %v, want %v", k, got, want)
		}
	}
	// Without content, an error's text does not leave: only its class.
	if tool.Status.Code != codes.Error || tool.Status.Description != "crashed" {
		t.Errorf("tool span status %+v, want error described by its class only", tool.Status)
	}
	human := attrsOf(spans["human.wait approve echo"])
	if !human[keyHumanWait].AsBool() || human[keyPolicyOutcome].AsString() != "ask" || !strings.Contains(human[keyPolicyExplain].AsString(), "policy.json:3:5") {
		t.Errorf("human wait span attrs %v, want keel.human.wait and the ask decision", human)
	}
	root := attrsOf(spans["invoke_agent agent"])
	if root[keyOperation].AsString() != "invoke_agent" || root[keyRunKind].AsString() != "plan" || root[keyRunStatus].AsString() != "succeeded" {
		t.Errorf("root span attrs %v", root)
	}
	if !spans["chat keel-tiny"].StartTime.Equal(t0.Add(time.Millisecond)) || spans["chat keel-tiny"].EndTime.Sub(spans["chat keel-tiny"].StartTime) != 40*time.Millisecond {
		t.Errorf("chat span times %v..%v, want keel's start and duration", spans["chat keel-tiny"].StartTime, spans["chat keel-tiny"].EndTime)
	}
	for _, s := range got {
		for _, kv := range s.Attributes {
			if strings.HasPrefix(string(kv.Key), "gen_ai.input") || strings.HasPrefix(string(kv.Key), "gen_ai.output") || kv.Key == keyToolArgs || kv.Key == keyToolResult {
				t.Errorf("span %s carries content %s without the opt-in", s.Name, kv.Key)
			}
		}
		if s.Resource.Set().Len() == 0 {
			t.Errorf("span %s has no resource", s.Name)
		}
	}
}

// event makes a journaled event of run id.
func event(id keel.RunID, typ keel.EventType, data any) keel.Event {
	b, _ := json.Marshal(data)
	return keel.Event{RunID: id, Type: typ, Data: b}
}

func TestContentOptInAndLabels(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		content bool
		run     keel.Run
		spanLbl string // labels on the tool span's attrs
		want    bool   // content exported
	}{
		{"opted in, no labels", true, keel.Run{Goal: "say swordfish"}, "", true},
		{"not opted in", false, keel.Run{Goal: "say swordfish"}, "", false},
		{"private run", true, keel.Run{Goal: "say swordfish", Policy: keel.RunPolicy{Private: true}}, "", false},
		{"labelled input", true, keel.Run{Goal: "say swordfish", Policy: keel.RunPolicy{Labels: []string{"pii"}}}, "", false},
		{"labelled tool output", true, keel.Run{Goal: "say swordfish"}, "private", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run := tc.run
			run.ID, run.Status, run.Result = "run_c", keel.RunSucceeded, "the word is swordfish"
			runs := &fakeRuns{runs: map[keel.RunID]keel.Run{run.ID: run}}
			x, mem, tr := newTest(t, Config{FlushIntervalMS: 10, Content: tc.content}, runs, nil)
			x.OnEvent(event(run.ID, keel.EventModelResult, keel.ModelResultData{Step: 1, Content: "swordfish", ToolCalls: []keel.ToolCall{{ID: "call_1", Name: "echo", Arguments: json.RawMessage(`{"say":"swordfish"}`)}}}))
			x.OnEvent(event(run.ID, keel.EventToolResult, keel.ToolResultData{Step: 1, CallID: "call_1", Name: "echo", Output: json.RawMessage(`"swordfish"`)}))
			spans := agentRun(run.ID)
			spans[2].Status, spans[2].Error = keel.SpanOK, ""
			if tc.spanLbl != "" {
				spans[2].Attrs = json.RawMessage(fmt.Sprintf(`{"call_id":"call_1","labels":[%q]}`, tc.spanLbl))
			}
			finish(t, tr, spans...)
			if err := x.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			got := byName(mem.GetSpans())
			leaked := []string{}
			for name, s := range got {
				if tc.spanLbl != "" && (name == "chat keel-tiny" || strings.HasPrefix(name, "human.wait")) {
					continue // before the labelled output entered the run
				}
				for _, kv := range s.Attributes {
					if strings.Contains(kv.Value.Emit(), "swordfish") {
						leaked = append(leaked, name+" "+string(kv.Key))
					}
				}
			}
			if !tc.want {
				if len(leaked) > 0 {
					t.Errorf("content left: %v", leaked)
				}
				if tc.content && !attrsOf(got["invoke_agent agent"])[keyContentOmitted].AsBool() {
					t.Errorf("root span does not say its content was left out")
				}
				return
			}
			model, tool, root := attrsOf(got["chat keel-tiny"]), attrsOf(got["execute_tool echo"]), attrsOf(got["invoke_agent agent"])
			if !strings.Contains(model[keyOutput].AsString(), `"content":"swordfish"`) || !strings.Contains(model[keyOutput].AsString(), `"tool_call"`) {
				t.Errorf("chat %s = %s", keyOutput, model[keyOutput].AsString())
			}
			if tool[keyToolArgs].AsString() != `{"say":"swordfish"}` || tool[keyToolResult].AsString() != `"swordfish"` {
				t.Errorf("tool args %s result %s", tool[keyToolArgs].AsString(), tool[keyToolResult].AsString())
			}
			if !strings.Contains(root[keyInput].AsString(), "say swordfish") || !strings.Contains(root[keyOutput].AsString(), "the word is swordfish") {
				t.Errorf("root input %s output %s", root[keyInput].AsString(), root[keyOutput].AsString())
			}
		})
	}
}

func TestPolicyDeniesExport(t *testing.T) {
	t.Parallel()
	deny, err := policy.Compile(policy.Options{}, policy.LayerFile{Layer: policy.LayerUser, Name: "policy.json",
		Data: []byte(`{"rules": [{"action": "telemetry", "host": "127.0.0.1", "decision": "deny"}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	runs := &fakeRuns{runs: map[keel.RunID]keel.Run{"run_d": {ID: "run_d", Status: keel.RunSucceeded}, "run_e": {ID: "run_e", Workspace: "/ok", Status: keel.RunSucceeded}}}
	x, mem, tr := newTest(t, Config{FlushIntervalMS: 10}, runs, func(r keel.Run) *policy.Policy {
		if r.Workspace == "/ok" {
			return nil
		}
		return deny
	})
	finish(t, tr, agentRun("run_d")...)
	finish(t, tr, agentRun("run_e")...)
	if err := x.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, s := range mem.GetSpans() {
		if r := attrsOf(s)[keyRunID].AsString(); r != "run_e" {
			t.Errorf("span %s of %s exported, though its policy denies the export", s.Name, r)
		}
	}
	if s := x.Stats(); s.Denied != 5 || s.Exported != 5 {
		t.Errorf("Stats() = %+v, want 5 denied, 5 exported", s)
	}
}

// stuckCollector is a collector that does not answer until released.
type stuckCollector struct {
	release chan struct{}
	calls   chan int
}

func (c *stuckCollector) UploadTraces(ctx context.Context, rss []*tracepb.ResourceSpans) error {
	c.calls <- spanCount(rss)
	select {
	case <-c.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *stuckCollector) Start(context.Context) error { return nil }
func (c *stuckCollector) Stop(context.Context) error  { return nil }

func TestStuckCollectorNeverBlocksARun(t *testing.T) {
	t.Parallel()
	runs := &fakeRuns{runs: map[keel.RunID]keel.Run{}}
	col := &stuckCollector{release: make(chan struct{}), calls: make(chan int, 100)}
	x, err := New(Options{Config: Config{Endpoint: "http://127.0.0.1:4317", QueueSize: 4, FlushIntervalMS: 5, ExportTimeoutMS: 60_000}, Runs: runs, Client: col})
	if err != nil {
		t.Fatal(err)
	}
	tr := x.Tracer(nopTracer{})
	// The first batch goes to the collector, which holds it.
	finish(t, tr, keel.Span{ID: "first", RunID: "r", Kind: keel.SpanToolCall, Status: keel.SpanOK})
	select {
	case <-col.calls:
	case <-time.After(time.Minute):
		t.Fatal("the first span never reached the collector")
	}
	// Meanwhile, runs go on: each span is handed over without waiting,
	// the queue fills and the rest is dropped and counted.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 1000 {
			tr.FinishSpan(context.Background(), keel.Span{ID: fmt.Sprint(i), RunID: "r", Kind: keel.SpanToolCall, Status: keel.SpanOK})
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("FinishSpan waited for a stuck collector")
	}
	if s := x.Stats(); s.Dropped != 1000-4 || s.Queued != 4 {
		t.Errorf("Stats() = %+v, want %d dropped, 4 queued", s, 1000-4)
	}
	// A dropped span still counts in the metrics: the one sent, and the
	// 996 turned away (the 4 queued count once taken).
	rec := httptest.NewRecorder()
	x.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if want := `keel_tool_duration_seconds_count{gen_ai_tool_name=""} 997`; !strings.Contains(rec.Body.String(), want+"\n") {
		t.Errorf("metrics lack %s:\n%s", want, rec.Body.String())
	}
	close(col.release)
	go func() {
		for range col.calls {
		}
	}()
	if err := x.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(col.calls)
	if s := x.Stats(); s.Exported != 5 {
		t.Errorf("after Close, Stats() = %+v, want the 5 spans kept exported", s)
	}
}

func TestCloseDeadline(t *testing.T) {
	t.Parallel()
	col := &stuckCollector{release: make(chan struct{}), calls: make(chan int, 10)}
	x, err := New(Options{Config: Config{Endpoint: "http://127.0.0.1:4317", FlushIntervalMS: 60_000}, Runs: &fakeRuns{}, Client: col})
	if err != nil {
		t.Fatal(err)
	}
	finish(t, x.Tracer(nopTracer{}), keel.Span{ID: "a", RunID: "r", Kind: keel.SpanToolCall, Status: keel.SpanOK})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	// The collector never answers: Close gives up at its deadline.
	if err := x.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close() = %v, want the deadline", err)
	}
	if s := x.Stats(); s.Failed != 1 {
		t.Errorf("Stats() = %+v, want the span counted as failed", s)
	}
	finish(t, x.Tracer(nopTracer{}), keel.Span{ID: "b", RunID: "r", Kind: keel.SpanToolCall, Status: keel.SpanOK})
	if s := x.Stats(); s.Dropped != 1 {
		t.Errorf("a span after Close: Stats() = %+v, want it dropped", s)
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	runs := &fakeRuns{runs: map[keel.RunID]keel.Run{"w": {ID: "w", Status: keel.RunWaiting}, "r": {ID: "r", Status: keel.RunRunning}, "r2": {ID: "r2", Status: keel.RunRunning}}}
	// Metrics are on without an endpoint: nothing is exported.
	x, err := New(Options{Config: Config{FlushIntervalMS: 10}, Runs: runs})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(context.Background())
	tr := x.Tracer(nopTracer{})
	finish(t, tr, agentRun("run_m")...)
	x.OnEvent(keel.Event{RunID: "run_m", Type: keel.EventRunFailed})
	x.OnEvent(keel.Event{RunID: "run_m", Type: keel.EventRunSucceeded})
	scrape := func() string {
		rec := httptest.NewRecorder()
		x.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		body, _ := io.ReadAll(rec.Body)
		return string(body)
	}
	// The spans' metrics are recorded off the runs' path, within a flush
	// interval.
	wants := []string{
		`keel_tokens_total{gen_ai_provider_name="ollama",gen_ai_response_model="keel-tiny",gen_ai_token_type="input"} 12`,
		`keel_tokens_total{gen_ai_provider_name="ollama",gen_ai_response_model="keel-tiny",gen_ai_token_type="output"} 7`,
		`keel_cost_usd_total{gen_ai_provider_name="ollama",gen_ai_response_model="keel-tiny"} 0.5`,
		`keel_tool_duration_seconds_bucket{error_type="crashed",gen_ai_tool_name="echo",le="0.005"} 1`,
		`keel_model_duration_seconds_count{gen_ai_provider_name="ollama",gen_ai_response_model="keel-tiny"} 1`,
		`keel_failures_total{error_type="crashed",keel_span_kind="tool.call"} 1`,
		`keel_failures_total{error_type="failed",keel_span_kind="run"} 1`,
		`keel_runs_ended_total{keel_run_status="failed"} 1`,
		`keel_runs_ended_total{keel_run_status="succeeded"} 1`,
		`keel_runs_active{keel_run_status="running"} 2`,
		`keel_runs_active{keel_run_status="waiting"} 1`,
		`keel_telemetry_spans_total{outcome="dropped"} 0`,
	}
	hasAll := func(body string) bool {
		for _, want := range wants {
			if !strings.Contains(body, want+"\n") {
				return false
			}
		}
		return true
	}
	body := scrape()
	for deadline := time.Now().Add(time.Minute); !hasAll(body) && time.Now().Before(deadline); body = scrape() {
		time.Sleep(10 * time.Millisecond) // a poll interval
	}
	for _, want := range wants {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %s\n%s", want, body)
		}
	}
	if s := x.Stats(); s.Enabled || s.Exported != 0 {
		t.Errorf("Stats() = %+v, want export off", s)
	}
	off := false
	y, err := New(Options{Config: Config{Metrics: &off}, Runs: runs})
	if err != nil {
		t.Fatal(err)
	}
	defer y.Close(context.Background())
	if y.MetricsHandler() != nil {
		t.Error(`"metrics": false still serves metrics`)
	}
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in    string
		field string
		err   error
		dest  string
	}{
		{in: `{}`},
		{in: `{"endpoint":"127.0.0.1:4317","insecure":true}`, dest: "http://127.0.0.1:4317"},
		{in: `{"endpoint":"collector.example.com:4317"}`, dest: "https://collector.example.com:4317"},
		{in: `{"endpoint":"http://localhost:4318","protocol":"http"}`, dest: "http://localhost:4318/v1/traces"},
		{in: `{"endpoint":"https://otel.example.com/otlp/v1/traces","protocol":"http","headers":{"x-key":"k"},"content":true}`, dest: "https://otel.example.com:4318/otlp/v1/traces"},
		{in: `{"endpoint":"127.0.0.1:4317","insecure":true,"color":"red"}`, field: "color", err: ErrUnknownField},
		{in: `{"endpoint":"127.0.0.1:4317","protocol":"udp"}`, field: "protocol", err: ErrInvalid},
		{in: `{"endpoint":"collector.example.com:4317","insecure":true}`, field: "endpoint", err: ErrInvalid},
		{in: `{"endpoint":"http://10.0.0.2:4318","protocol":"http"}`, field: "endpoint", err: ErrInvalid},
		{in: `{"endpoint":"127.0.0.1:4318","protocol":"http"}`, field: "endpoint", err: ErrInvalid},
		{in: `{"endpoint":"https://user:pw@otel.example.com"}`, field: "endpoint", err: ErrInvalid},
		{in: `{"queue_size":-1}`, field: "queue_size", err: ErrInvalid},
		{in: `{"content":"yes"}`, field: "content", err: ErrInvalid},
		{in: `[1]`, err: ErrInvalid},
		{in: `{"endpoint":`, err: ErrInvalid},
	} {
		c, err := ParseConfig("telemetry.json", []byte(tc.in))
		if tc.err != nil {
			var ce *ConfigError
			if !errors.Is(err, tc.err) || !errors.As(err, &ce) || ce.Field != tc.field || ce.File != "telemetry.json" || !strings.HasPrefix(err.Error(), "telemetry.json: ") {
				t.Errorf("ParseConfig(%s) = %v, want %v naming field %q and the file", tc.in, err, tc.err, tc.field)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseConfig(%s) = %v", tc.in, err)
			continue
		}
		if got := c.Endpoint != ""; got && func() string { u, _ := c.destination(); return u.String() }() != tc.dest {
			u, _ := c.destination()
			t.Errorf("ParseConfig(%s) destination %s, want %s", tc.in, u, tc.dest)
		}
		if tc.dest == "" && c.Enabled() {
			t.Errorf("ParseConfig(%s) enables export", tc.in)
		}
	}
}

// memTracer keeps the spans started, as the store does.
type memTracer struct {
	nopTracer
	mu    sync.Mutex
	spans []keel.Span
}

func (m *memTracer) StartSpan(_ context.Context, sp keel.Span) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.spans = append(m.spans, sp)
	return nil
}

func (m *memTracer) Spans(_ context.Context, id keel.RunID) ([]keel.Span, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []keel.Span
	for _, sp := range m.spans {
		if sp.RunID == id {
			out = append(out, sp)
		}
	}
	return out, nil
}

// TestPartialFinishCompleted: the end of a wait for approval is finished
// with its outcome only (ID, kind, status, duration); the exported span
// has the start, name and parent it was started with.
func TestPartialFinishCompleted(t *testing.T) {
	t.Parallel()
	mem := &memClient{}
	x, err := New(Options{Config: Config{Endpoint: "http://127.0.0.1:4317", FlushIntervalMS: 10}, Runs: &fakeRuns{}, Client: mem})
	if err != nil {
		t.Fatal(err)
	}
	store := &memTracer{}
	tr := x.Tracer(store)
	wait := keel.Span{ID: "wait", RunID: "r", ParentID: "step", Kind: keel.SpanHuman, Name: "approve echo", Step: 1, Start: t0, Status: keel.SpanRunning}
	if err := tr.StartSpan(context.Background(), wait); err != nil {
		t.Fatal(err)
	}
	finish(t, tr, keel.Span{ID: "wait", RunID: "r", Kind: keel.SpanHuman, Status: keel.SpanOK, Duration: time.Minute, Attrs: json.RawMessage(`{"call_id":"c1"}`)})
	if err := x.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := mem.GetSpans()
	if len(got) != 1 {
		t.Fatalf("exported %d spans, want 1", len(got))
	}
	s := got[0]
	if s.Name != "human.wait approve echo" || !s.StartTime.Equal(t0) || s.EndTime.Sub(s.StartTime) != time.Minute || s.Parent.SpanID() != spanIDOf("step") ||
		attrsOf(s)[keyToolCallID].AsString() != "c1" {
		t.Errorf("exported %q from %v for %v, parent %s, call %q; want the started span's name, start and parent, the finish's duration and attributes",
			s.Name, s.StartTime, s.EndTime.Sub(s.StartTime), s.Parent.SpanID(), attrsOf(s)[keyToolCallID].AsString())
	}
}

// failingCollector is a collector that refuses every batch.
type failingCollector struct{ calls chan int }

func (c *failingCollector) UploadTraces(_ context.Context, rss []*tracepb.ResourceSpans) error {
	c.calls <- spanCount(rss)
	return errors.New("connection refused")
}

func (c *failingCollector) Start(context.Context) error { return nil }
func (c *failingCollector) Stop(context.Context) error  { return nil }

// TestDownCollectorBackoff: after a collector fails a batch, the spans
// finished meanwhile fail without being sent (nor mapped), until it is
// due again; they are counted all the same.
func TestDownCollectorBackoff(t *testing.T) {
	t.Parallel()
	col := &failingCollector{calls: make(chan int, 100)}
	x, err := New(Options{Config: Config{Endpoint: "http://127.0.0.1:4317", FlushIntervalMS: 5}, Runs: &fakeRuns{}, Client: col})
	if err != nil {
		t.Fatal(err)
	}
	x.minBackoff = time.Hour // set before the first span reaches the worker
	tr := x.Tracer(nopTracer{})
	finish(t, tr, keel.Span{ID: "a", RunID: "r", Kind: keel.SpanToolCall, Status: keel.SpanOK})
	select {
	case <-col.calls:
	case <-time.After(time.Minute):
		t.Fatal("the first span never reached the collector")
	}
	for i := range 10 {
		finish(t, tr, keel.Span{ID: fmt.Sprint(i), RunID: "r", Kind: keel.SpanToolCall, Status: keel.SpanOK})
	}
	deadline := time.Now().Add(time.Minute)
	for x.Stats().Failed != 11 {
		if time.Now().After(deadline) {
			t.Fatalf("Stats() = %+v, want 11 failed", x.Stats())
		}
		time.Sleep(5 * time.Millisecond) // a poll interval
	}
	if n := len(col.calls); n != 0 {
		t.Errorf("the collector was tried %d more times while it was given time", n)
	}
	finish(t, tr, keel.Span{ID: "last", RunID: "r", Kind: keel.SpanToolCall, Status: keel.SpanOK})
	if err := x.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Close tries once more if the last span was still queued.
	if n := len(col.calls); n > 1 {
		t.Errorf("Close tried the collector %d times, want at most once", n)
	}
	if s := x.Stats(); s.Failed != 12 || s.LastError != "connection refused" {
		t.Errorf("Stats() = %+v, want 12 failed and the error", s)
	}
}

// TestFlush: Flush sends the spans finished before it at once, an hour
// before the flush interval would, and the spans after it wait again;
// on a closed exporter it returns at once.
func TestFlush(t *testing.T) {
	t.Parallel()
	mem := &memClient{}
	x, err := New(Options{Config: Config{Endpoint: "http://127.0.0.1:4317", FlushIntervalMS: 3_600_000}, Runs: &fakeRuns{}, Client: mem})
	if err != nil {
		t.Fatal(err)
	}
	tr := x.Tracer(nopTracer{})
	count := func() int {
		mem.mu.Lock()
		defer mem.mu.Unlock()
		return len(mem.spans)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, id := range []string{"a", "b", "c"} {
		finish(t, tr, keel.Span{ID: id, RunID: "r", Kind: keel.SpanToolCall, Status: keel.SpanOK})
	}
	if err := x.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 3 {
		t.Errorf("after Flush the collector holds %d spans, want 3", n)
	}
	finish(t, tr, keel.Span{ID: "d", RunID: "r", Kind: keel.SpanToolCall, Status: keel.SpanOK})
	if err := x.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 4 {
		t.Errorf("after a second Flush the collector holds %d spans, want 4", n)
	}
	if err := x.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := x.Flush(ctx); err != nil {
		t.Errorf("Flush after Close = %v, want nil at once", err)
	}
}

// nopJournal is the store's journal under the exporter: its writes
// succeed and keep nothing.
type nopJournal struct{ Journal }

func (nopJournal) CreateRun(context.Context, keel.Run) error { return nil }
func (nopJournal) CreateRunWith(context.Context, keel.Run, []keel.Event, *keel.RunUpdate) ([]keel.Event, error) {
	return nil, nil
}
func (nopJournal) AppendAll(context.Context, keel.RunID, []keel.Event, *keel.RunUpdate) ([]keel.Event, error) {
	return nil, nil
}

// TestJournalCarriesTheRun: with the journal through the exporter, a
// run's spans (a sub-agent's too) are exported without a read of the
// run: the exporter takes the records the journal writes (model, kind,
// parent and labels as the run is created, its status as it ends). A
// run whose end the journal did not record is read at its root span, as
// before.
func TestJournalCarriesTheRun(t *testing.T) {
	t.Parallel()
	runs := &fakeRuns{runs: map[keel.RunID]keel.Run{
		// What a read would find: not what the journal wrote.
		"run_j": {ID: "run_j", Model: "other", Status: keel.RunRunning},
		"run_r": {ID: "run_r", Model: "keel-tiny", Status: keel.RunSucceeded},
	}}
	x, mem, tr := newTest(t, Config{FlushIntervalMS: 3_600_000}, runs, nil)
	j := x.Journal(nopJournal{})
	ctx := context.Background()
	evs := []keel.Event{{Type: keel.EventRunStarted}}
	run := keel.Run{ID: "run_j", Model: "keel-tiny", Kind: keel.KindPlan, Status: keel.RunQueued, Policy: keel.RunPolicy{Labels: []string{"pii"}}}
	if _, err := j.CreateRunWith(ctx, run, evs, &keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		t.Fatal(err)
	}
	if err := j.CreateRun(ctx, keel.Run{ID: "run_jsub", Model: "keel-tiny", ParentID: "run_j", Status: keel.RunQueued}); err != nil {
		t.Fatal(err)
	}
	spans := agentRun("run_j")
	finish(t, tr, spans[:4]...)
	// As the engine does: the root span ends, then the run's end is
	// journaled.
	finish(t, tr, keel.Span{ID: "root_run_jsub", RunID: "run_jsub", ParentID: "step_run_j", Kind: keel.SpanRun, Name: "agent", Start: t0, Duration: time.Second, Status: keel.SpanOK})
	if _, err := j.AppendAll(ctx, "run_jsub", evs, &keel.RunUpdate{Status: keel.RunSucceeded, Result: "done"}); err != nil {
		t.Fatal(err)
	}
	// Not an end: nothing to take.
	if _, err := j.AppendAll(ctx, "run_j", evs, &keel.RunUpdate{Status: keel.RunWaiting}); err != nil {
		t.Fatal(err)
	}
	root := spans[4]
	root.Status, root.Error = keel.SpanError, "failed: boom"
	finish(t, tr, root)
	if _, err := j.AppendAll(ctx, "run_j", evs, &keel.RunUpdate{Status: keel.RunFailed, Error: "boom"}); err != nil {
		t.Fatal(err)
	}
	// A run the journal did not create (resumed after a restart): read.
	finish(t, tr, agentRun("run_r")[4])
	if err := x.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	runs.mu.Lock()
	reads := runs.reads
	runs.mu.Unlock()
	if reads != 1 {
		t.Errorf("the exporter read runs %d times, want once (run_r, which the journal did not create)", reads)
	}
	got := mem.GetSpans()
	if len(got) != 7 {
		t.Fatalf("exported %d spans, want 7", len(got))
	}
	var sub, rootJ, rootR tracetest.SpanStub
	for _, s := range got {
		a := attrsOf(s)
		if a[keyLabels].Type() == attribute.INVALID || !slices.Contains(a[keyLabels].AsStringSlice(), "pii") {
			if a[keyRunID].AsString() == "run_j" {
				t.Errorf("span %s of run_j: labels %v, want the run's pii", s.Name, a[keyLabels].AsStringSlice())
			}
		}
		if s.SpanContext.TraceID() != traceIDOf("run_j") && a[keyRunID].AsString() != "run_r" {
			t.Errorf("span %s in trace %s, want run_j's", s.Name, s.SpanContext.TraceID())
		}
		switch {
		case a[keyRunID].AsString() == "run_jsub":
			sub = s
		case s.Name == "invoke_agent agent" && a[keyRunID].AsString() == "run_j":
			rootJ = s
		case a[keyRunID].AsString() == "run_r":
			rootR = s
		case s.Name == "chat keel-tiny":
			if m := a[keyRequestModel].AsString(); m != "keel-tiny" {
				t.Errorf("chat span %s = %q, want the created run's keel-tiny", keyRequestModel, m)
			}
		}
	}
	ra := attrsOf(rootJ)
	if ra[keyRunStatus].AsString() != "failed" || ra[keyErrorType].AsString() != "failed" || ra[keyRunKind].AsString() != "plan" || ra[keyRequestModel].AsString() != "keel-tiny" {
		t.Errorf("run_j's root span attrs %v, want status and error.type failed, kind plan, model keel-tiny (the journal's records)", ra)
	}
	if sa := attrsOf(sub); sa[keyParentRun].AsString() != "run_j" || sa[keyRunStatus].AsString() != "succeeded" {
		t.Errorf("the sub-agent's root: %s = %q, %s = %q, want run_j, succeeded", keyParentRun, sa[keyParentRun].AsString(), keyRunStatus, sa[keyRunStatus].AsString())
	}
	if s := attrsOf(rootR)[keyRunStatus].AsString(); s != "succeeded" {
		t.Errorf("run_r's root span: %s = %q, want succeeded (read)", keyRunStatus, s)
	}
}

// TestRetrievalSpan: a search of the knowledge store is exported as the
// GenAI conventions' retrieval span, under its tool call; its query and
// hits only as content, and never when its hits are labelled.
func TestRetrievalSpan(t *testing.T) {
	t.Parallel()
	const attrs = `{"query":"swordfish lease","scopes":["user","workspace:/src"],"limit":5,"hits":[` +
		`{"n":1,"source":"/src/lease.go","lines":"3-9","scope":"user","score":0.0325,"bm25_rank":1,"shown":true},` +
		`{"n":2,"source":"notes.md","scope":"user","score":0.016,"vector_rank":2,"shown":false}],"call_id":"call_1"%s}`
	for _, tc := range []struct {
		name    string
		content bool
		labels  string // the span's labels attribute
		want    bool   // the query and documents exported
	}{
		{"content", true, "", true},
		{"no content", false, "", false},
		{"labelled hits", true, `,"labels":["private"]`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run := keel.Run{ID: "run_r", Status: keel.RunSucceeded, Goal: "find it"}
			runs := &fakeRuns{runs: map[keel.RunID]keel.Run{run.ID: run}}
			x, mem, tr := newTest(t, Config{FlushIntervalMS: 10, Content: tc.content}, runs, nil)
			spans := agentRun(run.ID)
			ret := keel.Span{ID: "ret_r", RunID: run.ID, ParentID: spans[2].ID, Kind: keel.SpanRetrieval, Name: "knowledge", Step: 1,
				Start: t0.Add(1101 * time.Millisecond), Duration: time.Millisecond, Status: keel.SpanOK, Attrs: json.RawMessage(fmt.Sprintf(attrs, tc.labels))}
			finish(t, tr, append([]keel.Span{ret}, spans...)...)
			if err := x.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			got := byName(mem.GetSpans())
			s, ok := got["retrieval knowledge"]
			if !ok {
				t.Fatalf("no span named %q among %v", "retrieval knowledge", slices.Collect(maps.Keys(got)))
			}
			if tool := got["execute_tool echo"]; s.Parent.SpanID() != tool.SpanContext.SpanID() {
				t.Errorf("retrieval's parent = %v, want the tool call %v", s.Parent.SpanID(), tool.SpanContext.SpanID())
			}
			a := attrsOf(s)
			if a[keyOperation].AsString() != opRetrieval || a[keyDataSource].AsString() != "knowledge" || a[keyToolCallID].AsString() != "call_1" ||
				a[keyRetrievalTopK].AsInt64() != 5 || a[keyHitCount].AsInt64() != 2 ||
				!slices.Equal(a[keyScopes].AsStringSlice(), []string{"user", "workspace:/src"}) {
				t.Errorf("retrieval attributes = %v", a)
			}
			text, docs := a[keyRetrievalText].AsString(), a[keyRetrievalDocs].AsString()
			if !tc.want {
				if text != "" || docs != "" {
					t.Errorf("content exported: query %q, documents %q", text, docs)
				}
				return
			}
			if text != "swordfish lease" || docs != `[{"id":"/src/lease.go:3-9","score":0.0325},{"id":"notes.md","score":0.016}]` {
				t.Errorf("query %q, documents %s", text, docs)
			}
		})
	}
}

// TestHandedRunInOriginTrace: a top-level run another environment handed
// this one (Options.TraceParent) is exported in the origin's trace, its
// root span under the origin's span (a remote parent), and its
// sub-agents with it; a run handed with no traceparent, or one that does
// not parse, is a trace of its own.
func TestHandedRunInOriginTrace(t *testing.T) {
	t.Parallel()
	const origin = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	runs := &fakeRuns{runs: map[keel.RunID]keel.Run{
		"run_h":   {ID: "run_h", Model: "keel-tiny", Status: keel.RunSucceeded, Kind: keel.KindDAG},
		"run_sub": {ID: "run_sub", Model: "keel-tiny", Status: keel.RunSucceeded, ParentID: "run_h", ParentStep: "s1"},
		"run_own": {ID: "run_own", Model: "keel-tiny", Status: keel.RunSucceeded},
		"run_bad": {ID: "run_bad", Model: "keel-tiny", Status: keel.RunSucceeded},
	}}
	mem := &memClient{}
	x, err := New(Options{Config: Config{Endpoint: "http://127.0.0.1:4317", Insecure: true, FlushIntervalMS: 10}, Runs: runs, Client: mem,
		TraceParent: func(_ context.Context, run keel.RunID) string {
			return map[keel.RunID]string{"run_h": origin, "run_bad": "00-not-a-trace-01"}[run]
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(context.Background())
	tr := x.Tracer(nopTracer{})
	finish(t, tr, agentRun("run_h")...)
	finish(t, tr, keel.Span{ID: "root_run_sub", RunID: "run_sub", ParentID: "step_run_h", Kind: keel.SpanRun, Name: "agent", Start: t0, Duration: time.Second, Status: keel.SpanOK})
	finish(t, tr, agentRun("run_own")...)
	finish(t, tr, agentRun("run_bad")...)
	if err := x.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantTrace, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	wantParent, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	for _, s := range mem.GetSpans() {
		run := keel.RunID(attrsOf(s)[keyRunID].AsString())
		want := traceIDOf(run)
		if run == "run_h" || run == "run_sub" {
			want = wantTrace
		}
		if s.SpanContext.TraceID() != want {
			t.Errorf("span %s of %s in trace %s, want %s", s.Name, run, s.SpanContext.TraceID(), want)
		}
		root := attrsOf(s)[keyRunID].AsString() != "" && s.SpanContext.SpanID() == spanIDOf("root_"+string(run))
		switch {
		case root && run == "run_h":
			if s.Parent.SpanID() != wantParent || !s.Parent.IsRemote() {
				t.Errorf("root of run_h: parent %s (remote %v), want the origin's span %s, remote", s.Parent.SpanID(), s.Parent.IsRemote(), wantParent)
			}
		case root && run == "run_sub":
			if s.Parent.SpanID() != spanIDOf("step_run_h") {
				t.Errorf("root of run_sub: parent %s, want run_h's step", s.Parent.SpanID())
			}
		case root:
			if s.Parent.IsValid() {
				t.Errorf("root of %s has parent %s, want none", run, s.Parent.SpanID())
			}
		}
	}
	if n := len(mem.GetSpans()); n != 16 {
		t.Errorf("exported %d spans, want 16", n)
	}
}
