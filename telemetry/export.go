package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/policy"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	"google.golang.org/grpc"
)

// scopeName is the instrumentation scope of what keel exports.
const scopeName = "github.com/keel-runtime/keel/telemetry"

// Runs is what the exporter reads of runs: a run, to find the top-level
// run whose trace a sub-agent's spans join, its model, labels and
// outcome; and the runs in each live state, for the metrics. store.Store
// is one.
type Runs interface {
	GetRun(ctx context.Context, id keel.RunID) (keel.Run, error)
	RunsWithStatus(ctx context.Context, states ...keel.RunStatus) ([]keel.Run, error)
}

// Journal is the engine's journal seam (engine.Journal), which
// Exporter.Journal wraps.
type Journal interface {
	CreateRun(ctx context.Context, r keel.Run) error
	CreateRunWith(ctx context.Context, r keel.Run, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error)
	GetRun(ctx context.Context, id keel.RunID) (keel.Run, error)
	AppendAll(ctx context.Context, id keel.RunID, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error)
	Events(ctx context.Context, id keel.RunID, afterSeq int64) ([]keel.Event, error)
	RunsWithStatus(ctx context.Context, states ...keel.RunStatus) ([]keel.Run, error)
	RunByIdempotencyKey(ctx context.Context, key string) (keel.Run, error)
}

// Tracer is the engine's trace seam (engine.Tracer), which Exporter.
// Tracer wraps.
type Tracer interface {
	StartSpan(ctx context.Context, sp keel.Span) error
	FinishSpan(ctx context.Context, sp keel.Span) error
	Sync(ctx context.Context) error
	Spans(ctx context.Context, id keel.RunID) ([]keel.Span, error)
	RunsWithOpenSpans(ctx context.Context) ([]keel.RunID, error)
}

// Options configure New.
type Options struct {
	// Config is telemetry.json (LoadConfig); the zero Config exports
	// nothing and serves metrics.
	Config Config
	// Runs reads runs; required.
	Runs Runs
	// Policy returns the policy that decides the export of run's spans
	// (the telemetry action, to the collector's URL). Nil, or a nil
	// policy: the export is allowed.
	Policy func(run keel.Run) *policy.Policy
	// TraceParent returns the W3C traceparent a top-level run was
	// started under, when another environment handed it (a plan's step,
	// docs/cloud.md), or "": the run's spans are exported in that trace,
	// its root span under that span. It is asked once per run, from the
	// export goroutine. Nil, or "" (or a traceparent that does not
	// parse): the run is a trace of its own.
	TraceParent func(ctx context.Context, run keel.RunID) string
	// Client replaces the OTLP client Config describes (tests use one in
	// memory); Config.Endpoint must still be set for spans to be
	// exported. New starts it and Close stops it. UploadTraces must not
	// keep the messages it is given: they are reused for the next batch.
	Client otlptrace.Client
	// Version is keel's version, on the resource; default keel.Version.
	Version string
	// Logger; default discards.
	Logger *slog.Logger
}

// Exporter exports finished spans and records metrics. Its methods are
// safe for concurrent use. Close stops its goroutine.
type Exporter struct {
	cfg    Config
	dest   string // the collector, as the policy sees it ("" when off)
	log    *slog.Logger
	runs   Runs
	policy func(keel.Run) *policy.Policy
	// traceParent is Options.TraceParent.
	traceParent func(context.Context, keel.RunID) string
	client      otlptrace.Client // nil when export is off
	res         *resource.Resource
	enc         *encoder // owned by the worker
	m           *metrics // nil when metrics are off

	q        *queue        // nil when export and metrics are off
	wake     chan struct{} // the queue holds a batch
	stop     chan struct{}
	done     chan struct{}
	flushes  chan chan struct{} // Flush's requests: closed once all before them went
	codec    *requestCodec      // the gRPC client's codec; nil over HTTP or with Options.Client
	closeCtx context.Context    // set by Close before stop closes
	once     sync.Once

	exported, dropped, failed, denied atomic.Uint64

	mu                      sync.Mutex
	lastErr                 string
	lastErrAt, lastExportAt time.Time

	// Owned by the worker: while a collector that failed is given time
	// (until retryAt, backoff doubling from minBackoff to maxBackoff),
	// batches fail without being mapped or sent.
	retryAt    time.Time
	backoff    time.Duration
	minBackoff time.Duration // minBackoff; tests set more

	// Owned by the worker goroutine.
	allowedRuns map[keel.RunID]bool // the policy's decisions in a batch
	states      map[keel.RunID]*runState
	tops        map[keel.RunID]keel.RunID
	// The run of the last span encoded, its state and decision: spans
	// come in runs' order, so they are looked up once for a run's spans
	// in a row. lastRun is "" when they are to be looked up again.
	lastRun   keel.RunID
	lastState *runState
	lastOK    bool
}

