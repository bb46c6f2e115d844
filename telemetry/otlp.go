package telemetry

import (
	"math"
	"slices"
	"strconv"

	"github.com/keel-runtime/keel"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
)

// encoder builds the OTLP request of a batch of keel spans for the
// official OTLP clients (otlptrace.Client), which send it with their
// retries, TLS and headers. It writes the spans in the protobuf wire
// format itself, straight from keel's spans, into a buffer reused from
// batch to batch, and hands them to the client as the encoded scope
// spans of a ResourceSpans message (its unknown fields, which every
// protobuf encoder writes out as they are): the collector reads the
// same bytes it would from messages built field by field.
//
// Mapping each span to an SDK span (tracetest.SpanStub) for the SDK's
// transform to copy into OTLP messages, which protobuf then encoded by
// reflection, cost a span 13-25 µs of the process's CPU, sent to a
// collector over gRPC, on a loaded 2-core machine (BenchmarkFlush);
// building the messages directly and reusing them, ~5 µs, of which
// protobuf's encoding was 60%; written here, 3-4 µs, most of it gRPC's
// own work and the decode of the span's JSON attributes
// (docs/PERFORMANCE.md).
//
// The clients' optional self-observability (an experimental SDK
// feature, off by default) counts the spans of a request from its
// messages: it sees none in these.
//
// An encoder is owned by the export goroutine.
type encoder struct {
	res *resourcepb.Resource
	// buf holds the request's scope spans: room for their tag and length
	// (filled in by request), the scope, then every span encoded since
	// the last reset.
	buf      []byte
	scopeEnd int    // the end of the scope in buf: where the spans start
	body     []byte // scratch: one span's fields
	n        int

	names   map[nameKey]string      // span names, made once
	parents map[string]trace.SpanID // the IDs of spans that are parents, hashed once
	hash    []byte                  // room to hash an ID in
}

// headRoom is the room left in encoder.buf for the scope spans' tag and
// length: a tag and a varint of up to 2^35.
const headRoom = 1 + 5

// Field numbers of the OTLP messages written here
// (opentelemetry/proto/trace/v1/trace.proto, common/v1/common.proto).
const (
	fieldResourceScopeSpans = 2 // ResourceSpans.scope_spans

	fieldScopeScope = 1 // ScopeSpans.scope
	fieldScopeSpans = 2 // ScopeSpans.spans

	fieldScopeName    = 1 // InstrumentationScope.name
	fieldScopeVersion = 2 // InstrumentationScope.version

	fieldTraceID      = 1  // Span.trace_id
	fieldSpanID       = 2  // Span.span_id
	fieldParentSpanID = 4  // Span.parent_span_id
	fieldName         = 5  // Span.name
	fieldKind         = 6  // Span.kind
	fieldStart        = 7  // Span.start_time_unix_nano
	fieldEnd          = 8  // Span.end_time_unix_nano
	fieldAttributes   = 9  // Span.attributes
	fieldStatus       = 15 // Span.status
	fieldFlags        = 16 // Span.flags

	fieldStatusMessage = 2 // Status.message
	fieldStatusCode    = 3 // Status.code

	fieldKey   = 1 // KeyValue.key
	fieldValue = 2 // KeyValue.value

	fieldString = 1 // AnyValue.string_value
	fieldBool   = 2 // AnyValue.bool_value
	fieldInt    = 3 // AnyValue.int_value
	fieldDouble = 4 // AnyValue.double_value
	fieldArray  = 5 // AnyValue.array_value

	fieldArrayValues = 1 // ArrayValue.values
)

type nameKey struct {
	kind keel.SpanKind
	name string
	step int
}

// maxNames bounds the span names kept.
const maxNames = 4096

func newEncoder(service, version, scope string) *encoder {
	e := &encoder{names: map[nameKey]string{}, parents: map[string]trace.SpanID{}}
	// The attributes in the order the SDK's resource keeps them: by key.
	e.res = &resourcepb.Resource{Attributes: []*commonpb.KeyValue{
		{Key: "service.name", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: service}}},
		{Key: "service.version", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: version}}},
	}}
	e.reset()
	b := e.buf
	b = protowire.AppendTag(b, fieldScopeScope, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(protowire.SizeTag(fieldScopeName)+protowire.SizeBytes(len(scope))+protowire.SizeTag(fieldScopeVersion)+protowire.SizeBytes(len(version))))
	b = protowire.AppendTag(b, fieldScopeName, protowire.BytesType)
	b = protowire.AppendString(b, scope)
	b = protowire.AppendTag(b, fieldScopeVersion, protowire.BytesType)
	b = protowire.AppendString(b, version)
	e.buf = b
	e.scopeEnd = len(b)
	return e
}

// len is the number of spans encoded since the last reset.
func (e *encoder) len() int { return e.n }

