package telemetry

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// BenchmarkHandOver is what the run's goroutine pays per finished span
// with export or metrics on: FinishSpan's hand-over to the export
// goroutine's queue (which it takes whole; no wake-up), taken here every
// 512 spans, as the export goroutine would.
func BenchmarkHandOver(b *testing.B) {
	spans := agentRun("run_bench")
	x := &Exporter{q: &queue{size: 1 << 20, wakeAt: -1}}
	tr := x.Tracer(nopTracer{})
	ctx := context.Background()
	var buf []item
	b.ReportAllocs()
	for i := range b.N {
		tr.FinishSpan(ctx, spans[i%len(spans)])
		if i%512 == 511 {
			buf = x.q.take(buf)
			clear(buf)
		}
	}
}

// BenchmarkMetrics is the export goroutine's recording of one span's
// metrics (with metrics alone: the attributes are decoded only for a
// failed tool call's class).
func BenchmarkMetrics(b *testing.B) {
	x, err := New(Options{Runs: &fakeRuns{}})
	if err != nil {
		b.Fatal(err)
	}
	defer x.Close(context.Background())
	spans := agentRun("run_bench")
	b.ReportAllocs()
	c0 := cpuTime()
	for i := range b.N {
		x.m.span(spans[i%len(spans)], nil)
	}
	reportCPU(b, c0)
}

// BenchmarkEncode is the export goroutine's encoding of one span: its
// attributes decoded, the OTLP messages filled in (reused from batch to
// batch of 512).
func BenchmarkEncode(b *testing.B) {
	spans := agentRun("run_bench")
	ri := runInfo{run: keel.Run{ID: "run_bench", Model: "keel-tiny"}, trace: traceIDOf("run_bench")}
	e := newEncoder("keel", "v1", scopeName)
	b.ReportAllocs()
	for i := range b.N {
		if e.len() == maxBatch {
			e.request()
			e.reset()
		}
		sp := spans[i%len(spans)]
		a := decodeAttrs(&sp)
		e.add(&sp, &a, &ri, nil, nil, false)
	}
}

// marshalClient is an OTLP client that encodes each request to the
// protobuf wire format, as the gRPC client does (size, then marshal),
// and sends it nowhere.
type marshalClient struct{ buf []byte }

func (*marshalClient) Start(context.Context) error { return nil }
func (*marshalClient) Stop(context.Context) error  { return nil }
func (c *marshalClient) UploadTraces(_ context.Context, rss []*tracepb.ResourceSpans) error {
	req := &collectortrace.ExportTraceServiceRequest{ResourceSpans: rss}
	c.buf = slices.Grow(c.buf[:0], proto.Size(req))
	var err error
	c.buf, err = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(c.buf, req)
	return err
}

// BenchmarkFlush is the export goroutine's work per span: encoding
// batches of 512 and sending them, to the protobuf wire format and
// nowhere ("marshal"), or over gRPC to the real collector
// KEEL_TEST_OTLP_GRPC names ("collector", skipped without one). ns/op
// is per span; cpu-ns/span is the process's CPU time per span (every
// goroutine's: the gRPC client's and GC's too; not the collector's).
func BenchmarkFlush(b *testing.B) {
	for _, tc := range []struct {
		name   string
		client otlptrace.Client
		env    string
		proto  string
	}{{"marshal", &marshalClient{}, "", ProtocolGRPC}, {"collector", nil, "KEEL_TEST_OTLP_GRPC", ProtocolGRPC}, {"collector-http", nil, "KEEL_TEST_OTLP_HTTP", ProtocolHTTP}} {
		b.Run(tc.name, func(b *testing.B) {
			ep := "127.0.0.1:4317"
			if tc.env != "" {
				if ep = os.Getenv(tc.env); ep == "" {
					b.Skip("no " + tc.env)
				}
			}
			runs := &fakeRuns{runs: map[keel.RunID]keel.Run{"run_bench": {ID: "run_bench", Model: "keel-tiny"}}}
			x, err := New(Options{Config: Config{Endpoint: ep, Insecure: true, Protocol: tc.proto, FlushIntervalMS: 3_600_000}, Runs: runs, Client: tc.client})
			if err != nil {
				b.Fatal(err)
			}
			defer x.Close(context.Background())
			spans := agentRun("run_bench")[:4] // no root: the run's state stays
			batch := make([]queued, 2048)      // a few requests' worth, however large they are
			for i := range batch {
				batch[i].span = spans[i%len(spans)]
			}
			b.ReportAllocs()
			b.ResetTimer()
			c0 := cpuTime()
			for range b.N / len(batch) {
				for i := range batch {
					// The decode of its attributes is part of a span's export.
					batch[i].attrs = decodeAttrs(&batch[i].span)
				}
				x.flush(context.Background(), batch, false)
			}
			reportCPU(b, c0)
			b.StopTimer()
			if s := x.Stats(); s.Failed > 0 {
				b.Fatalf("Stats() = %+v", s)
			}
		})
	}
}

