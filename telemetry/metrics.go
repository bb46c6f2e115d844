package telemetry

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// The metrics, as OTel names them; the Prometheus names are in
// docs/observability.md (keel_tokens_total, ...).
const (
	metricTokens     = "keel.tokens"
	metricCost       = "keel.cost_usd"
	metricModelTime  = "keel.model.duration"
	metricToolTime   = "keel.tool.duration"
	metricFailures   = "keel.failures"
	metricRunsEnded  = "keel.runs.ended"
	metricRunsActive = "keel.runs.active"
	metricSpans      = "keel.telemetry.spans"

	keyTokenType = "gen_ai.token.type"
	keyOutcome   = "outcome"
)

// durationBuckets are the histogram bounds of model and tool latency, in
// seconds: from a millisecond (a wasm tool's call) to ten minutes.
var durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// liveStates are the run states keel.runs.active counts.
var liveStates = []keel.RunStatus{keel.RunQueued, keel.RunRunning, keel.RunWaiting, keel.RunPaused, keel.RunInterrupted}

// metrics are the OTel instruments, read by the Prometheus exporter.
type metrics struct {
	provider  *sdkmetric.MeterProvider
	handler   http.Handler
	tokens    metric.Int64Counter
	cost      metric.Float64Counter
	modelTime metric.Float64Histogram
	toolTime  metric.Float64Histogram
	failures  metric.Int64Counter
	runsEnded metric.Int64Counter

	models sync.Map // the measurements' options by model and provider (modelOpts)
	sets   sync.Map // by optKey (opts)
	cached atomic.Int64
}

func newMetrics(x *Exporter) (*metrics, error) {
	reg := prometheus.NewRegistry()
	pe, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
		otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, err
	}
	m := &metrics{
		provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(pe), sdkmetric.WithResource(x.res)),
		handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}
	meter := m.provider.Meter(scopeName)
	var errs [8]error
	m.tokens, errs[0] = meter.Int64Counter(metricTokens, metric.WithUnit("{token}"), metric.WithDescription("Tokens of model calls, by type (input, output), model and provider."))
	m.cost, errs[1] = meter.Float64Counter(metricCost, metric.WithUnit("{USD}"), metric.WithDescription("What model calls cost, in US dollars, by model and provider."))
	m.modelTime, errs[2] = meter.Float64Histogram(metricModelTime, metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(durationBuckets...),
		metric.WithDescription("Model call latency, by model and provider."))
	m.toolTime, errs[3] = meter.Float64Histogram(metricToolTime, metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(durationBuckets...),
		metric.WithDescription("Tool call latency, by tool and error.type."))
	m.failures, errs[4] = meter.Int64Counter(metricFailures, metric.WithUnit("{failure}"), metric.WithDescription("Failed spans by kind (model.call, tool.call, run, ...) and error.type."))
	m.runsEnded, errs[5] = meter.Int64Counter(metricRunsEnded, metric.WithUnit("{run}"), metric.WithDescription("Runs that ended since the daemon started, by state."))
	_, errs[6] = meter.Int64ObservableGauge(metricRunsActive, metric.WithUnit("{run}"), metric.WithDescription("Runs in each live state (queued, running, waiting, paused, interrupted)."),
		metric.WithInt64Callback(func(ctx context.Context, o metric.Int64Observer) error {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			runs, err := x.runs.RunsWithStatus(ctx, liveStates...)
			if err != nil {
				return err
			}
			n := map[keel.RunStatus]int64{}
			for _, r := range runs {
				n[r.Status]++
			}
			for _, s := range liveStates {
				o.Observe(n[s], metric.WithAttributes(attribute.String(keyRunStatus, string(s))))
			}
			return nil
		}))
	_, errs[7] = meter.Int64ObservableCounter(metricSpans, metric.WithUnit("{span}"), metric.WithDescription("Spans by export outcome: exported, dropped, failed, denied."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			s := x.Stats()
			for k, v := range map[string]uint64{"exported": s.Exported, "dropped": s.Dropped, "failed": s.Failed, "denied": s.Denied} {
				o.Observe(int64(v), metric.WithAttributes(attribute.String(keyOutcome, k)))
			}
			return nil
		}))
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}

