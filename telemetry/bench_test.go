package telemetry

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/keel-runtime/keel"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
)

// BenchmarkHandOver is what the run's goroutine pays per finished span
// with export or metrics on: the hand-over to the export goroutine's
// queue (which it takes whole; no wake-up).
func BenchmarkHandOver(b *testing.B) {
	spans := agentRun("run_bench")
	q := &queue{size: b.N + 1, wakeAt: -1, items: make([]item, 0, b.N)}
	b.ReportAllocs()
	for i := range b.N {
		q.put(item{span: spans[i%len(spans)]})
	}
}

// BenchmarkMetrics is the export goroutine's recording of one span's
// metrics.
func BenchmarkMetrics(b *testing.B) {
	x, err := New(Options{Runs: &fakeRuns{}})
	if err != nil {
		b.Fatal(err)
	}
	defer x.Close(context.Background())
	spans := agentRun("run_bench")
	b.ReportAllocs()
	for i := range b.N {
		x.m.span(spans[i%len(spans)])
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
