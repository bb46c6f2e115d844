package telemetry

import (
	"strconv"

	"github.com/keel-runtime/keel"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// encoder builds the OTLP request of a batch of keel spans: the messages
// of go.opentelemetry.io/proto/otlp, which the official OTLP clients
// (otlptrace.Client) send. It makes them directly from keel's spans and
// reuses them from batch to batch: mapping each span to an SDK span
// (tracetest.SpanStub) for the SDK's own transform to copy again into
// the same messages cost a span most of its export CPU, in allocations.
//
// The messages a batch was encoded into are read by the client during
// UploadTraces only; reset makes them ready for the next batch. An
// encoder is owned by the export goroutine.
type encoder struct {
	req   []*tracepb.ResourceSpans // the request: one resource, one scope
	scope *tracepb.ScopeSpans

	spans []*spanBox  // every span message made so far; the first n are in use
	vals  []*valueBox // every value; the first nVals are in use
	n     int
	nVals int

	names map[nameKey]string // span names, made once
}

// spanBox is a span message with what it points to.
type spanBox struct {
	span   tracepb.Span
	status tracepb.Status
	tid    [16]byte
	sid    [8]byte
	pid    [8]byte
	attrs  []*commonpb.KeyValue
}

// valueBox is an attribute (or an element of an array attribute) with
// every form of value it may take.
type valueBox struct {
	kv  commonpb.KeyValue
	av  commonpb.AnyValue
	s   commonpb.AnyValue_StringValue
	i   commonpb.AnyValue_IntValue
	d   commonpb.AnyValue_DoubleValue
	b   commonpb.AnyValue_BoolValue
	a   commonpb.AnyValue_ArrayValue
	arr commonpb.ArrayValue
}

type nameKey struct {
	kind keel.SpanKind
	name string
	step int
}

// maxNames bounds the span names kept.
const maxNames = 4096

func newEncoder(service, version, scope string) *encoder {
	e := &encoder{names: map[nameKey]string{}}
	e.scope = &tracepb.ScopeSpans{Scope: &commonpb.InstrumentationScope{Name: scope, Version: version}}
	// The attributes in the order the SDK's resource keeps them: by key.
	res := &resourcepb.Resource{Attributes: []*commonpb.KeyValue{
		{Key: "service.name", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: service}}},
		{Key: "service.version", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: version}}},
	}}
	e.req = []*tracepb.ResourceSpans{{Resource: res, ScopeSpans: []*tracepb.ScopeSpans{e.scope}}}
	return e
}

// len is the number of spans encoded since the last reset.
func (e *encoder) len() int { return e.n }

// request returns the spans encoded since the last reset, as a request's
// resource spans; valid until the next reset.
func (e *encoder) request() []*tracepb.ResourceSpans {
	e.scope.Spans = e.scope.Spans[:0]
	for _, b := range e.spans[:e.n] {
		e.scope.Spans = append(e.scope.Spans, &b.span)
	}
	return e.req
}

// reset empties the encoder for the next batch. The strings of the last
// one are let go (content may be large).
func (e *encoder) reset() {
	for _, v := range e.vals[:e.nVals] {
		v.s.StringValue, v.kv.Key = "", ""
		clear(v.arr.Values)
		v.arr.Values = v.arr.Values[:0]
	}
	for _, b := range e.spans[:e.n] {
		b.span.Name, b.status.Message = "", ""
		clear(b.attrs)
		b.attrs = b.attrs[:0]
	}
	clear(e.scope.Spans)
	e.scope.Spans = e.scope.Spans[:0]
	e.n, e.nVals = 0, 0
}

// value returns the next value box, made on first use.
func (e *encoder) value() *valueBox {
	if e.nVals == len(e.vals) {
		v := &valueBox{}
		v.kv.Value = &v.av
		v.a.ArrayValue = &v.arr
		e.vals = append(e.vals, v)
	}
	v := e.vals[e.nVals]
	e.nVals++
	return v
}

func (e *encoder) str(key, val string) *commonpb.KeyValue {
	v := e.value()
	v.kv.Key, v.s.StringValue, v.av.Value = key, val, &v.s
	return &v.kv
}

func (e *encoder) int(key string, val int) *commonpb.KeyValue {
	v := e.value()
	v.kv.Key, v.i.IntValue, v.av.Value = key, int64(val), &v.i
	return &v.kv
}

func (e *encoder) float(key string, val float64) *commonpb.KeyValue {
	v := e.value()
	v.kv.Key, v.d.DoubleValue, v.av.Value = key, val, &v.d
	return &v.kv
}