// span records a finished span: a model call's tokens, cost and latency,
// a tool call's latency, a failure's class. a is its attributes decoded,
// or nil: they are decoded here if needed (a failed tool call's class).
// It runs on the export goroutine (or, for a span the full queue turned
// away, on the run's): counters and histograms only, no I/O; the
// attribute sets are made once per model, tool and class.
func (m *metrics) span(sp keel.Span, a *spanAttrs) {
	ctx := context.Background()
	var errType string
	// A failed run counts when it ends (runEnded); a step fails with it.
	if sp.Status == keel.SpanError && (sp.Kind == keel.SpanModelCall || sp.Kind == keel.SpanToolCall) {
		errType = errOther
		if sp.Kind == keel.SpanToolCall {
			if a == nil {
				d := decodeAttrs(&sp)
				a = &d
			}
			errType = cmpOr(a.ErrorType, errOther)
		}
		m.failures.Add(ctx, 1, m.opts(optKey{optFailure, string(sp.Kind), errType}).add...)
	}
	switch sp.Kind {
	case keel.SpanModelCall:
		o := m.modelOpts(sp.Name, sp.Provider)
		if sp.PromptTokens > 0 {
			m.tokens.Add(ctx, int64(sp.PromptTokens), o.input...)
		}
		if sp.CompletionTokens > 0 {
			m.tokens.Add(ctx, int64(sp.CompletionTokens), o.output...)
		}
		if sp.CostUSD > 0 {
			m.cost.Add(ctx, sp.CostUSD, o.plain.add...)
		}
		m.modelTime.Record(ctx, sp.Duration.Seconds(), o.plain.rec...)
	case keel.SpanToolCall:
		m.toolTime.Record(ctx, sp.Duration.Seconds(), m.opts(optKey{optTool, sp.Name, errType}).rec...)
	}
}

// measureOpts are the options of measurements with one attribute set,
// made once: building a set sorts and hashes it, and a variadic option
// made per call is an allocation; together they were most of the cost
// of recording a span.
type measureOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newMeasureOpts(kvs ...attribute.KeyValue) measureOpts {
	o := metric.WithAttributeSet(attribute.NewSet(kvs...))
	return measureOpts{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}}
}

// modelOptions are the measurements' options of one model and provider.
type modelOptions struct {
	input, output []metric.AddOption
	plain         measureOpts
}

type modelKey struct{ model, provider string }

// optKey names an attribute set of the metrics: what it is for, and its
// values.
type optKey struct {
	what optKind
	a, b string
}

type optKind uint8

const (
	optTool     optKind = iota // a tool call's latency: tool, error.type ("" when it did not fail)
	optFailure                 // a failure: span kind, error.type
	optRunEnded                // a run that ended: its state
)

// maxCached bounds the attribute sets kept (distinct models, tools).
const maxCached = 1024

func (m *metrics) modelOpts(model, provider string) *modelOptions {
	key := modelKey{model, provider}
	if o, ok := m.models.Load(key); ok {
		return o.(*modelOptions)
	}
	ma, pa := attribute.String(keyResponseModel, model), attribute.String(keyProvider, provider)
	o := &modelOptions{
		input:  newMeasureOpts(attribute.String(keyTokenType, "input"), ma, pa).add,
		output: newMeasureOpts(attribute.String(keyTokenType, "output"), ma, pa).add,
		plain:  newMeasureOpts(ma, pa),
	}
	if m.cached.Add(1) <= maxCached {
		m.models.Store(key, o)
	}
	return o
}

func (m *metrics) opts(k optKey) *measureOpts {
	if o, ok := m.sets.Load(k); ok {
		return o.(*measureOpts)
	}
	var o measureOpts
	switch k.what {
	case optTool:
		if k.b == "" {
			o = newMeasureOpts(attribute.String(keyToolName, k.a))
		} else {
			o = newMeasureOpts(attribute.String(keyToolName, k.a), attribute.String(keyErrorType, k.b))
		}
	case optFailure:
		o = newMeasureOpts(attribute.String(keySpanKind, k.a), attribute.String(keyErrorType, k.b))
	case optRunEnded:
		o = newMeasureOpts(attribute.String(keyRunStatus, k.a))
	}
	if m.cached.Add(1) <= maxCached {
		m.sets.Store(k, &o)
	}
	return &o
}

// runEnded counts a run that ended, by the state its event says.
func (m *metrics) runEnded(t keel.EventType) {
	var s keel.RunStatus
	switch t {
	case keel.EventRunSucceeded:
		s = keel.RunSucceeded
	case keel.EventRunFailed:
		s = keel.RunFailed
	case keel.EventRunCancelled:
		s = keel.RunCancelled
	case keel.EventRunInterrupted:
		s = keel.RunInterrupted
	default:
		return
	}
	ctx := context.Background()
	m.runsEnded.Add(ctx, 1, m.opts(optKey{what: optRunEnded, a: string(s)}).add...)
	if s != keel.RunSucceeded {
		m.failures.Add(ctx, 1, m.opts(optKey{optFailure, string(keel.SpanRun), string(s)}).add...)
	}
}