// item is one entry of the export queue: a finished span, an event
// whose content spans may carry, or a run's record as the journal
// wrote it.
type item struct {
	span keel.Span
	src  Tracer // the tracer the span was finished through, to complete it (see complete)
	ev   *keel.Event
	rec  *runRecord
}

// runRecord is what Exporter.Journal saw written of a run: the run it
// created (created), or the end of the run (its status, result and
// error in run).
type runRecord struct {
	run     keel.Run
	created bool
}

// queue is the bounded hand-over from the runs' goroutines to the export
// goroutine: a slice under a mutex, which the goroutine takes whole
// every flush interval, or when it holds a batch. Handing a span over
// never wakes the goroutine: through a channel, a wake-up per span cost
// a run's step more CPU than all the rest of the export.
type queue struct {
	mu     sync.Mutex
	items  []item
	size   int // the most items it holds
	wakeAt int // the length at which the goroutine is woken
	closed bool
	// timed is set while the goroutine's flush timer runs (or the wake
	// that arms it is on its way); the first item into a queue without
	// it wakes the goroutine, later ones do not.
	timed bool
}

// put adds it, unless the queue is full or closed; wake reports that the
// goroutine's flush timer is to be armed (it was not running) or that
// the queue now holds a batch: a few times per flush, never per item.
func (q *queue) put(it item) (ok, wake bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || len(q.items) >= q.size {
		return false, false
	}
	q.items = append(q.items, it)
	arm := !q.timed
	q.timed = true
	return true, arm || len(q.items) == q.wakeAt
}

// untime records that the flush timer stops, unless items came in since
// the last take: then it reports false and the timer must run on.
func (q *queue) untime() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) > 0 {
		return false
	}
	q.timed = false
	return true
}

// take returns what the queue holds and leaves it holding buf's storage.
func (q *queue) take(buf []item) []item {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.items
	q.items = buf[:0]
	return out
}

func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
}

// runState is what the worker knows of a run with spans in flight.
type runState struct {
	info runInfo
	// ended says the journal's record of the run's end came (see
	// Exporter.Journal): its root span needs no read of the run.
	ended    bool
	labelled bool     // data with a label entered the run: no content from here on
	labels   []string // the run's labels seen so far
	models   map[int]string
	args     map[string]string
	results  map[string]string
}

