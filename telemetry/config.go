package telemetry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"
)

// ConfigFile is the name of the export configuration in the data
// directory. Without it, nothing is exported (metrics stay on: they are
// served locally, see Config.Metrics).
const ConfigFile = "telemetry.json"

// Protocols of Config.Protocol.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http"
)

// Defaults of Config.
const (
	DefaultServiceName   = "keel"
	DefaultQueueSize     = 4096
	DefaultFlushInterval = time.Second
	DefaultExportTimeout = 5 * time.Second
	// maxBatch bounds the spans of one export request. Each request has
	// a large fixed cost (gRPC's framing, the collector's answer, the
	// wake-ups of both sides), so a busy exporter sends few large ones:
	// a span cost ~0.5 µs less of the export goroutine's CPU in requests
	// of 2048 than of 512 (docs/PERFORMANCE.md, issue 17).
	maxBatch = 2048
	// wakeBatch is how many spans in the queue wake the export
	// goroutine before its flush interval: it takes them off the queue
	// (the queue's room is for bursts) and decodes them, and sends once
	// maxBatch wait, or at the interval.
	wakeBatch = 512
	// maxBatchBytes bounds a batch's encoded spans too: the gRPC client
	// marshals a request into a buffer from a pool whose largest tier is
	// 1 MiB; a larger request gets a new buffer every time, which the
	// kernel must fault in and the GC collect. maxBatch spans without
	// content take under 1 MiB; with content (prompts, outputs) a batch
	// reaches it sooner. The room left is for the resource and the
	// request's framing.
	maxBatchBytes = 1<<20 - 32<<10
)

// Config is the export configuration, telemetry.json. The zero value
// exports nothing and serves metrics.
type Config struct {
	// Endpoint is the OTLP collector: for gRPC "host:port" or
	// "https://host:port" ("http://" is plain text, loopback only); for
	// HTTP a URL, to which /v1/traces is added when it has no path.
	// Empty: no export.
	Endpoint string `json:"endpoint,omitempty"`
	// Protocol is "grpc" (the default) or "http" (protobuf over HTTP).
	Protocol string `json:"protocol,omitempty"`
	// Headers are sent with every export (an API key, a tenant).
	Headers map[string]string `json:"headers,omitempty"`
	// Insecure sends in plain text, without TLS: allowed only to a
	// loopback collector (127.0.0.1, ::1, localhost). Default false.
	Insecure bool `json:"insecure,omitempty"`
	// ServiceName is the service.name of the exported resource; default
	// "keel".
	ServiceName string `json:"service_name,omitempty"`
	// Content exports prompts and outputs (a run's goal and result, a
	// model call's answer, a tool call's arguments and result) on the
	// spans whose run and span hold no label. Default false: spans carry
	// names, timings, tokens, cost and outcomes, never what was said.
	Content bool `json:"content,omitempty"`
	// Metrics serves the metrics endpoint (GET /metrics behind the
	// token); nil (the default) is true: the endpoint is local and
	// nothing leaves the machine.
	Metrics *bool `json:"metrics,omitempty"`
	// QueueSize bounds the spans waiting for export; spans beyond it are
	// dropped and counted. Default DefaultQueueSize.
	QueueSize int `json:"queue_size,omitempty"`
	// FlushIntervalMS is the longest a finished span waits before its
	// batch is sent; default 1000.
	FlushIntervalMS int `json:"flush_interval_ms,omitempty"`
	// ExportTimeoutMS bounds one export to the collector; default 5000.
	// A batch that fails or times out is dropped and counted, not retried.
	ExportTimeoutMS int `json:"export_timeout_ms,omitempty"`

	file string // where it was read from, for errors and doctor
}

// Enabled reports whether spans are exported.
func (c Config) Enabled() bool { return c.Endpoint != "" }

// MetricsOn reports whether the metrics endpoint is served.
func (c Config) MetricsOn() bool { return c.Metrics == nil || *c.Metrics }

// File is the file the configuration was read from; "" for none.
func (c Config) File() string { return c.file }

func (c Config) serviceName() string {
	if c.ServiceName == "" {
		return DefaultServiceName
	}
	return c.ServiceName
}

func (c Config) queueSize() int {
	if c.QueueSize <= 0 {
		return DefaultQueueSize
	}
	return c.QueueSize
}

func (c Config) flushInterval() time.Duration {
	if c.FlushIntervalMS <= 0 {
		return DefaultFlushInterval
	}
	return time.Duration(c.FlushIntervalMS) * time.Millisecond
}

func (c Config) exportTimeout() time.Duration {
	if c.ExportTimeoutMS <= 0 {
		return DefaultExportTimeout
	}
	return time.Duration(c.ExportTimeoutMS) * time.Millisecond
}

// Errors of a configuration; a *ConfigError wraps one.
var (
	// ErrUnknownField: a field the format does not have.
	ErrUnknownField = errors.New("unknown field")
	// ErrInvalid: a value of the wrong type or out of range, or a file
	// that is not one JSON object.
	ErrInvalid = errors.New("invalid value")
)