func (e *encoder) bool(key string, val bool) *commonpb.KeyValue {
	v := e.value()
	v.kv.Key, v.b.BoolValue, v.av.Value = key, val, &v.b
	return &v.kv
}

func (e *encoder) strs(key string, vals ...string) *commonpb.KeyValue {
	v := e.value()
	v.kv.Key, v.av.Value = key, &v.a
	for _, s := range vals {
		el := e.value()
		el.s.StringValue, el.av.Value = s, &el.s
		v.arr.Values = append(v.arr.Values, &el.av)
	}
	return &v.kv
}

// name returns the span's name: the operation, then what it is about.
func (e *encoder) name(sp *keel.Span) string {
	k := nameKey{kind: sp.Kind, name: sp.Name}
	if sp.Kind == keel.SpanStep && sp.Name == "step" {
		k.step = sp.Step
	}
	if n, ok := e.names[k]; ok {
		return n
	}
	var n string
	switch sp.Kind {
	case keel.SpanRun:
		n = opInvokeAgent + " " + sp.Name
	case keel.SpanStep:
		n = "step " + sp.Name
		if sp.Name == "step" {
			n = "step " + strconv.Itoa(sp.Step)
		}
	case keel.SpanModelCall:
		n = opChat + " " + sp.Name
	case keel.SpanToolCall:
		n = opExecuteTool + " " + sp.Name
	case keel.SpanHuman:
		n = string(keel.SpanHuman) + " " + sp.Name
	default:
		n = string(sp.Kind)
	}
	if len(e.names) >= maxNames {
		clear(e.names)
	}
	e.names[k] = n
	return n
}

// Span flags: the W3C trace flags (sampled), and that whether the parent
// is remote is known (and whether it is), as the SDK sets them.
const (
	flagsLocal  = 1 | uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK)
	flagsRemote = flagsLocal | uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)
)