// cpuTime is the process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU time since c0 per op, as cpu-ns/op.
func reportCPU(b *testing.B, c0 time.Duration) {
	b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op")
}

// TestQueueWakesToArmTheTimerOnly: the export goroutine's flush timer
// runs only while spans wait (an idle daemon's exporter never wakes):
// the first span into an untimed queue wakes the goroutine, later ones
// do not until a batch is full; the timer stops only when nothing came
// in since the last take, and the next span wakes it again.
func TestQueueWakesToArmTheTimerOnly(t *testing.T) {
	q := &queue{size: 10, wakeAt: 4}
	var wakes []bool
	for range 4 {
		_, wake := q.put(item{})
		wakes = append(wakes, wake)
	}
	if want := []bool{true, false, false, true}; !slices.Equal(wakes, want) {
		t.Errorf("wakes of four puts = %v, want %v", wakes, want)
	}
	q.take(nil)
	q.put(item{})
	if q.untime() {
		t.Error("untime with a span in the queue = true, want the timer to run on")
	}
	q.take(nil)
	if !q.untime() {
		t.Error("untime of an empty queue = false, want the timer stopped")
	}
	if _, wake := q.put(item{}); !wake {
		t.Error("the first put after the timer stopped did not wake the goroutine")
	}
}

// TestNoAllocationsPerSpan: handing a span over to the export goroutine
// (the run's side), a step's commit through the exporter's journal,
// recording its metrics and encoding it (once the
// encoder's buffers have grown) allocate nothing per span.
func TestNoAllocationsPerSpan(t *testing.T) {
	x, err := New(Options{Config: Config{FlushIntervalMS: 3_600_000, QueueSize: 1 << 20}, Runs: &fakeRuns{}})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(context.Background())
	spans := agentRun("run_alloc")
	model, tool := spans[0], spans[2]
	tool.Status = keel.SpanOK
	tr := x.Tracer(nopTracer{})
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() { tr.FinishSpan(ctx, model) }); n != 0 {
		t.Errorf("FinishSpan allocates %v times a span, want 0", n)
	}
	// A step's commit (no change of status) through the exporter's
	// journal costs the run nothing more.
	xj, err := New(Options{Config: Config{Endpoint: "http://127.0.0.1:4317", Insecure: true, FlushIntervalMS: 3_600_000}, Runs: &fakeRuns{}, Client: &memClient{}})
	if err != nil {
		t.Fatal(err)
	}
	defer xj.Close(context.Background())
	j, evs := xj.Journal(nopJournal{}), []keel.Event{{Type: keel.EventToolResult}}
	if n := testing.AllocsPerRun(1000, func() { j.AppendAll(ctx, "run_alloc", evs, nil) }); n != 0 {
		t.Errorf("AppendAll without a change of status allocates %v times, want 0", n)
	}
	ma, ta := decodeAttrs(&model), decodeAttrs(&tool)
	if n := testing.AllocsPerRun(1000, func() { x.m.span(model, &ma); x.m.span(tool, &ta) }); n != 0 {
		t.Errorf("recording the metrics of a model and a tool call allocates %v times, want 0", n)
	}
	e := newEncoder("keel", "v1", scopeName)
	ri := runInfo{run: keel.Run{ID: "run_alloc", Model: "keel-tiny"}, trace: traceIDOf("run_alloc")}
	labels := []string{"pii"}
	batch := func() {
		e.reset()
		for range 64 {
			e.add(&model, &ma, &ri, labels, nil, false)
			e.add(&tool, &ta, &ri, nil, nil, false)
		}
		e.request()
	}
	batch()
	// request makes the ResourceSpans message: 2 allocations a batch.
	if n := testing.AllocsPerRun(100, batch); n > 2 {
		t.Errorf("encoding a batch of 128 spans allocates %v times, want at most 2", n)
	}
}

// BenchmarkDecodeAttrs is the decode of a span's JSON attributes alone
// (part of BenchmarkEncode).
func BenchmarkDecodeAttrs(b *testing.B) {
	spans := agentRun("run_bench")
	b.ReportAllocs()
	for i := range b.N {
		sp := spans[i%len(spans)]
		_ = decodeAttrs(&sp)
	}
}

// benchSink keeps the pipeline benchmark's garbage and live heap
// reachable (or not) as the benchmark means.
var benchSink []*[40]uintptr