// full reports whether the batch should be sent before another span is
// added: it holds maxBatch spans, or maxBatchBytes of them.
func (e *encoder) full() bool { return e.n >= maxBatch || len(e.buf) >= maxBatchBytes }

// request returns the spans encoded since the last reset as a request's
// resource spans; valid until the next reset.
func (e *encoder) request() []*tracepb.ResourceSpans {
	size := len(e.buf) - headRoom
	var head [headRoom]byte
	h := protowire.AppendTag(head[:0], fieldResourceScopeSpans, protowire.BytesType)
	h = protowire.AppendVarint(h, uint64(size))
	start := headRoom - len(h)
	copy(e.buf[start:], h)
	rs := &tracepb.ResourceSpans{Resource: e.res}
	rs.ProtoReflect().SetUnknown(e.buf[start:])
	return []*tracepb.ResourceSpans{rs}
}

// reset empties the encoder for the next batch. Its buffers are kept,
// unless a batch with content made them larger than keepBuffer.
func (e *encoder) reset() {
	e.n = 0
	if cap(e.body) > keepBuffer {
		e.body = nil
	}
	if e.scopeEnd == 0 {
		e.buf = append(e.buf[:0], make([]byte, headRoom)...)
		return
	}
	if cap(e.buf) > keepBuffer {
		e.buf = slices.Clone(e.buf[:e.scopeEnd])
	}
	e.buf = e.buf[:e.scopeEnd]
}

// keepBuffer is the largest buffer an encoder keeps between batches: a
// batch of 512 spans without content is about 200 kB.
const keepBuffer = 1 << 20

// The attribute writers append one attribute (a KeyValue, as field
// Span.attributes) to b and return it. They work on a slice held in a
// local variable, not on the encoder: storing a slice into the encoder
// (on the heap) at every attribute went through the GC's write barrier
// whenever a collection was under way, which, in a busy daemon, is most
// of the time; it cost about as much as the encoding itself.

// appendKV appends the head of attribute key, whose AnyValue is size
// bytes.
func appendKV(b []byte, key string, size int) []byte {
	b = protowire.AppendTag(b, fieldAttributes, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(protowire.SizeTag(fieldKey)+protowire.SizeBytes(len(key))+protowire.SizeTag(fieldValue)+protowire.SizeBytes(size)))
	b = protowire.AppendTag(b, fieldKey, protowire.BytesType)
	b = protowire.AppendString(b, key)
	b = protowire.AppendTag(b, fieldValue, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(size))
}

func appendStr(b []byte, key, val string) []byte {
	b = appendKV(b, key, protowire.SizeTag(fieldString)+protowire.SizeBytes(len(val)))
	b = protowire.AppendTag(b, fieldString, protowire.BytesType)
	return protowire.AppendString(b, val)
}

func appendInt(b []byte, key string, val int) []byte {
	b = appendKV(b, key, protowire.SizeTag(fieldInt)+protowire.SizeVarint(uint64(val)))
	b = protowire.AppendTag(b, fieldInt, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(val))
}

func appendFloat(b []byte, key string, val float64) []byte {
	b = appendKV(b, key, protowire.SizeTag(fieldDouble)+protowire.SizeFixed64())
	b = protowire.AppendTag(b, fieldDouble, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, math.Float64bits(val))
}

func appendBool(b []byte, key string, val bool) []byte {
	b = appendKV(b, key, protowire.SizeTag(fieldBool)+protowire.SizeVarint(protowire.EncodeBool(val)))
	b = protowire.AppendTag(b, fieldBool, protowire.VarintType)
	return protowire.AppendVarint(b, protowire.EncodeBool(val))
}

func appendStrs(b []byte, key string, vals ...string) []byte {
	elem := func(s string) int { return protowire.SizeTag(fieldString) + protowire.SizeBytes(len(s)) }
	arr := 0
	for _, s := range vals {
		arr += protowire.SizeTag(fieldArrayValues) + protowire.SizeBytes(elem(s))
	}
	b = appendKV(b, key, protowire.SizeTag(fieldArray)+protowire.SizeBytes(arr))
	b = protowire.AppendTag(b, fieldArray, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(arr))
	for _, s := range vals {
		b = protowire.AppendTag(b, fieldArrayValues, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(elem(s)))
		b = protowire.AppendTag(b, fieldString, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	return b
}

// appendDecisions appends attribute key: a model call's policy
// decisions, a string each, "provider/model: explanation".
func appendDecisions(b []byte, key string, ds []modelDecision) []byte {
	text := func(d *modelDecision) int { return len(d.Provider) + 1 + len(d.Model) + 2 + len(d.Explanation) }
	elem := func(d *modelDecision) int { return protowire.SizeTag(fieldString) + protowire.SizeBytes(text(d)) }
	arr := 0
	for i := range ds {
		arr += protowire.SizeTag(fieldArrayValues) + protowire.SizeBytes(elem(&ds[i]))
	}
	b = appendKV(b, key, protowire.SizeTag(fieldArray)+protowire.SizeBytes(arr))
	b = protowire.AppendTag(b, fieldArray, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(arr))
	for i := range ds {
		d := &ds[i]
		b = protowire.AppendTag(b, fieldArrayValues, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(elem(d)))
		b = protowire.AppendTag(b, fieldString, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(text(d)))
		b = append(append(append(append(append(b, d.Provider...), '/'), d.Model...), ": "...), d.Explanation...)
	}
	return b
}

// appendNonEmpty appends the string attributes of kv (key, value, ...)
// whose value is not empty.
func appendNonEmpty(b []byte, kv ...string) []byte {
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			b = appendStr(b, kv[i], kv[i+1])
		}
	}
	return b
}