// ConfigError is a problem in telemetry.json, with the file and field.
type ConfigError struct {
	File  string
	Field string // "" when the whole file is at fault
	Err   error  // ErrUnknownField or ErrInvalid
	Msg   string
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %v", e.File, e.Err)
	if e.Field != "" {
		fmt.Fprintf(&b, " %q", e.Field)
	}
	if e.Msg != "" {
		b.WriteString(": ")
		b.WriteString(e.Msg)
	}
	return b.String()
}

// Unwrap returns the sentinel.
func (e *ConfigError) Unwrap() error { return e.Err }

// configFields are the fields of telemetry.json.
var configFields = []string{"endpoint", "protocol", "headers", "insecure", "service_name", "content", "metrics", "queue_size", "flush_interval_ms", "export_timeout_ms"}

// LoadConfig reads the configuration at path. A missing file is the zero
// Config (no export). A file that does not parse, has a field the format
// does not have, or a value out of range is a *ConfigError naming the
// file and the field.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Config{}, nil
	}
	if err != nil {
		return Config{}, fmt.Errorf("telemetry: %w", err)
	}
	return ParseConfig(path, b)
}

// ParseConfig parses the contents b of the configuration file named
// name, as LoadConfig.
func ParseConfig(name string, b []byte) (Config, error) {
	bad := func(field string, err error, format string, args ...any) (Config, error) {
		return Config{}, &ConfigError{File: name, Field: field, Err: err, Msg: fmt.Sprintf(format, args...)}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil || fields == nil {
		return bad("", ErrInvalid, "want one JSON object: %v", err)
	}
	for k := range fields {
		if !slices.Contains(configFields, k) {
			return bad(k, ErrUnknownField, "want one of %s", strings.Join(configFields, ", "))
		}
	}
	var c Config
	for k, raw := range fields {
		dec := json.NewDecoder(bytes.NewReader(raw))
		var dst any
		switch k {
		case "endpoint":
			dst = &c.Endpoint
		case "protocol":
			dst = &c.Protocol
		case "headers":
			dst = &c.Headers
		case "insecure":
			dst = &c.Insecure
		case "service_name":
			dst = &c.ServiceName
		case "content":
			dst = &c.Content
		case "metrics":
			dst = &c.Metrics
		case "queue_size":
			dst = &c.QueueSize
		case "flush_interval_ms":
			dst = &c.FlushIntervalMS
		case "export_timeout_ms":
			dst = &c.ExportTimeoutMS
		}
		if err := dec.Decode(dst); err != nil {
			return bad(k, ErrInvalid, "%v", err)
		}
	}
	c.file = name
	switch c.Protocol {
	case "":
		c.Protocol = ProtocolGRPC
	case ProtocolGRPC, ProtocolHTTP:
	default:
		return bad("protocol", ErrInvalid, "%q: want grpc or http", c.Protocol)
	}
	for k, n := range map[string]int{"queue_size": c.QueueSize, "flush_interval_ms": c.FlushIntervalMS, "export_timeout_ms": c.ExportTimeoutMS} {
		if n < 0 {
			return bad(k, ErrInvalid, "%d: want 0 (the default) or more", n)
		}
	}
	if c.Endpoint != "" {
		if _, err := c.destination(); err != nil {
			return bad("endpoint", ErrInvalid, "%v", err)
		}
	}
	return c, nil
}

// destination is where the export goes, as the URL the policy decides
// (the telemetry action): http:// for plain text, https:// for TLS, and
// the host and port. It checks that plain text goes to loopback only.
func (c Config) destination() (*url.URL, error) {
	ep := c.Endpoint
	if !strings.Contains(ep, "://") {
		if c.Protocol == ProtocolHTTP {
			return nil, fmt.Errorf("%q: want a URL, such as http://127.0.0.1:4318", ep)
		}
		ep = "https://" + ep
		if c.Insecure {
			ep = "http://" + c.Endpoint
		}
	}
	u, err := url.Parse(ep)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.User != nil {
		return nil, fmt.Errorf("%q: want http://HOST:PORT or https://HOST:PORT", c.Endpoint)
	}
	if c.Protocol == ProtocolGRPC && u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("%q: a gRPC endpoint has no path", c.Endpoint)
	}
	if c.Insecure && u.Scheme == "https" {
		return nil, fmt.Errorf("%q: https with insecure: true; use http:// for plain text", c.Endpoint)
	}
	if u.Scheme == "http" && !loopback(u.Hostname()) {
		return nil, fmt.Errorf("%q: plain text (http or insecure) is allowed to a loopback collector only; use TLS (https) for %s", c.Endpoint, u.Hostname())
	}
	if u.Port() == "" {
		port := "4317"
		if c.Protocol == ProtocolHTTP {
			port = "4318"
		}
		u.Host = net.JoinHostPort(u.Hostname(), port)
	}
	if c.Protocol == ProtocolHTTP && (u.Path == "" || u.Path == "/") {
		u.Path = "/v1/traces"
	}
	return u, nil
}

func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
