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
// bounded queue that one goroutine drains. A collector that is down or
// slow fills the queue; spans that do not fit are dropped and counted
// (Stats, shown by keel doctor), never waited for: the run does not
// slow down or fail. keel's spans are already recorded, with their own
// IDs, start and duration, so they are not re-created through an OTel
// tracer: each becomes a ReadOnlySpan (tracetest.SpanStub) with IDs
// derived from keel's (a hash), and goes to the OTLP exporter's
// ExportSpans. A top-level run is one trace; a sub-agent's spans are in
// its parent's trace, under the step it carries out.
//
// The OTel SDK (go.opentelemetry.io/otel) is the official one: its OTLP
// exporters speak both transports with retries, TLS and headers, and its
// Prometheus exporter serves metrics in the format every scraper reads;
// the attribute names follow the GenAI semantic conventions. Writing our
// own OTLP encoder would save a dependency and lose all of that.
//
// docs/observability.md lists the configuration, the attributes and the
// metrics.
package telemetry
