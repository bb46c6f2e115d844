package telemetry

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/protobuf/proto"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/keel-runtime/keel"
)

// TestBatchFitsTheGRPCPool: a batch is sent before its request grows
// past 1 MiB, the largest buffer the gRPC client keeps in its pool (a
// larger request is a new buffer each time, faulted in and collected),
// and a batch of small spans still holds maxBatch of them.
func TestBatchFitsTheGRPCPool(t *testing.T) {
	ri := runInfo{run: keel.Run{ID: "run_batch", Model: "keel-tiny"}, trace: traceIDOf("run_batch")}
	fill := func(spans []keel.Span, big bool) (n, size int) {
		e := newEncoder("keel", "v1", scopeName)
		for i := 0; !e.full(); i++ {
			sp := spans[i%len(spans)]
			a := decodeAttrs(&sp)
			var c *spanContent
			if big {
				c = &spanContent{input: string(make([]byte, 8<<10))}
			}
			e.add(&sp, &a, &ri, nil, c, false)
		}
		return e.len(), proto.Size(&collectortrace.ExportTraceServiceRequest{ResourceSpans: e.request()})
	}
	if n, size := fill(agentRun("run_batch"), false); n != maxBatch || size > 1<<20 {
		t.Errorf("small spans: a batch of %d spans, %d bytes; want %d spans within 1 MiB", n, size, maxBatch)
	}
	if n, size := fill(agentRun("run_batch"), true); n >= maxBatch || size > 1<<20 {
		t.Errorf("spans with 8 KiB of content: a batch of %d spans, %d bytes; want fewer than %d spans within 1 MiB", n, size, maxBatch)
	}
}

// batchCounter is a memClient that records how many spans each request
// held.
type batchCounter struct {
	*memClient
	sizes []int
}

func (c *batchCounter) UploadTraces(ctx context.Context, rss []*tracepb.ResourceSpans) error {
	c.mu.Lock()
	before := len(c.spans)
	c.mu.Unlock()
	err := c.memClient.UploadTraces(ctx, rss)
	c.mu.Lock()
	c.sizes = append(c.sizes, len(c.spans)-before)
	c.mu.Unlock()
	return err
}

// TestBatchesFillAsSpansAreTaken: without content, spans are encoded as
// the export goroutine takes them (a wake every 512), a batch goes as it
// fills (maxBatch), and a run's root span waits for the journal's
// record of the run's end, which comes after it, whatever the batch it
// falls in.
func TestBatchesFillAsSpansAreTaken(t *testing.T) {
	t.Parallel()
	// What a read would find: not what the journal wrote.
	runs := &fakeRuns{runs: map[keel.RunID]keel.Run{"run_big": {ID: "run_big", Status: keel.RunRunning}}}
	col := &batchCounter{memClient: &memClient{}}
	x, err := New(Options{Config: Config{Endpoint: "http://127.0.0.1:4317", Insecure: true, FlushIntervalMS: 3_600_000, QueueSize: 1 << 14},
		Runs: runs, Client: col})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(context.Background())
	ctx := context.Background()
	j, tr := x.Journal(nopJournal{}), x.Tracer(nopTracer{})
	if err := j.CreateRun(ctx, keel.Run{ID: "run_big", Model: "keel-tiny", Status: keel.RunQueued}); err != nil {
		t.Fatal(err)
	}
	const n = 5000
	for i := range n {
		finish(t, tr, keel.Span{ID: fmt.Sprint("tool_", i), RunID: "run_big", ParentID: "root_big", Kind: keel.SpanToolCall, Name: "echo", Step: i + 1, Start: t0, Duration: time.Millisecond, Status: keel.SpanOK})
	}
	finish(t, tr, keel.Span{ID: "root_big", RunID: "run_big", Kind: keel.SpanRun, Name: "agent", Start: t0, Duration: time.Second, Status: keel.SpanError, Error: "failed: boom"})
	if _, err := j.AppendAll(ctx, "run_big", nil, &keel.RunUpdate{Status: keel.RunFailed, Error: "boom"}); err != nil {
		t.Fatal(err)
	}
	if err := x.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if s := x.Stats(); s.Exported != n+1 || s.Failed+s.Dropped+s.Denied > 0 {
		t.Fatalf("Stats() = %+v, want %d exported", s, n+1)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	total := 0
	for _, k := range col.sizes {
		if k > maxBatch {
			t.Errorf("a request held %d spans, want at most %d", k, maxBatch)
		}
		total += k
	}
	if total != n+1 || len(col.sizes) < (n+1+maxBatch-1)/maxBatch {
		t.Errorf("requests of %v spans, want %d spans in at least %d requests", col.sizes, n+1, (n+1+maxBatch-1)/maxBatch)
	}
	var root *tracetest.SpanStub
	for i := range col.spans {
		if col.spans[i].Name == opInvokeAgent+" agent" {
			root = &col.spans[i]
		}
	}
	if root == nil {
		t.Fatal("the root span was not exported")
	}
	if s := attrsOf(*root)[keyRunStatus].AsString(); s != "failed" {
		t.Errorf("the root span's %s = %q, want failed (the journal's record of the end, which came after it)", keyRunStatus, s)
	}
}
