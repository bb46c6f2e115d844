package telemetry

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"

	gojson "github.com/goccy/go-json"
	"github.com/keel-runtime/keel"
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
	var buf [64]byte
	return spanIDIn(buf[:0], id)
}

// spanIDIn is spanIDOf, with buf as room to hash in.
func spanIDIn(buf []byte, id string) trace.SpanID {
	h := sha256.Sum256(append(append(buf, "keel.span\x00"...), id...))
	var sid trace.SpanID
	copy(sid[:], h[:8])
	if !sid.IsValid() {
		sid[7] = 1
	}
	return sid
}

// spanAttrs is what the engine puts in keel.Span.Attrs, for every kind.
type spanAttrs struct {
	commonAttrs
	Policy spanPolicy
}

// commonAttrs are the attributes that have one form for every kind.
type commonAttrs struct {
	CallID    string   `json:"call_id"`
	ErrorType string   `json:"error_type"`
	Labels    []string `json:"labels"`
	Egress    []struct {
		Policy *decision `json:"policy"`
	} `json:"egress"`
	Route   string     `json:"route"`
	Variant string     `json:"variant"`
	Run     keel.RunID `json:"run"`
	Attempt int        `json:"attempt"`
}

// spanPolicy is a span's "policy": the decision that let a tool call
// run (or asked a person), or a model call's decisions, one per model
// the router considered.
type spanPolicy struct {
	Decision  *decision
	Decisions []modelDecision
}

// decision is what the export reads of a keel.PolicyDecision.
type decision struct {
	Outcome     string `json:"outcome"`
	Explanation string `json:"explanation"`
}

// modelDecision is what the export reads of a keel.ModelDecision.
type modelDecision struct {
	Provider    string `json:"provider"`
	Model       string `json:"model"`
	Explanation string `json:"explanation"`
}

// decodeAttrs reads the attributes of sp, best effort: a span is
// exported with what could be read. They are decoded once, for the
// export and the metrics, with goccy/go-json (already keel's, in
// schema), about twice as fast as encoding/json here, in one pass into
// the form of the span's kind: a model call's "policy" is a list of
// decisions, a tool call's or a wait's one decision. Attributes not in
// that form are decoded again, field by field, keeping what fits.
func decodeAttrs(sp *keel.Span) spanAttrs {
	var a spanAttrs
	if len(sp.Attrs) == 0 {
		return a
	}
	if sp.Kind == keel.SpanModelCall {
		var v struct {
			commonAttrs
			Policy []modelDecision `json:"policy"`
		}
		if gojson.Unmarshal(sp.Attrs, &v) == nil {
			a.commonAttrs, a.Policy.Decisions = v.commonAttrs, v.Policy
			return a
		}
	} else {
		var v struct {
			commonAttrs
			Policy *decision `json:"policy"`
		}
		if gojson.Unmarshal(sp.Attrs, &v) == nil {
			a.commonAttrs, a.Policy.Decision = v.commonAttrs, v.Policy
			return a
		}
	}
	var v struct {
		commonAttrs
		Policy json.RawMessage `json:"policy"`
	}
	_ = gojson.Unmarshal(sp.Attrs, &v)
	a.commonAttrs = v.commonAttrs
	switch p := bytes.TrimSpace(v.Policy); {
	case len(p) > 0 && p[0] == '{':
		var d decision
		if gojson.Unmarshal(p, &d) == nil {
			a.Policy.Decision = &d
		}
	case len(p) > 0 && p[0] == '[':
		var list []modelDecision
		if gojson.Unmarshal(p, &list) == nil {
			a.Policy.Decisions = list
		}
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

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
