package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keel-runtime/keel"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

var update = flag.Bool("update", false, "rewrite testdata/otlp.golden.json from what the exporter sends")

// receiver is an in-process OTLP collector, over gRPC or HTTP: it keeps
// every request it decodes.
type receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu   sync.Mutex
	reqs []*collectortrace.ExportTraceServiceRequest
}

func (r *receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, proto.Clone(req).(*collectortrace.ExportTraceServiceRequest))
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	var m collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &m); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.Export(req.Context(), &m)
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// startReceiver starts a receiver over protocol and returns it and the
// endpoint to configure.
func startReceiver(t *testing.T, protocol string) (*receiver, string) {
	t.Helper()
	r := &receiver{}
	if protocol == ProtocolHTTP {
		srv := httptest.NewServer(r)
		t.Cleanup(srv.Close)
		return r, srv.URL
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, r)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return r, ln.Addr().String()
}

// merged returns the spans of every request received as one request:
// one resource, one scope, the spans sorted by ID. Each request must
// hold the same resource and scope.
func (r *receiver) merged(t *testing.T) *collectortrace.ExportTraceServiceRequest {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out *tracepb.ResourceSpans
	for _, req := range r.reqs {
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				if out == nil {
					out = &tracepb.ResourceSpans{Resource: rs.Resource, SchemaUrl: rs.SchemaUrl,
						ScopeSpans: []*tracepb.ScopeSpans{{Scope: ss.Scope, SchemaUrl: ss.SchemaUrl}}}
				}
				if !proto.Equal(rs.Resource, out.Resource) || !proto.Equal(ss.Scope, out.ScopeSpans[0].Scope) {
					t.Errorf("a request's resource %v scope %v, want %v %v as in the others", rs.Resource, ss.Scope, out.Resource, out.ScopeSpans[0].Scope)
				}
				out.ScopeSpans[0].Spans = append(out.ScopeSpans[0].Spans, ss.Spans...)
			}
		}
	}
	if out == nil {
		t.Fatal("the receiver got no spans")
	}
	slices.SortFunc(out.ScopeSpans[0].Spans, func(a, b *tracepb.Span) int { return bytes.Compare(a.SpanId, b.SpanId) })
	return &collectortrace.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{out}}
}