// New returns an Exporter for opts. With export on it starts the
// goroutine that sends spans; nothing is sent before the first span
// finishes, so a collector that is down does not fail New. An invalid
// Config is an error.
func New(opts Options) (*Exporter, error) {
	if opts.Runs == nil {
		return nil, errors.New("telemetry: Options.Runs is required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	version := opts.Version
	if version == "" {
		version = keel.Version
	}
	cfg := opts.Config
	x := &Exporter{cfg: cfg, log: log, runs: opts.Runs, policy: opts.Policy, traceParent: opts.TraceParent,
		res:    resource.NewSchemaless(attribute.String("service.name", cfg.serviceName()), attribute.String("service.version", version)),
		enc:    newEncoder(cfg.serviceName(), version, scopeName),
		states: map[keel.RunID]*runState{}, allowedRuns: map[keel.RunID]bool{}, tops: map[keel.RunID]keel.RunID{},
		stop: make(chan struct{}), done: make(chan struct{}), flushes: make(chan chan struct{}), minBackoff: minBackoff}
	if cfg.MetricsOn() {
		m, err := newMetrics(x)
		if err != nil {
			return nil, fmt.Errorf("telemetry: metrics: %w", err)
		}
		x.m = m
	}
	if !cfg.Enabled() {
		if x.m == nil {
			close(x.done)
			return x, nil
		}
		// Metrics alone: the goroutine records them off the runs' path.
		x.startLoop()
		return x, nil
	}
	if cfg.Protocol == "" {
		cfg.Protocol = ProtocolGRPC
		x.cfg.Protocol = ProtocolGRPC
	}
	u, err := cfg.destination()
	if err != nil {
		return nil, &ConfigError{File: cfg.file, Field: "endpoint", Err: ErrInvalid, Msg: err.Error()}
	}
	x.dest = u.String()
	x.client = opts.Client
	if x.client == nil {
		x.client, x.codec = newOTLP(cfg, u.String())
	}
	// The clients connect lazily: a collector that is down does not fail
	// Start.
	if err := x.client.Start(context.Background()); err != nil {
		return nil, fmt.Errorf("telemetry: start the OTLP client: %w", err)
	}
	x.startLoop()
	return x, nil
}

func (x *Exporter) startLoop() {
	x.q = &queue{size: x.cfg.queueSize(), wakeAt: min(wakeBatch, x.cfg.queueSize())}
	x.wake = make(chan struct{}, 1)
	go x.loop()
}

// newOTLP makes the official OTLP client for cfg, to url (see
// destination), unstarted. It does not retry: a batch that fails is
// dropped and counted, and the queue, not a retry loop, absorbs a
// collector's hiccups. Over gRPC, the client marshals its requests with
// codec (see requestCodec); over HTTP codec is nil.
func newOTLP(cfg Config, url string) (client otlptrace.Client, codec *requestCodec) {
	timeout := cfg.exportTimeout()
	if cfg.Protocol == ProtocolHTTP {
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(url), otlptracehttp.WithTimeout(timeout),
			otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false})}
		if len(cfg.Headers) > 0 {
			opts = append(opts, otlptracehttp.WithHeaders(cfg.Headers))
		}
		return otlptracehttp.NewClient(opts...), nil
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(url), otlptracegrpc.WithTimeout(timeout),
		otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false})}
	if len(cfg.Headers) > 0 {
		opts = append(opts, otlptracegrpc.WithHeaders(cfg.Headers))
	}
	codec = newRequestCodec()
	opts = append(opts, otlptracegrpc.WithDialOption(grpc.WithDefaultCallOptions(grpc.ForceCodecV2(codec))))
	return otlptracegrpc.NewClient(opts...), codec
}

// Config returns the configuration in use.
func (x *Exporter) Config() Config { return x.cfg }

// Tracer returns next with export added: every call is forwarded as is,
// and each span finished without error is recorded in the metrics and
// queued for export, without waiting (a full queue drops it and counts
// the drop). The result satisfies engine.Tracer.
func (x *Exporter) Tracer(next Tracer) Tracer { return &tracer{Tracer: next, x: x} }

type tracer struct {
	Tracer
	x *Exporter
}

// Journal returns next with the run records the export needs taken as
// they are written: a run as it is created, and its status, result and
// error as it ends. Every call is forwarded as is; a write that
// succeeded hands a copy of the record to the export goroutine's queue
// (a few per run, none per step). Without it the export goroutine reads
// each run (Options.Runs) at its first span and again at the end of its
// root span: two reads of the database a run, about as much CPU as the
// rest of a 50-step run's export. A run it saw no record of (resumed
// after a restart, or whose record the full queue turned away) is read
// as before. With export off (or metrics alone) it returns next. The
// result satisfies engine.Journal.
func (x *Exporter) Journal(next Journal) Journal {
	if x.client == nil {
		return next
	}
	return &journal{Journal: next, x: x}
}

type journal struct {
	Journal
	x *Exporter
}

func (j *journal) CreateRun(ctx context.Context, r keel.Run) error {
	if err := j.Journal.CreateRun(ctx, r); err != nil {
		return err
	}
	j.x.enqueue(item{rec: &runRecord{run: r, created: true}})
	return nil
}

func (j *journal) CreateRunWith(ctx context.Context, r keel.Run, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error) {
	out, err := j.Journal.CreateRunWith(ctx, r, evs, upd)
	if err != nil {
		return out, err
	}
	if upd != nil {
		r.Status, r.Result, r.Error = upd.Status, upd.Result, upd.Error
	}
	j.x.enqueue(item{rec: &runRecord{run: r, created: true}})
	return out, nil
}