// spanID is spanIDOf(id).
func (e *encoder) spanID(id string) trace.SpanID {
	if cap(e.hash) < 64 {
		e.hash = make([]byte, 0, 64)
	}
	return spanIDIn(e.hash[:0], id)
}

// maxParents bounds the parents' IDs kept: a run's steps and root are
// the parents of its spans, each hashed once (its children end first).
const maxParents = 4096

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
	case keel.SpanRetrieval:
		n = opRetrieval + " " + sp.Name
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
// another run's). The fields are written in the order of their numbers,
// as protobuf's own encoder writes them.
func (e *encoder) add(sp *keel.Span, a *spanAttrs, ri *runInfo, labels []string, c *spanContent, withheld bool) {
	e.n++
	b := e.body[:0]
	sid, ok := e.parents[sp.ID]
	if !ok {
		sid = e.spanID(sp.ID)
	}
	b = protowire.AppendTag(b, fieldTraceID, protowire.BytesType)
	b = protowire.AppendBytes(b, ri.trace[:])
	b = protowire.AppendTag(b, fieldSpanID, protowire.BytesType)
	b = protowire.AppendBytes(b, sid[:])
	flags := flagsLocal
	if sp.ParentID != "" {
		pid, ok := e.parents[sp.ParentID]
		if !ok {
			pid = e.spanID(sp.ParentID)
			if len(e.parents) >= maxParents {
				clear(e.parents)
			}
			e.parents[sp.ParentID] = pid
		}
		b = protowire.AppendTag(b, fieldParentSpanID, protowire.BytesType)
		b = protowire.AppendBytes(b, pid[:])
		if sp.Kind == keel.SpanRun {
			flags = flagsRemote
		}
	}
	b = protowire.AppendTag(b, fieldName, protowire.BytesType)
	b = protowire.AppendString(b, e.name(sp))
	kind := tracepb.Span_SPAN_KIND_INTERNAL
	if sp.Kind == keel.SpanModelCall {
		kind = tracepb.Span_SPAN_KIND_CLIENT
	}
	b = protowire.AppendTag(b, fieldKind, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(kind))
	if t := uint64(max(0, sp.Start.UnixNano())); t != 0 {
		b = protowire.AppendTag(b, fieldStart, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, t)
	}
	if t := uint64(max(0, sp.Start.Add(sp.Duration).UnixNano())); t != 0 {
		b = protowire.AppendTag(b, fieldEnd, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, t)
	}

	b = appendStr(b, keyRunID, string(sp.RunID))
	b = appendStr(b, keySpanID, sp.ID)
	b = appendStr(b, keySpanKind, string(sp.Kind))
	if sp.Step > 0 {
		b = appendInt(b, keyStep, sp.Step)
	}
	if len(labels) > 0 {
		b = appendStrs(b, keyLabels, labels...)
	}
	if sp.Retries > 0 {
		b = appendInt(b, keyRetries, sp.Retries)
	}
	errType := ""
	run := &ri.run
	switch sp.Kind {
	case keel.SpanRun:
		b = appendStr(b, keyOperation, opInvokeAgent)
		b = appendStr(b, keyAgentName, sp.Name)
		b = appendStr(b, keyAgentID, string(sp.RunID))
		b = appendStr(b, keyRunKind, string(run.KindOrAgent()))
		if run.Model != "" {
			b = appendStr(b, keyRequestModel, run.Model)
		}
		if run.Status != "" {
			b = appendStr(b, keyRunStatus, string(run.Status))
		}
		if run.ParentID != "" {
			b = appendStr(b, keyParentRun, string(run.ParentID))
		}
		if run.Status.Terminal() && run.Status != keel.RunSucceeded || run.Status == keel.RunInterrupted {
			errType = string(run.Status)
		}
	case keel.SpanStep:
		if sp.Name != "step" {
			b = appendStr(b, keyPlanStep, sp.Name)
		}
		if a.Run != "" {
			b = appendStr(b, keySubagent, string(a.Run))
			b = appendInt(b, keyAttempt, a.Attempt)
		}
	case keel.SpanModelCall:
		req := run.Model
		if req == "" {
			req = sp.Name
		}
		b = appendStr(b, keyOperation, opChat)
		b = appendStr(b, keyRequestModel, req)
		b = appendStr(b, keyResponseModel, sp.Name)
		b = appendInt(b, keyInputTokens, sp.PromptTokens)
		b = appendInt(b, keyOutputTokens, sp.CompletionTokens)
		if sp.Provider != "" {
			b = appendStr(b, keyProvider, sp.Provider)
		}
		if sp.CostUSD != 0 {
			b = appendFloat(b, keyCost, sp.CostUSD)
		}
		if sp.FinishReason != "" {
			b = appendStrs(b, keyFinishReasons, sp.FinishReason)
		}
		if sp.TTFT > 0 {
			b = appendFloat(b, keyTTFT, float64(sp.TTFT)/1e6)
		}
		b = appendNonEmpty(b, keyRoute, a.Route, keyVariant, a.Variant, keyModelDigest, sp.ModelDigest, keyPromptHash, sp.PromptHash, keyTemplateHash, sp.TemplateHash)
		if len(a.Policy.Decisions) > 0 {
			b = appendDecisions(b, keyPolicyList, a.Policy.Decisions)
		}
		if sp.Status == keel.SpanError {
			errType = errOther
		}
	case keel.SpanToolCall:
		b = appendStr(b, keyOperation, opExecuteTool)
		b = appendStr(b, keyToolName, sp.Name)
		if a.CallID != "" {
			b = appendStr(b, keyToolCallID, a.CallID)
		}
		if sp.Status == keel.SpanError {
			errType = cmpOr(a.ErrorType, errOther)
		}
	case keel.SpanHuman:
		b = appendBool(b, keyHumanWait, true)
		if a.CallID != "" {
			b = appendStr(b, keyToolCallID, a.CallID)
		}
	case keel.SpanRetrieval:
		b = appendStr(b, keyOperation, opRetrieval)
		b = appendStr(b, keyDataSource, sp.Name)
		if a.CallID != "" {
			b = appendStr(b, keyToolCallID, a.CallID)
		}
		if len(a.Scopes) > 0 {
			b = appendStrs(b, keyScopes, a.Scopes...)
		}
		if a.Limit > 0 {
			b = appendInt(b, keyRetrievalTopK, a.Limit)
		}
		b = appendInt(b, keyHitCount, len(a.Hits))
	}
	if sp.Kind == keel.SpanToolCall || sp.Kind == keel.SpanHuman {
		if pd := a.Policy.Decision; pd != nil && pd.Outcome != "" {
			b = appendStr(b, keyPolicyOutcome, pd.Outcome)
			b = appendStr(b, keyPolicyExplain, pd.Explanation)
		}
		if a.Egress > 0 {
			b = appendInt(b, keyEgressCount, a.Egress)
			b = appendInt(b, keyEgressRefused, a.EgressRefused)
		}
	}
	code, msg := tracepb.Status_STATUS_CODE_UNSET, ""
	switch sp.Status {
	case keel.SpanOK:
		code = tracepb.Status_STATUS_CODE_OK
	case keel.SpanError:
		if errType == "" {
			errType = errOther
		}
		b = appendStr(b, keyErrorType, errType)
		// The error's text may quote what was said: it goes with the content.
		code, msg = tracepb.Status_STATUS_CODE_ERROR, errType
		if c != nil && sp.Error != "" {
			msg = sp.Error
		}
	}
	if withheld {
		b = appendBool(b, keyContentOmitted, true)
	}
	if c != nil {
		b = appendNonEmpty(b, keyInput, c.input, keyOutput, c.output, keyToolArgs, c.args, keyToolResult, c.result, keyRetrievalText, c.query, keyRetrievalDocs, c.docs)
	}

	status := 0
	if msg != "" {
		status += protowire.SizeTag(fieldStatusMessage) + protowire.SizeBytes(len(msg))
	}
	if code != 0 {
		status += protowire.SizeTag(fieldStatusCode) + protowire.SizeVarint(uint64(code))
	}
	b = protowire.AppendTag(b, fieldStatus, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(status))
	if msg != "" {
		b = protowire.AppendTag(b, fieldStatusMessage, protowire.BytesType)
		b = protowire.AppendString(b, msg)
	}
	if code != 0 {
		b = protowire.AppendTag(b, fieldStatusCode, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(code))
	}
	b = protowire.AppendTag(b, fieldFlags, protowire.Fixed32Type)
	b = protowire.AppendFixed32(b, flags)
	e.body = b

	buf := protowire.AppendTag(e.buf, fieldScopeSpans, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(len(b)))
	e.buf = append(buf, b...)
}