// goldenSpans are spans of every kind and shape the mapping knows, with
// the events that carry their content: an agent run whose tool call
// waited for approval and failed; a plan run whose step ran a sub-agent
// (whose root failed); a model call with every detail a provider
// reports; a tool call with egress decisions and a labelled result,
// after which the run's content is withheld; a private run.
func goldenSpans() ([]keel.Span, []keel.Event, map[keel.RunID]keel.Run) {
	runs := map[keel.RunID]keel.Run{
		"run_a":   {ID: "run_a", Model: "keel-tiny", Status: keel.RunSucceeded, Goal: "count the words", Result: "three"},
		"run_p":   {ID: "run_p", Kind: keel.KindPlan, Model: "keel-tiny", Status: keel.RunFailed, Goal: "plan it"},
		"run_sub": {ID: "run_sub", Model: "keel-tiny", Status: keel.RunFailed, ParentID: "run_p", ParentStep: "s1"},
		"run_l":   {ID: "run_l", Model: "keel-tiny", Status: keel.RunSucceeded, Goal: "fetch"},
		"run_x":   {ID: "run_x", Model: "keel-tiny", Status: keel.RunSucceeded, Goal: "the secret", Policy: keel.RunPolicy{Private: true}},
	}
	spans := agentRun("run_a")
	spans = append(spans,
		keel.Span{ID: "s1_run_p", RunID: "run_p", ParentID: "root_run_p", Kind: keel.SpanStep, Name: "s1", Step: 1, Start: t0, Duration: time.Second, Status: keel.SpanError,
			Error: "the sub-agent failed", Attrs: json.RawMessage(`{"run":"run_sub","attempt":2}`)},
		keel.Span{ID: "root_run_sub", RunID: "run_sub", ParentID: "s1_run_p", Kind: keel.SpanRun, Name: "agent", Start: t0, Duration: 900 * time.Millisecond, Status: keel.SpanError, Error: "failed: boom"},
		keel.Span{ID: "root_run_p", RunID: "run_p", Kind: keel.SpanRun, Name: "plan", Start: t0, Duration: 2 * time.Second, Status: keel.SpanError, Error: "failed"},
		keel.Span{ID: "m1_run_l", RunID: "run_l", ParentID: "st1_run_l", Kind: keel.SpanModelCall, Name: "gpt-x", Step: 1, Start: t0, Duration: 800 * time.Millisecond, Status: keel.SpanOK,
			PromptTokens: 1000, CompletionTokens: 20, Provider: "openai", CostUSD: 0.0125, TTFT: 250 * time.Millisecond, Retries: 2, FinishReason: "tool_calls",
			ModelDigest: "sha256:abc", TemplateHash: "0123456789abcdef", PromptHash: "fedcba9876543210",
			Attrs: json.RawMessage(`{"route":"cheap","variant":"b","attempts":[{"provider":"ollama","error":"down"}],"policy":[{"provider":"ollama","model":"keel-tiny","outcome":"deny","explanation":"deny: rule 2","version":3,"digest":"d"},{"provider":"openai","model":"gpt-x","outcome":"allow","explanation":"allow: rule 1","version":3,"digest":"d"}]}`)},
		keel.Span{ID: "t1_run_l", RunID: "run_l", ParentID: "st1_run_l", Kind: keel.SpanToolCall, Name: "fetch", Step: 1, Start: t0.Add(time.Second), Duration: 30 * time.Millisecond, Status: keel.SpanOK,
			Attrs: json.RawMessage(`{"call_id":"call_f","policy":{"outcome":"allow","explanation":"allow: rule 4","version":3,"digest":"d"},"labels":["web","pii"],"egress":[{"destination":"https://a.example","policy":{"outcome":"allow","explanation":"ok"}},{"destination":"https://b.example","policy":{"outcome":"deny","explanation":"no"}}]}`)},
		keel.Span{ID: "m2_run_l", RunID: "run_l", ParentID: "st2_run_l", Kind: keel.SpanModelCall, Name: "gpt-x", Step: 2, Start: t0.Add(2 * time.Second), Duration: time.Second, Status: keel.SpanError,
			Error: "the provider said: pii leaked", Provider: "openai"},
		keel.Span{ID: "st1_run_l", RunID: "run_l", ParentID: "root_run_l", Kind: keel.SpanStep, Name: "step", Step: 1, Start: t0, Duration: 1100 * time.Millisecond, Status: keel.SpanOK},
		keel.Span{ID: "st2_run_l", RunID: "run_l", ParentID: "root_run_l", Kind: keel.SpanStep, Name: "step", Step: 2, Start: t0.Add(2 * time.Second), Duration: time.Second, Status: keel.SpanError, Error: "model"},
		keel.Span{ID: "root_run_l", RunID: "run_l", Kind: keel.SpanRun, Name: "agent", Start: t0, Duration: 3 * time.Second, Status: keel.SpanOK},
		keel.Span{ID: "m1_run_x", RunID: "run_x", ParentID: "root_run_x", Kind: keel.SpanModelCall, Name: "keel-tiny", Step: 1, Start: t0, Duration: time.Second, Status: keel.SpanOK, PromptTokens: 5, CompletionTokens: 5},
		keel.Span{ID: "root_run_x", RunID: "run_x", Kind: keel.SpanRun, Name: "agent", Start: t0, Duration: 2 * time.Second, Status: keel.SpanOK},
		keel.Span{ID: "odd", RunID: "run_x", ParentID: "root_run_x", Kind: "custom.kind", Name: "x", Start: t0, Duration: time.Millisecond, Status: keel.SpanOK},
	)
	events := []keel.Event{
		event("run_a", keel.EventModelResult, keel.ModelResultData{Step: 1, Content: "let me count", ToolCalls: []keel.ToolCall{{ID: "call_1", Name: "echo", Arguments: json.RawMessage(`{"text":"one two three"}`)}}}),
		event("run_a", keel.EventToolResult, keel.ToolResultData{Step: 1, CallID: "call_1", Name: "echo", Output: json.RawMessage(`"one two three"`)}),
		event("run_l", keel.EventModelResult, keel.ModelResultData{Step: 1, ToolCalls: []keel.ToolCall{{ID: "call_f", Name: "fetch", Arguments: json.RawMessage(`{"url":"https://a.example"}`)}}}),
		event("run_l", keel.EventToolResult, keel.ToolResultData{Step: 1, CallID: "call_f", Name: "fetch", Output: json.RawMessage(`"a page"`)}),
		event("run_x", keel.EventModelResult, keel.ModelResultData{Step: 1, Content: "the secret is swordfish"}),
	}
	return spans, events, runs
}