func (j *journal) AppendAll(ctx context.Context, id keel.RunID, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error) {
	out, err := j.Journal.AppendAll(ctx, id, evs, upd)
	// Only an end matters: it is what the run's root span reports.
	if err == nil && upd != nil && (upd.Status.Terminal() || upd.Status == keel.RunInterrupted) {
		j.x.enqueue(item{rec: &runRecord{run: keel.Run{ID: id, Status: upd.Status, Result: upd.Result, Error: upd.Error}}})
	}
	return out, err
}

func (t *tracer) FinishSpan(ctx context.Context, sp keel.Span) error {
	if err := t.Tracer.FinishSpan(ctx, sp); err != nil {
		return err
	}
	t.x.finished(sp, t.Tracer)
	return nil
}

// finished records sp, finished through src, in the metrics and queues
// it for export.
// The metrics of a span are recorded by the export goroutine as it takes
// the span, so that the run pays for the hand-over alone; a span the
// full queue turns away has its metrics recorded here instead, so that
// the metrics never miss a span.
func (x *Exporter) finished(sp keel.Span, src Tracer) {
	if x.q == nil || sp.Status == keel.SpanRunning {
		return
	}
	x.enqueue(item{span: sp, src: src})
}

func (x *Exporter) enqueue(it item) {
	ok, wake := x.q.put(it)
	if !ok && it.ev == nil && it.rec == nil {
		if x.m != nil {
			x.m.span(it.span, nil)
		}
		if x.client != nil {
			x.dropped.Add(1)
		}
	}
	if wake {
		select {
		case x.wake <- struct{}{}:
		default:
		}
	}
}

// OnEvent is an engine subscriber (engine.Engine.Subscribe): it counts
// runs that end, and with content on queues the events whose content
// spans carry (a model's answer, a tool's result). It never blocks.
func (x *Exporter) OnEvent(ev keel.Event) {
	switch ev.Type {
	case keel.EventRunSucceeded, keel.EventRunFailed, keel.EventRunCancelled, keel.EventRunInterrupted:
		if x.m != nil {
			x.m.runEnded(ev.Type)
		}
	case keel.EventModelResult, keel.EventToolResult:
		if x.client != nil && x.cfg.Content {
			e := ev // a copy, so that ev does not escape for every event
			x.enqueue(item{ev: &e})
		}
	}
}

// MetricsHandler serves the metrics in the Prometheus text format; nil
// when metrics are off (Config.Metrics).
func (x *Exporter) MetricsHandler() http.Handler {
	if x.m == nil {
		return nil
	}
	return x.m.handler
}

// Stats is the export's state, for keel doctor.
type Stats struct {
	// Enabled says spans are exported, to Endpoint over Protocol.
	Enabled  bool
	Endpoint string
	Protocol string
	File     string
	Content  bool
	Metrics  bool
	// Exported counts spans the collector accepted; Dropped those the
	// full queue (or a stop) turned away; Failed those of batches the
	// collector refused or did not answer in time; Denied those the
	// policy kept from leaving.
	Exported, Dropped, Failed, Denied uint64
	// Queued is the spans waiting now, of QueueSize.
	Queued, QueueSize int
	// LastError is the last export's failure, at LastErrorAt; LastExport
	// the time of the last batch the collector accepted.
	LastError   string
	LastErrorAt time.Time
	LastExport  time.Time
}

// Stats returns the export's counters now.
func (x *Exporter) Stats() Stats {
	s := Stats{Enabled: x.cfg.Enabled(), Endpoint: x.dest, Protocol: x.cfg.Protocol, File: x.cfg.file, Content: x.cfg.Content, Metrics: x.m != nil,
		Exported: x.exported.Load(), Dropped: x.dropped.Load(), Failed: x.failed.Load(), Denied: x.denied.Load()}
	if x.q != nil {
		s.Queued, s.QueueSize = x.q.len(), x.q.size
	}
	x.mu.Lock()
	s.LastError, s.LastErrorAt, s.LastExport = x.lastErr, x.lastErrAt, x.lastExportAt
	x.mu.Unlock()
	return s
}

// Close sends what is queued, until ctx ends, and stops the goroutine
// and the exporters. Spans finished after Close are dropped (counted).
// A second Close does nothing.
func (x *Exporter) Close(ctx context.Context) error {
	var err error
	x.once.Do(func() {
		if x.q != nil {
			x.q.close()
			x.closeCtx = ctx
			close(x.stop)
			select {
			case <-x.done:
			case <-ctx.Done():
				err = fmt.Errorf("telemetry: flush: %w", context.Cause(ctx))
				// The export in flight ends with ctx; wait for the
				// goroutine, a little, in case the collector's client
				// does not let go at once.
				select {
				case <-x.done:
				case <-time.After(5 * time.Second):
				}
			}
			if x.client != nil {
				err = errors.Join(err, x.client.Stop(ctx))
			}
		}
		if x.m != nil {
			err = errors.Join(err, x.m.provider.Shutdown(ctx))
		}
	})
	return err
}

