package telemetry

import (
	"testing"

	"google.golang.org/protobuf/proto"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"

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