// TestOTLPGolden exports goldenSpans over both transports of the
// official OTLP clients to an in-process collector and compares what it
// decodes, span by span and attribute by attribute, with
// testdata/otlp.golden.json: what the exporter sent when it mapped
// keel's spans through the OTel SDK's own OTLP transform (SpanStub and
// otlptrace.Exporter). A lost or changed attribute, parent, ID, time,
// status or resource fails it. go test -run TestOTLPGolden -update
// rewrites the file from the current code: review the diff.
func TestOTLPGolden(t *testing.T) {
	t.Parallel()
	golden := filepath.Join("testdata", "otlp.golden.json")
	for _, protocol := range []string{ProtocolGRPC, ProtocolHTTP} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			rcv, endpoint := startReceiver(t, protocol)
			spans, events, runs := goldenSpans()
			x, err := New(Options{Config: Config{Endpoint: endpoint, Insecure: true, Protocol: protocol, FlushIntervalMS: 3_600_000, Content: true, ServiceName: "keel-golden"},
				Runs: &fakeRuns{runs: runs}, Version: "v0.0.0-test"})
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range events {
				x.OnEvent(ev)
			}
			finish(t, x.Tracer(nopTracer{}), spans...)
			if err := x.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if s := x.Stats(); s.Exported != uint64(len(spans)) || s.Failed+s.Dropped+s.Denied != 0 {
				t.Fatalf("Stats() = %+v, want %d exported", s, len(spans))
			}
			got := rcv.merged(t)
			if *update {
				if protocol != ProtocolGRPC {
					return
				}
				b, err := protojson.MarshalOptions{Multiline: true}.Marshal(got)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, append(b, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			b, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			want := &collectortrace.ExportTraceServiceRequest{}
			if err := protojson.Unmarshal(b, want); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
				t.Errorf("the collector received other spans than %s (-want +got):\n%s", golden, d)
			}
		})
	}
}