// loop is the export goroutine: it gathers finished spans and sends them
// in batches, at most every flush interval (or when a batch is full).
// With content on, a span waits one more interval, so that the events
// holding its content (journaled after the span ends) are there when
// it goes. Its flush timer runs only while something waits to be
// flushed: an idle daemon's exporter never wakes.
func (x *Exporter) loop() {
	defer close(x.done)
	tick := time.NewTimer(x.cfg.flushInterval())
	tick.Stop()
	armed := false
	arm := func() {
		if !armed {
			tick.Reset(x.cfg.flushInterval())
			armed = true
		}
	}
	defer tick.Stop()
	var buf []item
	// pending are the spans taken from the queue, ready those that
	// waited an interval for their content (with content on).
	var pending, ready []queued
	drain := func() {
		items := x.q.take(buf)
		// While a collector that failed is given time, spans fail here,
		// before any work on them (see flush).
		failing := x.client != nil && !x.cfg.Content && time.Now().Before(x.retryAt)
		for _, it := range items {
			switch {
			case it.rec != nil && it.rec.created:
				// A run comes before its spans and events: its record is
				// taken now.
				x.created(&it.rec.run)
			case it.rec != nil:
				// The end of a run is taken with the spans queued with it,
				// at the flush (see flush).
				pending = append(pending, queued{rec: it.rec})
			case it.ev != nil:
				x.content(it.ev)
			case x.client == nil:
				x.m.span(it.span, nil)
			case failing:
				if x.m != nil {
					x.m.span(it.span, nil)
				}
				x.failed.Add(1)
				if it.span.Kind == keel.SpanRun {
					delete(x.states, it.span.RunID)
				}
			case x.cfg.Content || it.span.Kind == keel.SpanRun:
				// With content, a span waits for the events that hold it;
				// a run's root span waits for the record of the run's end,
				// which the journal writes just after it (see flush).
				pending = append(pending, queued{span: x.complete(it)})
				q := &pending[len(pending)-1]
				q.attrs = decodeAttrs(&q.span)
				if x.m != nil {
					x.m.span(q.span, &q.attrs)
				}
			default:
				// Encoded as it is taken: the batch holds its bytes, not
				// the span (536 bytes of pointers the GC would scan at
				// every cycle until the batch went, ~1 MB for a batch).
				q := queued{span: x.complete(it)}
				q.attrs = decodeAttrs(&q.span)
				if x.m != nil {
					x.m.span(q.span, &q.attrs)
				}
				x.encode(context.Background(), &q)
				if !x.retryAt.IsZero() {
					// A batch the encoder sent failed: the rest fail
					// without work while the collector is given time.
					failing = time.Now().Before(x.retryAt)
				}
			}
		}
		clear(items)
		buf = items
	}
	// sendAll sends ready and pending, and empties them.
	sendAll := func(ctx context.Context, final bool) {
		if len(ready) == 0 {
			// Without content, always: pending alone, not a copy of it.
			if len(pending) > 0 || x.enc.len() > 0 {
				x.flush(ctx, pending, final)
			}
			clear(pending)
			pending = pending[:0]
			return
		}
		all := append(ready, pending...)
		if len(all) > 0 {
			x.flush(ctx, all, final)
		}
		clear(all)
		clear(pending)
		ready, pending = all[:0], pending[:0]
	}
	for {
		select {
		case <-x.wake:
			drain()
			if len(pending)+len(ready) >= maxBatch {
				sendAll(context.Background(), false)
			}
			arm()
		case <-tick.C:
			armed = false
			drain()
			if x.cfg.Content {
				if len(ready) > 0 {
					x.flush(context.Background(), ready, false)
				}
				clear(ready)
				ready, pending = pending, ready[:0]
			} else {
				if len(pending) > 0 || x.enc.len() > 0 {
					x.flush(context.Background(), pending, false)
				}
				clear(pending)
				pending = pending[:0]
			}
			if len(pending)+len(ready) > 0 || !x.q.untime() {
				arm()
			}
		case sent := <-x.flushes:
			drain()
			sendAll(context.Background(), false)
			close(sent)
		case <-x.stop:
			drain()
			sendAll(x.closeCtx, true)
			return
		}
	}
}

