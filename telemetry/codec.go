package telemetry

import (
	"sync"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	// The proto codec this one falls back to registers itself.
	_ "google.golang.org/grpc/encoding/proto"
)

// requestCodec is the OTLP/gRPC client's codec: an export request is
// marshalled into a buffer kept from request to request, where gRPC's
// proto codec takes one from its pool per request. Its pool's tier for
// anything over 32 KiB is 1 MiB, which it zeroes on every use, and the
// GC empties the pool between batches: most requests were a fresh 1 MiB,
// allocated, zeroed and collected. Everything else (the response) goes
// through the proto codec.
//
// The export goroutine sends one request at a time, so one buffer is
// enough; after a request that failed, gRPC may still hold its buffer
// (a stream cancelled mid-write), so lost gives it up and the next
// request starts a new one.
type requestCodec struct {
	fallback encoding.CodecV2

	mu  sync.Mutex
	buf []byte
}

// maxKeptRequest is the largest request buffer kept for the next.
const maxKeptRequest = 2 << 20

func newRequestCodec() *requestCodec {
	return &requestCodec{fallback: encoding.GetCodecV2("proto")}
}

func (c *requestCodec) Marshal(v any) (mem.BufferSlice, error) {
	req, ok := v.(*collectortrace.ExportTraceServiceRequest)
	if !ok {
		return c.fallback.Marshal(v)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cap(c.buf) > maxKeptRequest {
		c.buf = nil // a batch of unusually large spans: not kept for the next
	}
	b, err := proto.MarshalOptions{}.MarshalAppend(c.buf[:0], req)
	if err != nil {
		return nil, err
	}
	c.buf = b
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (c *requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return c.fallback.Unmarshal(data, v)
}

// Name is the proto codec's, so that the content subtype on the wire is
// unchanged.
func (c *requestCodec) Name() string { return c.fallback.Name() }

// lost gives up the buffer after a request that failed.
func (c *requestCodec) lost() {
	c.mu.Lock()
	c.buf = nil
	c.mu.Unlock()
}