// add encodes keel span sp of run ri, with attributes a (decodeAttrs of
// sp.Attrs). labels are the labels of the span and its run; c, when not
// nil, is its content, which may be exported; withheld says content was
// opted in but is left out (labelled data), which the span then says
// (keel.content.omitted).
//
// A top-level run is one trace; a sub-agent's root span is the child of
// the step of its parent run that it carries out (its parent is remote:
// another run's).
func (e *encoder) add(sp *keel.Span, a *spanAttrs, ri *runInfo, labels []string, c *spanContent, withheld bool) {
	if e.n == len(e.spans) {
		e.spans = append(e.spans, &spanBox{})
	}
	b := e.spans[e.n]
	e.n++
	s := &b.span
	b.tid = ri.trace
	b.sid = spanIDOf(sp.ID)
	s.TraceId, s.SpanId, s.ParentSpanId = b.tid[:], b.sid[:], nil
	s.Flags = flagsLocal
	if sp.ParentID != "" {
		b.pid = spanIDOf(sp.ParentID)
		s.ParentSpanId = b.pid[:]
		if sp.Kind == keel.SpanRun {
			s.Flags = flagsRemote
		}
	}
	s.Name = e.name(sp)
	s.Kind = tracepb.Span_SPAN_KIND_INTERNAL
	s.StartTimeUnixNano = uint64(max(0, sp.Start.UnixNano()))
	s.EndTimeUnixNano = uint64(max(0, sp.Start.Add(sp.Duration).UnixNano()))
	s.Status = &b.status

	attrs := append(b.attrs[:0],
		e.str(keyRunID, string(sp.RunID)),
		e.str(keySpanID, sp.ID),
		e.str(keySpanKind, string(sp.Kind)),
	)
	if sp.Step > 0 {
		attrs = append(attrs, e.int(keyStep, sp.Step))
	}
	if len(labels) > 0 {
		attrs = append(attrs, e.strs(keyLabels, labels...))
	}
	if sp.Retries > 0 {
		attrs = append(attrs, e.int(keyRetries, sp.Retries))
	}
	errType := ""
	run := &ri.run
	switch sp.Kind {
	case keel.SpanRun:
		attrs = append(attrs, e.str(keyOperation, opInvokeAgent), e.str(keyAgentName, sp.Name),
			e.str(keyAgentID, string(sp.RunID)), e.str(keyRunKind, string(run.KindOrAgent())))
		if run.Model != "" {
			attrs = append(attrs, e.str(keyRequestModel, run.Model))
		}
		if run.Status != "" {
			attrs = append(attrs, e.str(keyRunStatus, string(run.Status)))
		}
		if run.ParentID != "" {
			attrs = append(attrs, e.str(keyParentRun, string(run.ParentID)))
		}
		if run.Status.Terminal() && run.Status != keel.RunSucceeded || run.Status == keel.RunInterrupted {
			errType = string(run.Status)
		}
	case keel.SpanStep:
		if sp.Name != "step" {
			attrs = append(attrs, e.str(keyPlanStep, sp.Name))
		}
		if a.Run != "" {
			attrs = append(attrs, e.str(keySubagent, string(a.Run)), e.int(keyAttempt, a.Attempt))
		}
	case keel.SpanModelCall:
		s.Kind = tracepb.Span_SPAN_KIND_CLIENT
		req := run.Model
		if req == "" {
			req = sp.Name
		}
		attrs = append(attrs, e.str(keyOperation, opChat), e.str(keyRequestModel, req), e.str(keyResponseModel, sp.Name),
			e.int(keyInputTokens, sp.PromptTokens), e.int(keyOutputTokens, sp.CompletionTokens))
		if sp.Provider != "" {
			attrs = append(attrs, e.str(keyProvider, sp.Provider))
		}
		if sp.CostUSD != 0 {
			attrs = append(attrs, e.float(keyCost, sp.CostUSD))
		}
		if sp.FinishReason != "" {
			attrs = append(attrs, e.strs(keyFinishReasons, sp.FinishReason))
		}
		if sp.TTFT > 0 {
			attrs = append(attrs, e.float(keyTTFT, float64(sp.TTFT)/1e6))
		}
		attrs = e.nonEmpty(attrs, keyRoute, a.Route, keyVariant, a.Variant, keyModelDigest, sp.ModelDigest, keyPromptHash, sp.PromptHash, keyTemplateHash, sp.TemplateHash)
		if len(a.Policy.Decisions) > 0 {
			v := e.value()
			v.kv.Key, v.av.Value = keyPolicyList, &v.a
			for _, d := range a.Policy.Decisions {
				el := e.value()
				el.s.StringValue, el.av.Value = d.Provider+"/"+d.Model+": "+d.Explanation, &el.s
				v.arr.Values = append(v.arr.Values, &el.av)
			}
			attrs = append(attrs, &v.kv)
		}
		if sp.Status == keel.SpanError {
			errType = errOther
		}
	case keel.SpanToolCall:
		attrs = append(attrs, e.str(keyOperation, opExecuteTool), e.str(keyToolName, sp.Name))
		if a.CallID != "" {
			attrs = append(attrs, e.str(keyToolCallID, a.CallID))
		}
		if sp.Status == keel.SpanError {
			errType = cmpOr(a.ErrorType, errOther)
		}
	case keel.SpanHuman:
		attrs = append(attrs, e.bool(keyHumanWait, true))
		if a.CallID != "" {
			attrs = append(attrs, e.str(keyToolCallID, a.CallID))
		}
	}
	if sp.Kind == keel.SpanToolCall || sp.Kind == keel.SpanHuman {
		if pd := a.Policy.Decision; pd != nil && pd.Outcome != "" {
			attrs = append(attrs, e.str(keyPolicyOutcome, pd.Outcome), e.str(keyPolicyExplain, pd.Explanation))
		}
		if len(a.Egress) > 0 {
			refused := 0
			for _, eg := range a.Egress {
				if eg.Policy != nil && eg.Policy.Outcome != "allow" {
					refused++
				}
			}
			attrs = append(attrs, e.int(keyEgressCount, len(a.Egress)), e.int(keyEgressRefused, refused))
		}
	}
	b.status.Code, b.status.Message = tracepb.Status_STATUS_CODE_UNSET, ""
	switch sp.Status {
	case keel.SpanOK:
		b.status.Code = tracepb.Status_STATUS_CODE_OK
	case keel.SpanError:
		if errType == "" {
			errType = errOther
		}
		attrs = append(attrs, e.str(keyErrorType, errType))
		// The error's text may quote what was said: it goes with the content.
		b.status.Code, b.status.Message = tracepb.Status_STATUS_CODE_ERROR, errType
		if c != nil && sp.Error != "" {
			b.status.Message = sp.Error
		}
	}
	if withheld {
		attrs = append(attrs, e.bool(keyContentOmitted, true))
	}
	if c != nil {
		attrs = e.nonEmpty(attrs, keyInput, c.input, keyOutput, c.output, keyToolArgs, c.args, keyToolResult, c.result)
	}
	b.attrs = attrs
	s.Attributes = attrs
}

// nonEmpty appends the string attributes of kv (key, value, ...) whose
// value is not empty.
func (e *encoder) nonEmpty(attrs []*commonpb.KeyValue, kv ...string) []*commonpb.KeyValue {
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			attrs = append(attrs, e.str(kv[i], kv[i+1]))
		}
	}
	return attrs
}