// Flush sends every span finished before it was called now, without
// waiting for the flush interval (with content on, without waiting for
// content still to come), and returns once they went (or failed, or
// were counted failed while a collector that failed is given time). It
// returns ctx's error if ctx ends first, and nil at once for an
// exporter without export or closed.
func (x *Exporter) Flush(ctx context.Context) error {
	if x.q == nil {
		return nil
	}
	sent := make(chan struct{})
	select {
	case x.flushes <- sent:
	case <-x.done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	select {
	case <-sent:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// queued is a span the worker took from the queue, with its attributes
// decoded (once, for the metrics and the export); or the record of a
// run's end (rec), taken with the spans of its batch (see flush).
type queued struct {
	span  keel.Span
	attrs spanAttrs
	rec   *runRecord
}

// complete returns the span of it whole. FinishSpan records a span's
// outcome: a caller may pass only that (the end of a wait for approval
// does, which may come in a later daemon than its start), and the
// span's start, name and parent are then read from the tracer it was
// finished through.
func (x *Exporter) complete(it item) keel.Span {
	sp := it.span
	if !sp.Start.IsZero() || it.src == nil {
		return sp
	}
	ctx, cancel := context.WithTimeout(context.Background(), x.cfg.exportTimeout())
	defer cancel()
	spans, err := it.src.Spans(ctx, sp.RunID)
	if err != nil {
		return sp
	}
	for _, st := range spans {
		if st.ID != sp.ID {
			continue
		}
		st.Duration, st.Status, st.Error, st.PromptTokens, st.CompletionTokens = sp.Duration, sp.Status, sp.Error, sp.PromptTokens, sp.CompletionTokens
		st.Provider, st.CostUSD, st.TTFT, st.Retries, st.FinishReason = sp.Provider, sp.CostUSD, sp.TTFT, sp.Retries, sp.FinishReason
		st.ModelDigest, st.TemplateHash, st.PromptHash = sp.ModelDigest, sp.TemplateHash, sp.PromptHash
		if len(sp.Attrs) > 0 {
			st.Attrs = sp.Attrs
		}
		return st
	}
	return sp
}

// flush encodes spans and sends them with the spans the encoder holds
// already (encoded as they were taken, see loop), in batches of at most
// maxBatch. ctx bounds the whole flush (on Close); each export is
// bounded by the export timeout too. Until a collector that failed is
// due to be tried again, spans fail at once, unless the flush is the
// final one (Close).
func (x *Exporter) flush(ctx context.Context, spans []queued, final bool) {
	if !final && time.Now().Before(x.retryAt) {
		// The collector failed a moment ago: these spans would fail too,
		// after the work of encoding them.
		x.failed.Add(uint64(x.enc.len()))
		x.enc.reset()
		x.batchSent()
		for i := range spans {
			if spans[i].rec != nil {
				continue
			}
			x.failed.Add(1)
			if sp := &spans[i].span; sp.Kind == keel.SpanRun {
				delete(x.states, sp.RunID)
			}
		}
		return
	}
	// The engine ends a run's root span just before it journals the
	// run's end: the batch's records of ends are taken before its spans,
	// so that a root span finds its run's end recorded (as a read of the
	// run at this point would find it).
	for i := range spans {
		if r := spans[i].rec; r != nil {
			x.ended(&r.run)
		}
	}
	for i := range spans {
		if spans[i].rec == nil {
			x.encode(ctx, &spans[i])
		}
	}
	if x.enc.len() > 0 {
		x.send(ctx, x.enc)
	}
}

// encode adds q's span to the encoder's batch, unless the run's policy
// denies its export, and sends the batch once it is full.
func (x *Exporter) encode(ctx context.Context, q *queued) {
	sp, a := &q.span, &q.attrs
	if sp.RunID != x.lastRun || sp.Kind == keel.SpanRun || x.lastState == nil {
		rs := x.state(ctx, sp.RunID, sp.Kind == keel.SpanRun)
		ok, seen := x.allowedRuns[sp.RunID]
		if !seen {
			ok = x.allowed(rs.info.run)
			x.allowedRuns[sp.RunID] = ok
		}
		x.lastRun, x.lastState, x.lastOK = sp.RunID, rs, ok
	}
	rs, ok := x.lastState, x.lastOK
	if len(a.Labels) > 0 {
		rs.labelled = true
		rs.labels = keel.UnionLabels(rs.labels, a.Labels)
	}
	if sp.Kind == keel.SpanRun {
		delete(x.states, sp.RunID) // the run's loop ended (or stopped): start afresh if it resumes
		x.lastRun, x.lastState = "", nil
	}
	if !ok {
		x.denied.Add(1)
		return
	}
	labels := rs.labels
	if len(a.Labels) > 0 {
		labels = keel.UnionLabels(rs.labels, a.Labels)
	}
	var c *spanContent
	withheld := false
	if x.cfg.Content {
		if rs.labelled {
			withheld = true
		} else {
			c = rs.contentOf(sp, a)
		}
	}
	x.enc.add(sp, a, &rs.info, labels, c, withheld)
	if x.enc.full() {
		x.send(ctx, x.enc)
	}
}

// batchSent forgets what was decided for the batch sent: the policy's
// decisions are made again for the next.
func (x *Exporter) batchSent() {
	clear(x.allowedRuns)
	x.lastRun, x.lastState = "", nil
}

// send exports the batch e holds, counts the outcome, and empties e for
// the next batch.
func (x *Exporter) send(ctx context.Context, e *encoder) {
	n := e.len()
	ctx, cancel := context.WithTimeout(ctx, x.cfg.exportTimeout())
	defer cancel()
	err := x.client.UploadTraces(ctx, e.request())
	defer x.batchSent()
	defer e.reset()
	now := time.Now()
	x.mu.Lock()
	defer x.mu.Unlock()
	if err != nil {
		if x.codec != nil {
			x.codec.lost()
			e.lost()
		}
		x.backoff = min(max(2*x.backoff, x.minBackoff), maxBackoff)
		x.retryAt = now.Add(x.backoff)
		x.failed.Add(uint64(n))
		if x.lastErr == "" || now.Sub(x.lastErrAt) > time.Minute {
			x.log.Warn("telemetry export failed; the spans are dropped", logkey.Endpoint, x.dest, logkey.Spans, n, logkey.Err, err)
		}
		x.lastErr, x.lastErrAt = err.Error(), now
		return
	}
	x.backoff, x.retryAt = 0, time.Time{}
	x.exported.Add(uint64(n))
	x.lastExportAt = now
}

// The wait after a failed export before the next is tried: from
// minBackoff, doubling, up to maxBackoff. Spans finished meanwhile are
// counted as failed without being sent.
const (
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
)

// allowed decides the export of run's spans: the telemetry action to the
// collector, by the policy of the run. Only allow lets them go: there is
// no person to ask about an export, so ask keeps them too.
func (x *Exporter) allowed(run keel.Run) bool {
	if x.policy == nil {
		return true
	}
	p := x.policy(run)
	if p == nil {
		return true
	}
	return p.Decide(&policy.Action{Kind: policy.KindTelemetry, Destination: x.dest}).Outcome == policy.Allow
}

// state returns what the worker knows of run id, reading the run when it
// is new or fresh says its state matters now (its root span ends),
// unless the journal's record of its end came (ended).
func (x *Exporter) state(ctx context.Context, id keel.RunID, fresh bool) *runState {
	rs := x.states[id]
	if rs != nil && (!fresh || rs.ended) {
		return rs
	}
	run, err := x.runs.GetRun(ctx, id)
	if err != nil {
		run = keel.Run{ID: id}
	}
	return x.learn(ctx, rs, run)
}

// created takes the record of a run the journal created: its state
// without a read.
func (x *Exporter) created(run *keel.Run) {
	x.learn(context.Background(), x.states[run.ID], *run)
}

// ended takes the journal's record of the end of a run (run holds its
// ID, status, result and error), for its root span; a run the worker
// holds no state for is read when its root span comes, as before.
func (x *Exporter) ended(run *keel.Run) {
	rs := x.states[run.ID]
	if rs == nil {
		return
	}
	r := &rs.info.run
	r.Status, r.Result, r.Error = run.Status, run.Result, run.Error
	rs.ended = true
}

// learn makes run what the worker knows of it: into rs, or into a new
// state when rs is nil.
func (x *Exporter) learn(ctx context.Context, rs *runState, run keel.Run) *runState {
	id := run.ID
	if rs == nil {
		if len(x.states) >= maxStates {
			// Runs whose root span never came (dropped, or the daemon
			// stopped first): start afresh rather than grow.
			clear(x.states)
		}
		top := x.top(ctx, run)
		rs = &runState{info: runInfo{trace: traceIDOf(top)}}
		if x.traceParent != nil {
			// A run handed from another environment: its trace is the
			// origin's, its root under the hand-off span there.
			if tid, sid, ok := parseTraceParent(x.traceParent(ctx, top)); ok {
				rs.info.trace = tid
				if top == id {
					rs.info.parent = sid
				}
			}
		}
		x.states[id] = rs
	}
	rs.info.run = run
	if run.Policy.Private || len(run.Policy.Labels) > 0 {
		rs.labelled = true
		rs.labels = keel.UnionLabels(rs.labels, run.Policy.Labels)
		if run.Policy.Private {
			rs.labels = keel.UnionLabels(rs.labels, []string{keel.LabelPrivate})
		}
	}
	return rs
}

// maxStates bounds the runs the worker keeps state for at once.
const maxStates = 10_000

// maxDepth bounds the sub-agent chain top follows.
const maxDepth = 32

// top returns the top-level run of run: itself, or the first ancestor
// with no parent.
func (x *Exporter) top(ctx context.Context, run keel.Run) keel.RunID {
	if t, ok := x.tops[run.ID]; ok {
		return t
	}
	if len(x.tops) > 100_000 {
		clear(x.tops)
	}
	id, cur := run.ID, run
	for i := 0; cur.ParentID != "" && i < maxDepth; i++ {
		if t, ok := x.tops[cur.ParentID]; ok {
			id = t
			break
		}
		id = cur.ParentID
		next, err := x.runs.GetRun(ctx, cur.ParentID)
		if err != nil {
			break
		}
		cur = next
	}
	x.tops[run.ID] = id
	return id
}

// content keeps what ev says, for the spans it belongs to.
func (x *Exporter) content(ev *keel.Event) {
	rs := x.state(context.Background(), ev.RunID, false)
	switch ev.Type {
	case keel.EventModelResult:
		var d keel.ModelResultData
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		parts := []part{}
		if d.Content != "" {
			parts = append(parts, part{Type: "text", Content: d.Content})
		}
		for _, c := range d.ToolCalls {
			parts = append(parts, part{Type: "tool_call", ID: c.ID, Name: c.Name, Arguments: c.Arguments})
			if rs.args == nil {
				rs.args = map[string]string{}
			}
			rs.args[c.ID] = string(c.Arguments)
		}
		if rs.models == nil {
			rs.models = map[int]string{}
		}
		rs.models[d.Step] = messagesJSON(message{Role: "assistant", Parts: parts})
	case keel.EventToolResult:
		var d keel.ToolResultData
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		if rs.results == nil {
			rs.results = map[string]string{}
		}
		if d.Error != nil {
			rs.results[d.CallID] = d.Error.Error()
		} else {
			rs.results[d.CallID] = string(d.Output)
		}
	}
}

// contentOf returns what was said in sp, from the run and the events
// seen; nil when nothing is known.
func (rs *runState) contentOf(sp *keel.Span, a *spanAttrs) *spanContent {
	var c spanContent
	switch sp.Kind {
	case keel.SpanRun:
		run := rs.info.run
		if run.Goal != "" {
			c.input = messagesJSON(message{Role: "user", Parts: []part{{Type: "text", Content: run.Goal}}})
		}
		if run.Result != "" {
			c.output = messagesJSON(message{Role: "assistant", Parts: []part{{Type: "text", Content: run.Result}}})
		}
	case keel.SpanModelCall:
		if sp.Status == keel.SpanOK {
			c.output = rs.models[sp.Step]
		}
	case keel.SpanToolCall, keel.SpanHuman:
		c.args = rs.args[a.CallID]
		if sp.Kind == keel.SpanToolCall {
			c.result = rs.results[a.CallID]
		}
	case keel.SpanRetrieval:
		c.query = a.Query
		if len(a.Hits) > 0 {
			c.docs = documentsJSON(a.Hits)
		}
	}
	if c == (spanContent{}) {
		return nil
	}
	return &c
}