// TestDecodeAttrsOddShapes: a span's attributes are decoded in one pass
// into the form of its kind; attributes in another form (a decision
// where a list was expected, or the reverse) keep every field that
// fits, and the decision when its own form is valid.
func TestDecodeAttrsOddShapes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind      keel.SpanKind
		attrs     string
		call      string
		route     string
		decision  string // its outcome
		decisions int
	}{
		{keel.SpanToolCall, `{"call_id":"c1","policy":{"outcome":"ask","explanation":"e"}}`, "c1", "", "ask", 0},
		{keel.SpanModelCall, `{"route":"r","policy":[{"provider":"p","model":"m","outcome":"allow"}]}`, "", "r", "", 1},
		{keel.SpanToolCall, `{"call_id":"c1","policy":[{"provider":"p","model":"m","outcome":"allow"}]}`, "c1", "", "", 1},
		{keel.SpanModelCall, `{"route":"r","policy":{"outcome":"deny"}}`, "", "r", "deny", 0},
		{keel.SpanHuman, `{"call_id":"c2","policy":"allow"}`, "c2", "", "", 0},
		{keel.SpanToolCall, `{"call_id":`, "", "", "", 0},
	} {
		a := decodeAttrs(&keel.Span{Kind: tc.kind, Attrs: json.RawMessage(tc.attrs)})
		outcome := ""
		if a.Policy.Decision != nil {
			outcome = a.Policy.Decision.Outcome
		}
		if a.CallID != tc.call || a.Route != tc.route || outcome != tc.decision || len(a.Policy.Decisions) != tc.decisions {
			t.Errorf("decodeAttrs(%s %s) = call %q route %q decision %q, %d decisions; want %q %q %q %d",
				tc.kind, tc.attrs, a.CallID, a.Route, outcome, len(a.Policy.Decisions), tc.call, tc.route, tc.decision, tc.decisions)
		}
	}
}

