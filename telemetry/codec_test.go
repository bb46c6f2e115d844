package telemetry

import (
	"bytes"
	"testing"

	"github.com/keel-runtime/keel"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestRequestCodecKeepsItsBuffer: the codec marshals an export request
// as protobuf would, into the same buffer from request to request, and
// into a new one after a request that failed (gRPC may still hold the
// old one); other messages go through the proto codec.
func TestRequestCodecKeepsItsBuffer(t *testing.T) {
	c := newRequestCodec()
	req := &collectortrace.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{SchemaUrl: "https://example.test/schema"}}}
	want, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	first, err := c.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := first.Materialize(); string(got) != string(want) {
		t.Fatalf("Marshal = %x, want %x", got, want)
	}
	second, err := c.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if &first[0].ReadOnlyData()[0] != &second[0].ReadOnlyData()[0] {
		t.Error("the second request got a new buffer, want the first's")
	}
	c.lost()
	third, err := c.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if &second[0].ReadOnlyData()[0] == &third[0].ReadOnlyData()[0] {
		t.Error("the request after a failure reuses the failed one's buffer")
	}
	resp := &collectortrace.ExportTraceServiceResponse{}
	out, err := c.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var back collectortrace.ExportTraceServiceResponse
	if err := c.Unmarshal(out, &back); err != nil {
		t.Fatal(err)
	}
	if c.Name() != "proto" {
		t.Errorf("Name() = %q, want proto (the content subtype on the wire)", c.Name())
	}
}

// TestRequestCodecSendsTheEncodersBuffer: a request the encoder made is
// handed to gRPC as the bytes protobuf would write, its spans as the
// encoder's own buffer, not a copy; after a failure the encoder starts
// a new buffer, as gRPC may still hold the old one.
func TestRequestCodecSendsTheEncodersBuffer(t *testing.T) {
	t.Parallel()
	c := newRequestCodec()
	e := newEncoder("keel", "v1", scopeName)
	ri := runInfo{run: keel.Run{ID: "r", Model: "m"}, trace: traceIDOf("r")}
	for _, sp := range agentRun("r") {
		a := decodeAttrs(&sp)
		e.add(&sp, &a, &ri, nil, nil, false)
	}
	req := &collectortrace.ExportTraceServiceRequest{ResourceSpans: e.request()}
	want, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.Materialize(); !bytes.Equal(got, want) {
		t.Fatalf("Marshal = %x, want %x", got, want)
	}
	spans := out[len(out)-1].ReadOnlyData()
	if end := e.buf[len(e.buf)-1:]; &spans[len(spans)-1] != &end[0] {
		t.Error("the request's spans are a copy, want the encoder's buffer")
	}
	sent := e.buf
	e.lost()
	e.reset()
	if &e.buf[:1][0] == &sent[:1][0] {
		t.Error("after lost, the encoder writes into the buffer gRPC may still hold")
	}
}
