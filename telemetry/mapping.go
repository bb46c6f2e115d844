package telemetry

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"

	gojson "github.com/goccy/go-json"
	"github.com/keel-runtime/keel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// The attribute keys: the GenAI semantic conventions', and keel's own.
const (
	keyOperation     = "gen_ai.operation.name"
	keyProvider      = "gen_ai.provider.name"
	keyRequestModel  = "gen_ai.request.model"
	keyResponseModel = "gen_ai.response.model"
	keyInputTokens   = "gen_ai.usage.input_tokens"
	keyOutputTokens  = "gen_ai.usage.output_tokens"
	keyFinishReasons = "gen_ai.response.finish_reasons"
	keyToolName      = "gen_ai.tool.name"
	keyToolCallID    = "gen_ai.tool.call.id"
	keyToolArgs      = "gen_ai.tool.call.arguments"
	keyToolResult    = "gen_ai.tool.call.result"
	keyAgentName     = "gen_ai.agent.name"
	keyAgentID       = "gen_ai.agent.id"
	keyInput         = "gen_ai.input.messages"
	keyOutput        = "gen_ai.output.messages"
	keyErrorType     = "error.type"

	keyRunID          = "keel.run.id"
	keyParentRun      = "keel.run.parent_id"
	keyRunKind        = "keel.run.kind"
	keyRunStatus      = "keel.run.status"
	keySpanID         = "keel.span.id"
	keySpanKind       = "keel.span.kind"
	keyStep           = "keel.step"
	keyLabels         = "keel.labels"
	keyCost           = "keel.cost_usd"
	keyRetries        = "keel.retries"
	keyTTFT           = "keel.ttft_ms"
	keyRoute          = "keel.route"
	keyVariant        = "keel.variant"
	keyModelDigest    = "keel.model.digest"
	keyPromptHash     = "keel.prompt.hash"
	keyTemplateHash   = "keel.prompt.template_hash"
	keyPolicyOutcome  = "keel.policy.outcome"
	keyPolicyExplain  = "keel.policy.explanation"
	keyPolicyList     = "keel.policy.decisions"
	keyEgressCount    = "keel.egress.count"
	keyEgressRefused  = "keel.egress.refused"
	keyHumanWait      = "keel.human.wait"
	keyPlanStep       = "keel.plan.step"
	keySubagent       = "keel.subagent.run_id"
	keyAttempt        = "keel.attempt"
	keyContentOmitted = "keel.content.omitted"
)

// Operation names (gen_ai.operation.name).
const (
	opChat        = "chat"
	opExecuteTool = "execute_tool"
	opInvokeAgent = "invoke_agent"
)

// errOther is error.type for a failure keel does not classify.
const errOther = "_OTHER"

// traceIDOf is the trace of the top-level run top: a hash of its ID, so
// the same run always lands in the same trace (after a restart too).
func traceIDOf(top keel.RunID) trace.TraceID {
	h := sha256.Sum256([]byte("keel.trace\x00" + string(top)))
	var id trace.TraceID
	copy(id[:], h[:16])
	if !id.IsValid() {
		id[15] = 1
	}
	return id
}

// spanIDOf is the OTel span ID of keel span id.
func spanIDOf(id string) trace.SpanID {
	h := sha256.Sum256([]byte("keel.span\x00" + id))
	var sid trace.SpanID
	copy(sid[:], h[:8])
	if !sid.IsValid() {
		sid[7] = 1
	}
	return sid
}

// spanAttrs is what the engine puts in keel.Span.Attrs, for every kind.
type spanAttrs struct {
	CallID    string          `json:"call_id"`
	ErrorType string          `json:"error_type"`
	Policy    json.RawMessage `json:"policy"` // a *keel.PolicyDecision, or []keel.ModelDecision for a model call
	Labels    []string        `json:"labels"`
	Egress    []struct {
		Destination string               `json:"destination"`
		Policy      *keel.PolicyDecision `json:"policy"`
	} `json:"egress"`
	Route   string     `json:"route"`
	Variant string     `json:"variant"`
	Run     keel.RunID `json:"run"`
	Attempt int        `json:"attempt"`
}

// decodeAttrs reads a span's attributes, best effort: a span is exported
// with what could be read. It is most of the cost of mapping a span,
// hence goccy/go-json (already keel's, in schema), about twice as fast
// as encoding/json here.
func decodeAttrs(raw json.RawMessage) spanAttrs {
	var a spanAttrs
	if len(raw) > 0 {
		_ = gojson.Unmarshal(raw, &a)
	}
	return a
}