// FuzzDecodeAttrs: decodeAttrs reads what encoding/json reads of the
// same JSON (refAttrs), field by field, and never panics on anything.
func FuzzDecodeAttrs(f *testing.F) {
	for _, sp := range agentRun("run_fuzz") {
		f.Add(string(sp.Attrs))
	}
	for _, s := range []string{
		`{"call_id":"c\"1\u003e","labels":["pii","private"],"egress":[{"policy":{"outcome":"allow"}},{"policy":{"outcome":"deny"}},{},{"policy":null},{"policy":{}}],"error_type":"timeout"}`,
		`{"run":"run_x","attempt":3,"route":"r","variant":"b","policy":[{"provider":"p","model":"m","explanation":"e","extra":[1,{"a":null}]},7]}`,
		`{"labels":"pii","attempt":"3","policy":"allow","call_id":5,"egress":{}}`,
		`{"call_id":"a","call_id":"b","labels":["x"],"labels":["y"]}`,
		` { "call_id" : "c" , "attempt" : -2 , "x" : [ true , false , null , 1.5e3 ] } `,
		`{"query":"lease \"renewal\"","scopes":["user","workspace:/src",7],"limit":5,"hits":[{"n":1,"source":"/src/a.go","lines":"3-9","scope":"user","score":0.0325,"bm25_rank":1,"shown":true},{"source":"b.md","score":1e400},3,{"score":"x"}],"call_id":"call_9"}`,
		`{"hits":{},"scopes":"user","limit":"5","query":["q"]}`,
		`{"attempt":1.5}`, `[]`, `null`, `"x"`, `{}`, `{"call_id":`, `{"a":tru}`, `{"a":"\ud83d\ude00"}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got := decodeAttrs(&keel.Span{Attrs: json.RawMessage(in)})
		if !json.Valid([]byte(in)) || strings.Count(in, "[")+strings.Count(in, "{") > maxAttrDepth {
			return
		}
		if want := refAttrs(t, in); !reflect.DeepEqual(got, want) {
			t.Errorf("decodeAttrs(%s) = %+v, want %+v", in, got, want)
		}
	})
}

// refAttrs is what decodeAttrs reads of valid JSON in, read with
// encoding/json.
func refAttrs(t *testing.T, in string) spanAttrs {
	var a spanAttrs
	d := json.NewDecoder(strings.NewReader(in))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return a // not an object
	}
	str := func(v any) string { s, _ := v.(string); return s }
	a.CallID, a.ErrorType, a.Route, a.Variant, a.Run = str(m["call_id"]), str(m["error_type"]), str(m["route"]), str(m["variant"]), keel.RunID(str(m["run"]))
	if n, ok := m["attempt"].(json.Number); ok {
		a.Attempt, _ = strconv.Atoi(n.String())
	}
	if l, ok := m["labels"].([]any); ok {
		for _, v := range l {
			if s, ok := v.(string); ok {
				a.Labels = append(a.Labels, s)
			}
		}
	}
	if eg, ok := m["egress"].([]any); ok {
		for _, v := range eg {
			a.Egress++
			if o, ok := v.(map[string]any); ok {
				if pd, ok := o["policy"].(map[string]any); ok && str(pd["outcome"]) != "allow" {
					a.EgressRefused++
				}
			}
		}
	}
	a.Query = str(m["query"])
	if l, ok := m["scopes"].([]any); ok {
		for _, v := range l {
			if s, ok := v.(string); ok {
				a.Scopes = append(a.Scopes, s)
			}
		}
	}
	if n, ok := m["limit"].(json.Number); ok {
		a.Limit, _ = strconv.Atoi(n.String())
	}
	if hs, ok := m["hits"].([]any); ok {
		for _, v := range hs {
			var h retrievalHit
			if o, ok := v.(map[string]any); ok {
				h.Source, h.Lines = str(o["source"]), str(o["lines"])
				if n, ok := o["score"].(json.Number); ok {
					if f, err := strconv.ParseFloat(n.String(), 64); err == nil {
						h.Score = f
					}
				}
			}
			a.Hits = append(a.Hits, h)
		}
	}
	switch p := m["policy"].(type) {
	case map[string]any:
		a.Policy.Decision = &decision{Outcome: str(p["outcome"]), Explanation: str(p["explanation"])}
	case []any:
		for _, v := range p {
			o, _ := v.(map[string]any)
			a.Policy.Decisions = append(a.Policy.Decisions, modelDecision{Provider: str(o["provider"]), Model: str(o["model"]), Explanation: str(o["explanation"])})
		}
	}
	return a
}

// TestEncodeSpanOfAnySize: a span is written in place after room for a
// length of two bytes (128 bytes to 16 KiB); a shorter or longer span
// is moved to fit its length. Each size of length, one after another in
// one batch, decodes to the span written, with the spans around it
// intact.
func TestEncodeSpanOfAnySize(t *testing.T) {
	t.Parallel()
	ri := runInfo{run: keel.Run{ID: "r", Model: "m"}, trace: traceIDOf("r")}
	sizes := []int{0, 200, 20_000, 3_000_000} // content: lengths of 1, 2, 3 and 4 bytes
	e := newEncoder("keel", "v1", scopeName)
	for i, n := range sizes {
		sp := keel.Span{ID: "s" + strconv.Itoa(i), RunID: "r", Kind: "x", Status: keel.SpanOK}
		var c *spanContent
		if n > 0 {
			c = &spanContent{output: strings.Repeat(strconv.Itoa(i), n)}
		}
		e.add(&sp, &spanAttrs{}, &ri, nil, c, false)
	}
	b, err := proto.Marshal(&collectortrace.ExportTraceServiceRequest{ResourceSpans: e.request()})
	if err != nil {
		t.Fatal(err)
	}
	var req collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		t.Fatalf("the batch does not decode: %v", err)
	}
	spans := req.ResourceSpans[0].ScopeSpans[0].Spans
	if len(spans) != len(sizes) {
		t.Fatalf("%d spans decoded, want %d", len(spans), len(sizes))
	}
	for i, s := range spans {
		attrs := map[string]string{}
		for _, kv := range s.Attributes {
			attrs[kv.Key] = kv.Value.GetStringValue()
		}
		if id := "s" + strconv.Itoa(i); attrs[keySpanID] != id || s.Name != "x" || s.Status.GetCode() != tracepb.Status_STATUS_CODE_OK {
			t.Errorf("span %d: %s %q, status %v; want %s x, ok", i, attrs[keySpanID], s.Name, s.Status, id)
		}
		if want := strings.Repeat(strconv.Itoa(i), sizes[i]); attrs[keyOutput] != want {
			t.Errorf("span %d: output of %d bytes, want %d", i, len(attrs[keyOutput]), len(want))
		}
	}
}
