package telemetry

import (
	"sync"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	// The proto codec this one falls back to registers itself.
	_ "google.golang.org/grpc/encoding/proto"
)

// requestCodec is the OTLP/gRPC client's codec. An export request made
// by the encoder (one ResourceSpans: its resource, and its scope spans
// already encoded, see encoder.request) is handed to gRPC as two
// buffers, without a copy: the head (the request's and the resource
// spans' tags and lengths, the resource, encoded once) and the
// encoder's own buffer. Another export request is marshalled into a
// buffer kept from request to request, where gRPC's proto codec takes
// one from its pool per request (its pool's tier for anything over
// 32 KiB is 1 MiB, which it zeroes on every use, and the GC empties the
// pool between batches). Everything else (the response) goes through
// the proto codec.
//
// The export goroutine sends one request at a time, so one buffer is
// enough; after a request that failed, gRPC may still hold its buffers
// (a stream cancelled mid-write), so lost gives them up (and the
// exporter the encoder's, see encoder.lost) and the next request starts
// new ones.
type requestCodec struct {
	fallback encoding.CodecV2

	mu  sync.Mutex
	buf []byte
	// The resource last sent and its encoding: the exporter sends the
	// same one in every request.
	res      *resourcepb.Resource
	resBytes []byte
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
	if spans, ok := encodedSpans(req); ok {
		return c.marshalEncoded(req.ResourceSpans[0].Resource, spans)
	}
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

// encodedSpans returns the encoded scope spans of req when it is one
// the encoder made: a single ResourceSpans holding a resource and, as
// its unknown fields, the scope spans (see encoder.request), and
// nothing else.
func encodedSpans(req *collectortrace.ExportTraceServiceRequest) ([]byte, bool) {
	if len(req.ResourceSpans) != 1 {
		return nil, false
	}
	rs := req.ResourceSpans[0]
	if rs == nil || len(rs.ScopeSpans) != 0 || rs.SchemaUrl != "" {
		return nil, false
	}
	spans := rs.ProtoReflect().GetUnknown()
	return spans, len(spans) > 0
}

// marshalEncoded returns the request of one ResourceSpans, resource res
// and the scope spans already encoded (spans), as the head and spans,
// with c.mu held: the bytes proto.Marshal would write, without copying
// spans.
func (c *requestCodec) marshalEncoded(res *resourcepb.Resource, spans []byte) (mem.BufferSlice, error) {
	if res != c.res || c.resBytes == nil {
		b, err := proto.Marshal(res)
		if err != nil {
			return nil, err
		}
		c.res, c.resBytes = res, b
	}
	rsLen := len(spans)
	if res != nil {
		rsLen += protowire.SizeTag(fieldResource) + protowire.SizeBytes(len(c.resBytes))
	}
	h := protowire.AppendTag(c.buf[:0], fieldRequestResourceSpans, protowire.BytesType)
	h = protowire.AppendVarint(h, uint64(rsLen))
	if res != nil {
		h = protowire.AppendTag(h, fieldResource, protowire.BytesType)
		h = protowire.AppendBytes(h, c.resBytes)
	}
	c.buf = h
	return mem.BufferSlice{mem.SliceBuffer(h), mem.SliceBuffer(spans)}, nil
}

// Field numbers of the export request
// (opentelemetry/proto/collector/trace/v1/trace_service.proto,
// trace/v1/trace.proto).
const (
	fieldRequestResourceSpans = 1 // ExportTraceServiceRequest.resource_spans
	fieldResource             = 1 // ResourceSpans.resource
)