// runInfo is what the mapping knows of a span's run.
type runInfo struct {
	run   keel.Run
	trace trace.TraceID
}

// spanContent is what was said in a span, when it may be exported.
type spanContent struct {
	input, output string // gen_ai.input.messages, gen_ai.output.messages (JSON)
	args, result  string // gen_ai.tool.call.arguments, .result
}

// message is one message of gen_ai.input.messages or .output.messages.
type message struct {
	Role         string `json:"role"`
	Parts        []part `json:"parts"`
	FinishReason string `json:"finish_reason,omitempty"`
}

type part struct {
	Type      string          `json:"type"`
	Content   string          `json:"content,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

func messagesJSON(msgs ...message) string {
	b, _ := json.Marshal(msgs)
	return string(b)
}

// stub maps keel span sp of run ri, with attributes a (decodeAttrs of
// sp.Attrs), to an OTel span. labels are the
// labels of the span and its run; c, when not nil, is its content, which
// may be exported; withheld says content was opted in but is left out
// (labelled data), which the span then says (keel.content.omitted).
func stub(sp keel.Span, a spanAttrs, ri runInfo, labels []string, c *spanContent, withheld bool, res *resource.Resource, scope instrumentation.Scope) tracetest.SpanStub {
	s := tracetest.SpanStub{
		SpanContext:          trace.NewSpanContext(trace.SpanContextConfig{TraceID: ri.trace, SpanID: spanIDOf(sp.ID), TraceFlags: trace.FlagsSampled}),
		StartTime:            sp.Start,
		EndTime:              sp.Start.Add(sp.Duration),
		Resource:             res,
		InstrumentationScope: scope,
		SpanKind:             trace.SpanKindInternal,
	}
	if sp.ParentID != "" {
		s.Parent = trace.NewSpanContext(trace.SpanContextConfig{TraceID: ri.trace, SpanID: spanIDOf(sp.ParentID), TraceFlags: trace.FlagsSampled, Remote: sp.Kind == keel.SpanRun})
	}
	attrs := make([]attribute.KeyValue, 0, 24)
	attrs = append(attrs,
		attribute.String(keyRunID, string(sp.RunID)),
		attribute.String(keySpanID, sp.ID),
		attribute.String(keySpanKind, string(sp.Kind)),
	)
	if sp.Step > 0 {
		attrs = append(attrs, attribute.Int(keyStep, sp.Step))
	}
	if len(labels) > 0 {
		attrs = append(attrs, attribute.StringSlice(keyLabels, labels))
	}
	if sp.Retries > 0 {
		attrs = append(attrs, attribute.Int(keyRetries, sp.Retries))
	}
	errType := ""
	switch sp.Kind {
	case keel.SpanRun:
		s.Name = opInvokeAgent + " " + sp.Name
		attrs = append(attrs, attribute.String(keyOperation, opInvokeAgent), attribute.String(keyAgentName, sp.Name),
			attribute.String(keyAgentID, string(sp.RunID)), attribute.String(keyRunKind, string(ri.run.KindOrAgent())))
		if ri.run.Model != "" {
			attrs = append(attrs, attribute.String(keyRequestModel, ri.run.Model))
		}
		if ri.run.Status != "" {
			attrs = append(attrs, attribute.String(keyRunStatus, string(ri.run.Status)))
		}
		if ri.run.ParentID != "" {
			attrs = append(attrs, attribute.String(keyParentRun, string(ri.run.ParentID)))
		}
		if ri.run.Status.Terminal() && ri.run.Status != keel.RunSucceeded || ri.run.Status == keel.RunInterrupted {
			errType = string(ri.run.Status)
		}
	case keel.SpanStep:
		s.Name = "step " + sp.Name
		if sp.Name == "step" {
			s.Name = fmt.Sprintf("step %d", sp.Step)
		} else {
			attrs = append(attrs, attribute.String(keyPlanStep, sp.Name))
		}
		if a.Run != "" {
			attrs = append(attrs, attribute.String(keySubagent, string(a.Run)), attribute.Int(keyAttempt, a.Attempt))
		}
	case keel.SpanModelCall:
		s.Name, s.SpanKind = opChat+" "+sp.Name, trace.SpanKindClient
		req := ri.run.Model
		if req == "" {
			req = sp.Name
		}
		attrs = append(attrs, attribute.String(keyOperation, opChat), attribute.String(keyRequestModel, req), attribute.String(keyResponseModel, sp.Name),
			attribute.Int(keyInputTokens, sp.PromptTokens), attribute.Int(keyOutputTokens, sp.CompletionTokens))
		if sp.Provider != "" {
			attrs = append(attrs, attribute.String(keyProvider, sp.Provider))
		}
		if sp.CostUSD != 0 {
			attrs = append(attrs, attribute.Float64(keyCost, sp.CostUSD))
		}
		if sp.FinishReason != "" {
			attrs = append(attrs, attribute.StringSlice(keyFinishReasons, []string{sp.FinishReason}))
		}
		if sp.TTFT > 0 {
			attrs = append(attrs, attribute.Float64(keyTTFT, float64(sp.TTFT)/1e6))
		}
		attrs = appendNonEmpty(attrs, keyRoute, a.Route, keyVariant, a.Variant, keyModelDigest, sp.ModelDigest, keyPromptHash, sp.PromptHash, keyTemplateHash, sp.TemplateHash)
		var decided []keel.ModelDecision
		if len(a.Policy) > 0 && a.Policy[0] == '[' && gojson.Unmarshal(a.Policy, &decided) == nil && len(decided) > 0 {
			list := make([]string, len(decided))
			for i, d := range decided {
				list[i] = d.Provider + "/" + d.Model + ": " + d.Explanation
			}
			attrs = append(attrs, attribute.StringSlice(keyPolicyList, list))
		}
		if sp.Status == keel.SpanError {
			errType = errOther
		}
	case keel.SpanToolCall:
		s.Name = opExecuteTool + " " + sp.Name
		attrs = append(attrs, attribute.String(keyOperation, opExecuteTool), attribute.String(keyToolName, sp.Name))
		if a.CallID != "" {
			attrs = append(attrs, attribute.String(keyToolCallID, a.CallID))
		}
		if sp.Status == keel.SpanError {
			errType = cmpOr(a.ErrorType, errOther)
		}
	case keel.SpanHuman:
		s.Name = string(keel.SpanHuman) + " " + sp.Name
		attrs = append(attrs, attribute.Bool(keyHumanWait, true))
		if a.CallID != "" {
			attrs = append(attrs, attribute.String(keyToolCallID, a.CallID))
		}
	default:
		s.Name = string(sp.Kind)
	}
	if sp.Kind == keel.SpanToolCall || sp.Kind == keel.SpanHuman {
		var pd keel.PolicyDecision
		if len(a.Policy) > 0 && a.Policy[0] == '{' && gojson.Unmarshal(a.Policy, &pd) == nil && pd.Outcome != "" {
			attrs = append(attrs, attribute.String(keyPolicyOutcome, pd.Outcome), attribute.String(keyPolicyExplain, pd.Explanation))
		}
		if len(a.Egress) > 0 {
			refused := 0
			for _, e := range a.Egress {
				if e.Policy != nil && e.Policy.Outcome != "allow" {
					refused++
				}
			}
			attrs = append(attrs, attribute.Int(keyEgressCount, len(a.Egress)), attribute.Int(keyEgressRefused, refused))
		}
	}
	switch sp.Status {
	case keel.SpanOK:
		s.Status = sdktrace.Status{Code: codes.Ok}
	case keel.SpanError:
		if errType == "" {
			errType = errOther
		}
		attrs = append(attrs, attribute.String(keyErrorType, errType))
		// The error's text may quote what was said: it goes with the content.
		desc := errType
		if c != nil && sp.Error != "" {
			desc = sp.Error
		}
		s.Status = sdktrace.Status{Code: codes.Error, Description: desc}
	}
	if withheld {
		attrs = append(attrs, attribute.Bool(keyContentOmitted, true))
	}
	if c != nil {
		attrs = appendNonEmpty(attrs, keyInput, c.input, keyOutput, c.output, keyToolArgs, c.args, keyToolResult, c.result)
	}
	s.Attributes = attrs
	return s
}

// appendNonEmpty appends the string attributes of kv (key, value, ...)
// whose value is not empty.
func appendNonEmpty(attrs []attribute.KeyValue, kv ...string) []attribute.KeyValue {
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			attrs = append(attrs, attribute.String(kv[i], kv[i+1]))
		}
	}
	return attrs
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
