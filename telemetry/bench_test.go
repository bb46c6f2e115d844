package telemetry

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
)

// BenchmarkFinishSpan is what the run's goroutine pays per finished span:
// the metrics and the hand-over to the queue (export on, a collector that
// never answers, so the queue stays full and every span is dropped, which
// is the same work as queueing it).
func BenchmarkFinishSpan(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "metrics"
		if on {
			name = "metrics+export"
		}
		b.Run(name, func(b *testing.B) {
			cfg := Config{}
			opts := Options{Runs: &fakeRuns{}}
			if on {
				cfg = Config{Endpoint: "http://127.0.0.1:4317", QueueSize: 1, FlushIntervalMS: 3_600_000}
				opts.SpanExporter = &stuckCollector{release: make(chan struct{}), calls: make(chan int, 1)}
			}
			opts.Config = cfg
			x, err := New(opts)
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
				defer cancel()
				x.Close(ctx)
			}()
			tr := x.Tracer(nopTracer{})
			spans := agentRun("run_bench")
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				tr.FinishSpan(ctx, spans[i%len(spans)])
			}
			b.StopTimer()
		})
	}
}

// BenchmarkStub is the export goroutine's mapping of one span.
func BenchmarkStub(b *testing.B) {
	spans := agentRun("run_bench")
	ri := runInfo{run: keel.Run{ID: "run_bench", Model: "keel-tiny"}, trace: traceIDOf("run_bench")}
	res := resource.NewSchemaless()
	b.ReportAllocs()
	for i := range b.N {
		sp := spans[i%len(spans)]
		_ = stub(sp, decodeAttrs(sp.Attrs), ri, nil, nil, false, res, instrumentation.Scope{}).Snapshot()
	}
}

// BenchmarkFlush is the export goroutine's work per span: mapping and
// sending batches of 512 to the real collector KEEL_TEST_OTLP_GRPC
// names (skipped without one).
func BenchmarkFlush(b *testing.B) {
	ep := os.Getenv("KEEL_TEST_OTLP_GRPC")
	if ep == "" {
		b.Skip("no KEEL_TEST_OTLP_GRPC")
	}
	runs := &fakeRuns{runs: map[keel.RunID]keel.Run{"run_bench": {ID: "run_bench", Model: "keel-tiny"}}}
	x, err := New(Options{Config: Config{Endpoint: ep, Insecure: true, Protocol: ProtocolGRPC, FlushIntervalMS: 3_600_000}, Runs: runs})
	if err != nil {
		b.Fatal(err)
	}
	defer x.Close(context.Background())
	spans := agentRun("run_bench")[:4] // no root: the run's state stays
	batch := make([]keel.Span, 512)
	for i := range batch {
		batch[i] = spans[i%len(spans)]
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N / len(batch) {
		x.flush(context.Background(), batch, false)
	}
	b.StopTimer()
	if s := x.Stats(); s.Failed > 0 {
		b.Fatalf("Stats() = %+v", s)
	}
}