// BenchmarkPipeline is a run's export end to end, per step (a model
// call, a tool call and the step: 3 spans), in blocks of 13 runs of 50
// steps and the exporter's Flush, as bench/durable -export-block 13
// times them, without the engine and the store: the run's side hands
// its spans and its records over (Tracer, Journal) and the export
// goroutine takes, decodes, records, encodes and sends them. Each step
// also makes the garbage a step of the engine and store makes (~36 kB
// in ~120 objects) over a live heap of ~3 MB, so that the GC runs as
// often as it does under a daemon's runs and the batch's effect on its
// work shows. "metrics" is the daemon's default (metrics, no export);
// "export" sends to the collector KEEL_TEST_OTLP_GRPC names (skipped
// without one). cpu-ns/op is the process's CPU a step: export's own
// cost is export's minus metrics'.
func BenchmarkPipeline(b *testing.B) {
	for _, tc := range []struct{ name, env string }{{"metrics", ""}, {"export", "KEEL_TEST_OTLP_GRPC"}} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := Config{FlushIntervalMS: 3_600_000}
			if tc.env != "" {
				ep := os.Getenv(tc.env)
				if ep == "" {
					b.Skip("no " + tc.env)
				}
				cfg = Config{Endpoint: ep, Insecure: true, Protocol: ProtocolGRPC, FlushIntervalMS: 3_600_000, QueueSize: 1 << 14}
			}
			x, err := New(Options{Config: cfg, Runs: &fakeRuns{}})
			if err != nil {
				b.Fatal(err)
			}
			defer x.Close(context.Background())
			const runs, steps = 13, 50
			type run struct {
				run   keel.Run
				spans [][3]keel.Span
				root  keel.Span
			}
			var block [runs]run
			toolAttrs := json.RawMessage(`{"call_id":"call_1","policy":{"outcome":"allow","explanation":"allow: rule 1 of the user layer (policy.json:3:5)","version":1,"digest":"d"}}`)
			for r := range block {
				id := keel.RunID(fmt.Sprintf("run_%02d", r))
				root := "root_" + string(id)
				block[r].run = keel.Run{ID: id, Model: "keel-tiny", Goal: "echo"}
				block[r].root = keel.Span{ID: root, RunID: id, Kind: keel.SpanRun, Name: "agent", Start: t0, Duration: time.Second, Status: keel.SpanOK}
				for s := range steps {
					step := fmt.Sprintf("step_%s_%d", id, s)
					block[r].spans = append(block[r].spans, [3]keel.Span{
						{ID: "model_" + step, RunID: id, ParentID: step, Kind: keel.SpanModelCall, Name: "keel-tiny", Step: s + 1, Start: t0, Duration: time.Millisecond,
							Status: keel.SpanOK, PromptTokens: 12, CompletionTokens: 7, Provider: "bench", FinishReason: "tool_calls"},
						{ID: "tool_" + step, RunID: id, ParentID: step, Kind: keel.SpanToolCall, Name: "echo", Step: s + 1, Start: t0, Duration: time.Millisecond,
							Status: keel.SpanOK, Attrs: toolAttrs},
						{ID: step, RunID: id, ParentID: root, Kind: keel.SpanStep, Name: "step", Step: s + 1, Start: t0, Duration: 2 * time.Millisecond, Status: keel.SpanOK},
					})
				}
			}
			live := make([]*[40]uintptr, 3<<20/320)
			for i := range live {
				live[i] = new([40]uintptr)
			}
			tr, j := x.Tracer(nopTracer{}), x.Journal(nopJournal{})
			ctx := context.Background()
			done := &keel.RunUpdate{Status: keel.RunSucceeded, Result: "done"}
			garbage := make([]*[40]uintptr, 112)
			b.ResetTimer()
			c0 := cpuTime()
			n := 0
			for n < b.N {
				for r := range block {
					j.CreateRun(ctx, block[r].run)
					for s := range block[r].spans {
						for g := range garbage {
							garbage[g] = new([40]uintptr)
						}
						for k := range block[r].spans[s] {
							tr.FinishSpan(ctx, block[r].spans[s][k])
						}
					}
					tr.FinishSpan(ctx, block[r].root)
					j.AppendAll(ctx, block[r].run.ID, nil, done)
					n += steps
				}
				if err := x.Flush(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime()-c0)/float64(n), "cpu-ns/op")
			b.StopTimer()
			benchSink = live
			if s := x.Stats(); s.Failed+s.Dropped > 0 {
				b.Fatalf("Stats() = %+v", s)
			}
		})
	}
}
