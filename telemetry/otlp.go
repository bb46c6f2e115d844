package telemetry

import (
	"encoding/binary"
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
// own work and the decode of the span's JSON attributes; with the keys
// and tags encoded once and each span written in place, the encoding
// itself is about half what it was (docs/PERFORMANCE.md).
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
	scopeEnd int // the end of the scope in buf: where the spans start
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

// reset empties the encoder for the next batch. Its buffer is kept,
// unless a batch with content made it larger than keepBuffer.
func (e *encoder) reset() {
	e.n = 0
	if e.scopeEnd == 0 {
		e.buf = append(e.buf[:0], make([]byte, headRoom)...)
		return
	}
	if cap(e.buf) > keepBuffer {
		e.buf = slices.Clone(e.buf[:e.scopeEnd])
	}
	e.buf = e.buf[:e.scopeEnd]
}

// lost gives up the encoder's buffer after a request that failed: the
// gRPC client, which sends it without a copy (requestCodec), may still
// hold it.
func (e *encoder) lost() {
	e.buf = slices.Clone(e.buf[:e.scopeEnd])
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

// Tags of one byte (field number < 16), written as constants rather
// than computed at every field.
const (
	tagAttributes  = fieldAttributes<<3 | byte(protowire.BytesType)
	tagString      = fieldString<<3 | byte(protowire.BytesType)
	tagInt         = fieldInt<<3 | byte(protowire.VarintType)
	tagBool        = fieldBool<<3 | byte(protowire.VarintType)
	tagDouble      = fieldDouble<<3 | byte(protowire.Fixed64Type)
	tagArray       = fieldArray<<3 | byte(protowire.BytesType)
	tagArrayValues = fieldArrayValues<<3 | byte(protowire.BytesType)
	tagScopeSpans  = fieldScopeSpans<<3 | byte(protowire.BytesType)
)

// attrKey is an attribute's key encoded once, as the start of a
// KeyValue after its length: the key's field, then the tag of the value.
// The keys are constants: encoding them at every span was a third of a
// span's encoding.
type attrKey string

func newAttrKey(key string) attrKey {
	b := protowire.AppendTag(nil, fieldKey, protowire.BytesType)
	b = protowire.AppendString(b, key)
	return attrKey(protowire.AppendTag(b, fieldValue, protowire.BytesType))
}

// The keys written on spans (see mapping.go).
var (
	akOperation      = newAttrKey(keyOperation)
	akProvider       = newAttrKey(keyProvider)
	akRequestModel   = newAttrKey(keyRequestModel)
	akResponseModel  = newAttrKey(keyResponseModel)
	akInputTokens    = newAttrKey(keyInputTokens)
	akOutputTokens   = newAttrKey(keyOutputTokens)
	akFinishReasons  = newAttrKey(keyFinishReasons)
	akToolName       = newAttrKey(keyToolName)
	akToolCallID     = newAttrKey(keyToolCallID)
	akToolArgs       = newAttrKey(keyToolArgs)
	akToolResult     = newAttrKey(keyToolResult)
	akAgentName      = newAttrKey(keyAgentName)
	akAgentID        = newAttrKey(keyAgentID)
	akInput          = newAttrKey(keyInput)
	akOutput         = newAttrKey(keyOutput)
	akErrorType      = newAttrKey(keyErrorType)
	akDataSource     = newAttrKey(keyDataSource)
	akRetrievalTopK  = newAttrKey(keyRetrievalTopK)
	akRetrievalText  = newAttrKey(keyRetrievalText)
	akRetrievalDocs  = newAttrKey(keyRetrievalDocs)
	akRunID          = newAttrKey(keyRunID)
	akParentRun      = newAttrKey(keyParentRun)
	akRunKind        = newAttrKey(keyRunKind)
	akRunStatus      = newAttrKey(keyRunStatus)
	akSpanID         = newAttrKey(keySpanID)
	akSpanKind       = newAttrKey(keySpanKind)
	akStep           = newAttrKey(keyStep)
	akLabels         = newAttrKey(keyLabels)
	akCost           = newAttrKey(keyCost)
	akRetries        = newAttrKey(keyRetries)
	akTTFT           = newAttrKey(keyTTFT)
	akRoute          = newAttrKey(keyRoute)
	akVariant        = newAttrKey(keyVariant)
	akModelDigest    = newAttrKey(keyModelDigest)
	akPromptHash     = newAttrKey(keyPromptHash)
	akTemplateHash   = newAttrKey(keyTemplateHash)
	akPolicyOutcome  = newAttrKey(keyPolicyOutcome)
	akPolicyExplain  = newAttrKey(keyPolicyExplain)
	akPolicyList     = newAttrKey(keyPolicyList)
	akEgressCount    = newAttrKey(keyEgressCount)
	akEgressRefused  = newAttrKey(keyEgressRefused)
	akHumanWait      = newAttrKey(keyHumanWait)
	akPlanStep       = newAttrKey(keyPlanStep)
	akSubagent       = newAttrKey(keySubagent)
	akAttempt        = newAttrKey(keyAttempt)
	akContentOmitted = newAttrKey(keyContentOmitted)
	akScopes         = newAttrKey(keyScopes)
	akHitCount       = newAttrKey(keyHitCount)
)

// appendVarint is protowire.AppendVarint, with the lengths and numbers
// of a span (under 2^14, mostly) written inline.
func appendVarint(b []byte, v uint64) []byte {
	switch {
	case v < 1<<7:
		return append(b, byte(v))
	case v < 1<<14:
		return append(b, byte(v)|0x80, byte(v>>7))
	}
	return protowire.AppendVarint(b, v)
}

// sizeBytes is protowire.SizeBytes: a length and n bytes.
func sizeBytes(n int) int { return protowire.SizeVarint(uint64(n)) + n }

// appendKV appends the head of attribute key, whose AnyValue is size
// bytes.
func appendKV(b []byte, key attrKey, size int) []byte {
	b = append(b, tagAttributes)
	b = appendVarint(b, uint64(len(key)+sizeBytes(size)))
	b = append(b, key...)
	return appendVarint(b, uint64(size))
}

func appendStr(b []byte, key attrKey, val string) []byte {
	b = appendKV(b, key, 1+sizeBytes(len(val)))
	b = append(b, tagString)
	b = appendVarint(b, uint64(len(val)))
	return append(b, val...)
}

func appendInt(b []byte, key attrKey, val int) []byte {
	b = appendKV(b, key, 1+protowire.SizeVarint(uint64(val)))
	b = append(b, tagInt)
	return appendVarint(b, uint64(val))
}

func appendFloat(b []byte, key attrKey, val float64) []byte {
	b = appendKV(b, key, 1+protowire.SizeFixed64())
	b = append(b, tagDouble)
	return protowire.AppendFixed64(b, math.Float64bits(val))
}

func appendBool(b []byte, key attrKey, val bool) []byte {
	b = appendKV(b, key, 1+protowire.SizeVarint(protowire.EncodeBool(val)))
	b = append(b, tagBool)
	return appendVarint(b, protowire.EncodeBool(val))
}

func appendStrs(b []byte, key attrKey, vals ...string) []byte {
	elem := func(s string) int { return 1 + sizeBytes(len(s)) }
	arr := 0
	for _, s := range vals {
		arr += 1 + sizeBytes(elem(s))
	}
	b = appendKV(b, key, 1+sizeBytes(arr))
	b = append(b, tagArray)
	b = appendVarint(b, uint64(arr))
	for _, s := range vals {
		b = append(b, tagArrayValues)
		b = appendVarint(b, uint64(elem(s)))
		b = append(b, tagString)
		b = appendVarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

// appendDecisions appends attribute key: a model call's policy
// decisions, a string each, "provider/model: explanation".
func appendDecisions(b []byte, key attrKey, ds []modelDecision) []byte {
	text := func(d *modelDecision) int { return len(d.Provider) + 1 + len(d.Model) + 2 + len(d.Explanation) }
	elem := func(d *modelDecision) int { return 1 + sizeBytes(text(d)) }
	arr := 0
	for i := range ds {
		arr += 1 + sizeBytes(elem(&ds[i]))
	}
	b = appendKV(b, key, 1+sizeBytes(arr))
	b = append(b, tagArray)
	b = appendVarint(b, uint64(arr))
	for i := range ds {
		d := &ds[i]
		b = append(b, tagArrayValues)
		b = appendVarint(b, uint64(elem(d)))
		b = append(b, tagString)
		b = appendVarint(b, uint64(text(d)))
		b = append(append(append(append(append(b, d.Provider...), '/'), d.Model...), ": "...), d.Explanation...)
	}
	return b
}

// appendNonEmpty appends string attribute key unless val is empty.
func appendNonEmpty(b []byte, key attrKey, val string) []byte {
	if val == "" {
		return b
	}
	return appendStr(b, key, val)
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
// another run's); a run handed from another environment is in that
// environment's trace, its root span the child of the hand-off span
// there (runInfo.parent). The fields are written in the order of their numbers,
// as protobuf's own encoder writes them.
func (e *encoder) add(sp *keel.Span, a *spanAttrs, ri *runInfo, labels []string, c *spanContent, withheld bool) {
	e.n++
	// The span is written in place, after room for its tag and a length
	// of two bytes (a span of 128 bytes to 16 KiB: nearly all of them);
	// a length of another size moves it (see the end).
	buf := e.buf
	at := len(buf)
	b := append(buf, tagScopeSpans, 0, 0)
	body := len(b)
	sid, ok := e.parents[sp.ID]
	if !ok {
		sid = e.spanID(sp.ID)
	}
	b = append(b, fieldTraceID<<3|byte(protowire.BytesType), byte(len(ri.trace)))
	b = append(b, ri.trace[:]...)
	b = append(b, fieldSpanID<<3|byte(protowire.BytesType), byte(len(sid)))
	b = append(b, sid[:]...)
	flags := flagsLocal
	if sp.ParentID == "" && sp.Kind == keel.SpanRun && ri.parent.IsValid() {
		// The root of a run handed from another environment.
		b = append(b, fieldParentSpanID<<3|byte(protowire.BytesType), byte(len(ri.parent)))
		b = append(b, ri.parent[:]...)
		flags = flagsRemote
	} else if sp.ParentID != "" {
		pid, ok := e.parents[sp.ParentID]
		if !ok {
			pid = e.spanID(sp.ParentID)
			if len(e.parents) >= maxParents {
				clear(e.parents)
			}
			e.parents[sp.ParentID] = pid
		}
		b = append(b, fieldParentSpanID<<3|byte(protowire.BytesType), byte(len(pid)))
		b = append(b, pid[:]...)
		if sp.Kind == keel.SpanRun {
			flags = flagsRemote
		}
	}
	name := e.name(sp)
	b = append(b, fieldName<<3|byte(protowire.BytesType))
	b = appendVarint(b, uint64(len(name)))
	b = append(b, name...)
	kind := tracepb.Span_SPAN_KIND_INTERNAL
	if sp.Kind == keel.SpanModelCall {
		kind = tracepb.Span_SPAN_KIND_CLIENT
	}
	b = append(b, fieldKind<<3|byte(protowire.VarintType), byte(kind))
	if t := uint64(max(0, sp.Start.UnixNano())); t != 0 {
		b = append(b, fieldStart<<3|byte(protowire.Fixed64Type))
		b = protowire.AppendFixed64(b, t)
	}
	if t := uint64(max(0, sp.Start.Add(sp.Duration).UnixNano())); t != 0 {
		b = append(b, fieldEnd<<3|byte(protowire.Fixed64Type))
		b = protowire.AppendFixed64(b, t)
	}

	b = appendStr(b, akRunID, string(sp.RunID))
	b = appendStr(b, akSpanID, sp.ID)
	b = appendStr(b, akSpanKind, string(sp.Kind))
	if sp.Step > 0 {
		b = appendInt(b, akStep, sp.Step)
	}
	if len(labels) > 0 {
		b = appendStrs(b, akLabels, labels...)
	}
	if sp.Retries > 0 {
		b = appendInt(b, akRetries, sp.Retries)
	}
	errType := ""
	run := &ri.run
	switch sp.Kind {
	case keel.SpanRun:
		b = appendStr(b, akOperation, opInvokeAgent)
		b = appendStr(b, akAgentName, sp.Name)
		b = appendStr(b, akAgentID, string(sp.RunID))
		b = appendStr(b, akRunKind, string(run.KindOrAgent()))
		b = appendNonEmpty(b, akRequestModel, run.Model)
		b = appendNonEmpty(b, akRunStatus, string(run.Status))
		b = appendNonEmpty(b, akParentRun, string(run.ParentID))
		if run.Status.Terminal() && run.Status != keel.RunSucceeded || run.Status == keel.RunInterrupted {
			errType = string(run.Status)
		}
	case keel.SpanStep:
		if sp.Name != "step" {
			b = appendStr(b, akPlanStep, sp.Name)
		}
		if a.Run != "" {
			b = appendStr(b, akSubagent, string(a.Run))
			b = appendInt(b, akAttempt, a.Attempt)
		}
	case keel.SpanModelCall:
		req := run.Model
		if req == "" {
			req = sp.Name
		}
		b = appendStr(b, akOperation, opChat)
		b = appendStr(b, akRequestModel, req)
		b = appendStr(b, akResponseModel, sp.Name)
		b = appendInt(b, akInputTokens, sp.PromptTokens)
		b = appendInt(b, akOutputTokens, sp.CompletionTokens)
		b = appendNonEmpty(b, akProvider, sp.Provider)
		if sp.CostUSD != 0 {
			b = appendFloat(b, akCost, sp.CostUSD)
		}
		if sp.FinishReason != "" {
			b = appendStrs(b, akFinishReasons, sp.FinishReason)
		}
		if sp.TTFT > 0 {
			b = appendFloat(b, akTTFT, float64(sp.TTFT)/1e6)
		}
		b = appendNonEmpty(b, akRoute, a.Route)
		b = appendNonEmpty(b, akVariant, a.Variant)
		b = appendNonEmpty(b, akModelDigest, sp.ModelDigest)
		b = appendNonEmpty(b, akPromptHash, sp.PromptHash)
		b = appendNonEmpty(b, akTemplateHash, sp.TemplateHash)
		if len(a.Policy.Decisions) > 0 {
			b = appendDecisions(b, akPolicyList, a.Policy.Decisions)
		}
		if sp.Status == keel.SpanError {
			errType = errOther
		}
	case keel.SpanToolCall:
		b = appendStr(b, akOperation, opExecuteTool)
		b = appendStr(b, akToolName, sp.Name)
		b = appendNonEmpty(b, akToolCallID, a.CallID)
		if sp.Status == keel.SpanError {
			errType = cmpOr(a.ErrorType, errOther)
		}
	case keel.SpanHuman:
		b = appendBool(b, akHumanWait, true)
		b = appendNonEmpty(b, akToolCallID, a.CallID)
	case keel.SpanRetrieval:
		b = appendStr(b, akOperation, opRetrieval)
		b = appendStr(b, akDataSource, sp.Name)
		b = appendNonEmpty(b, akToolCallID, a.CallID)
		if len(a.Scopes) > 0 {
			b = appendStrs(b, akScopes, a.Scopes...)
		}
		if a.Limit > 0 {
			b = appendInt(b, akRetrievalTopK, a.Limit)
		}
		b = appendInt(b, akHitCount, len(a.Hits))
	}
	if sp.Kind == keel.SpanToolCall || sp.Kind == keel.SpanHuman {
		if pd := a.Policy.Decision; pd != nil && pd.Outcome != "" {
			b = appendStr(b, akPolicyOutcome, pd.Outcome)
			b = appendStr(b, akPolicyExplain, pd.Explanation)
		}
		if a.Egress > 0 {
			b = appendInt(b, akEgressCount, a.Egress)
			b = appendInt(b, akEgressRefused, a.EgressRefused)
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
		b = appendStr(b, akErrorType, errType)
		// The error's text may quote what was said: it goes with the content.
		code, msg = tracepb.Status_STATUS_CODE_ERROR, errType
		if c != nil && sp.Error != "" {
			msg = sp.Error
		}
	}
	if withheld {
		b = appendBool(b, akContentOmitted, true)
	}
	if c != nil {
		b = appendNonEmpty(b, akInput, c.input)
		b = appendNonEmpty(b, akOutput, c.output)
		b = appendNonEmpty(b, akToolArgs, c.args)
		b = appendNonEmpty(b, akToolResult, c.result)
		b = appendNonEmpty(b, akRetrievalText, c.query)
		b = appendNonEmpty(b, akRetrievalDocs, c.docs)
	}

	status := 0
	if msg != "" {
		status += 1 + sizeBytes(len(msg))
	}
	if code != 0 {
		status += 1 + protowire.SizeVarint(uint64(code))
	}
	b = append(b, fieldStatus<<3|byte(protowire.BytesType))
	b = appendVarint(b, uint64(status))
	if msg != "" {
		b = append(b, fieldStatusMessage<<3|byte(protowire.BytesType))
		b = appendVarint(b, uint64(len(msg)))
		b = append(b, msg...)
	}
	if code != 0 {
		b = append(b, fieldStatusCode<<3|byte(protowire.VarintType))
		b = appendVarint(b, uint64(code))
	}
	b = protowire.AppendTag(b, fieldFlags, protowire.Fixed32Type)
	b = protowire.AppendFixed32(b, flags)

	// The span's length, in the two bytes left for it; another size
	// moves the span to fit its length.
	n := len(b) - body
	if n >= 1<<7 && n < 1<<14 {
		b[at+1], b[at+2] = byte(n)|0x80, byte(n>>7)
	} else {
		var room [binary.MaxVarintLen64]byte
		head := protowire.AppendVarint(room[:0], uint64(n))
		if len(head) > 2 {
			b = append(b, make([]byte, len(head)-2)...)
		}
		copy(b[at+1+len(head):], b[body:body+n]) // copy moves overlapping bytes
		copy(b[at+1:], head)
		b = b[:at+1+len(head)+n]
	}
	e.buf = b
}
