// Package telemetry exports what keel records to the outside world,
// local-first: every run's span tree over OTLP (gRPC or HTTP) to a
// collector the user names, and metrics (tokens, cost, tool latency,
// failures by class, runs by state) in the Prometheus format on the
// daemon's own endpoint.
//
// Export is off by default. It is configured by telemetry.json in the
// data directory (LoadConfig) and is an egress like any other: before a
// run's spans leave, the policy decides the telemetry action for the
// collector's URL, and a span whose run or labels hold anything
// labelled carries no content. Prompts and outputs are exported only
// when the file opts in ("content": true).
//
// The seam is the engine's Tracer: Exporter.Tracer wraps the store's,
// forwards every call unchanged and hands each finished span to a
// bounded queue that one goroutine drains. Exporter.Journal wraps the
// engine's journal the same way, handing over each run's record as it
// is created and as it ends, so that the goroutine knows a run's model,
// kind, labels and outcome without reading it back from the database. A collector that is down or
// slow fills the queue; spans that do not fit are dropped and counted
// (Stats, shown by keel doctor), never waited for: the run does not
// slow down or fail. keel's spans are already recorded, with their own
// IDs, start and duration, so they are not re-created through an OTel
// tracer, nor mapped to SDK spans: the export goroutine writes them in
// the OTLP protobuf wire format itself (encoder), with IDs derived from
// keel's (a hash), into a buffer it reuses from batch to batch, and
// hands them to the official OTLP client as a ResourceSpans message's
// encoded scope spans. A top-level run is one trace; a sub-agent's spans
// are in its parent's trace, under the step it carries out. A span's
// attributes (keel.Span.Attrs, JSON) are read once, for the export and
// the metrics, by a scanner of keel's own that reads only the fields the
// export uses (checked against encoding/json by FuzzDecodeAttrs).
//
// Why not the SDK's own path: mapping each span to a ReadOnlySpan
// (tracetest.SpanStub) for the OTLP exporter's transform to copy into
// protobuf messages, which protobuf then encodes by reflection, cost a
// span about 7 µs of CPU on a quiet 2-core machine, and the export
// goroutine competes with the runs for those cores. The encoding is
// checked against what the SDK's path sent (TestOTLPGolden, decoded by
// an in-process collector over both transports). Over gRPC the client
// marshals each request with a codec of keel's (requestCodec), which
// hands gRPC the encoder's buffer as it is, after a head of a few bytes,
// instead of a copy into a fresh, zeroed 1 MiB from gRPC's pool per
// batch.
//
// The OTel SDK (go.opentelemetry.io/otel) is the official one: its OTLP
// clients (otlptracegrpc, otlptracehttp) speak both transports with
// retries, TLS and headers, and its Prometheus exporter serves metrics
// in the format every scraper reads; the attribute names follow the
// GenAI semantic conventions. Only the encoding of keel's spans is
// keel's. The metrics are recorded with the SDK's instruments, with
// their attribute sets made once per model, tool and failure class.
//
// docs/observability.md lists the configuration, the attributes and the
// metrics.
package telemetry
