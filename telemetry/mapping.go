package telemetry

import (
	"crypto/sha256"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"

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
	// A search of the knowledge store (the GenAI conventions' retrieval
	// span, in development): its data source and top k always; the query
	// and the documents found are content, exported only as content is.
	keyDataSource    = "gen_ai.data_source.id"
	keyRetrievalTopK = "gen_ai.retrieval.top_k"
	keyRetrievalText = "gen_ai.retrieval.query.text"
	keyRetrievalDocs = "gen_ai.retrieval.documents"

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
	keyScopes         = "keel.knowledge.scopes"
	keyHitCount       = "keel.retrieval.hits"
)

// Operation names (gen_ai.operation.name).
const (
	opChat        = "chat"
	opExecuteTool = "execute_tool"
	opInvokeAgent = "invoke_agent"
	opRetrieval   = "retrieval"
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

// parseTraceParent returns the trace and span IDs of W3C traceparent tp,
// and whether it parsed.
func parseTraceParent(tp string) (trace.TraceID, trace.SpanID, bool) {
	if tp == "" {
		return trace.TraceID{}, trace.SpanID{}, false
	}
	t, sp, err := keel.ParseTraceParent(tp)
	if err != nil {
		return trace.TraceID{}, trace.SpanID{}, false
	}
	tid, err1 := trace.TraceIDFromHex(t)
	sid, err2 := trace.SpanIDFromHex(sp)
	return tid, sid, err1 == nil && err2 == nil
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

// spanAttrs is what the export reads of keel.Span.Attrs, for every
// kind.
type spanAttrs struct {
	CallID    string   // call_id
	ErrorType string   // error_type
	Labels    []string // labels
	// Egress is the number of the call's network requests the policy
	// decided (egress), EgressRefused those whose decision was not allow.
	Egress, EgressRefused int
	Route, Variant        string     // route, variant
	Run                   keel.RunID // run
	Attempt               int        // attempt
	Policy                spanPolicy // policy
	// A retrieval span's: the query, the scopes searched, the limit
	// asked for and the hits (recall.RetrievalAttrs).
	Query  string         // query
	Scopes []string       // scopes
	Limit  int            // limit
	Hits   []retrievalHit // hits
}

// retrievalHit is what the export reads of a retrieval span's hit.
type retrievalHit struct {
	Source, Lines string // source, lines
	Score         float64
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
	Outcome     string
	Explanation string
}

// modelDecision is what the export reads of a keel.ModelDecision.
type modelDecision struct {
	Provider    string
	Model       string
	Explanation string
}

// decodeAttrs reads the attributes of sp, best effort: a span is
// exported with what could be read. A field of another type than the
// export reads is left out, and the others kept; "policy" is read by
// its shape, a decision (an object) or a model call's decisions (a
// list); attributes that are not JSON (cut short) give nothing.
//
// They are read once, for the export and the metrics, by a scanner of
// keel's own that reads only the fields the export uses and skips the
// rest: the attributes are copied into one string, and the strings read
// are slices of it (a string with an escape sequence is decoded on its
// own). goccy/go-json, decoding into structs, was most of the cost of
// encoding a span.
func decodeAttrs(sp *keel.Span) spanAttrs {
	var a spanAttrs
	if len(sp.Attrs) == 0 {
		return a
	}
	p := attrScanner{s: string(sp.Attrs)}
	p.object(func(key string) {
		switch key {
		case "call_id":
			a.CallID = p.str()
		case "error_type":
			a.ErrorType = p.str()
		case "route":
			a.Route = p.str()
		case "variant":
			a.Variant = p.str()
		case "run":
			a.Run = keel.RunID(p.str())
		case "attempt":
			a.Attempt = p.int()
		case "labels":
			a.Labels = nil // a key given twice: the last one counts
			p.array(func() {
				if s, ok := p.string(); ok {
					a.Labels = append(a.Labels, s)
				}
			})
		case "query":
			a.Query = p.str()
		case "scopes":
			a.Scopes = nil
			p.array(func() {
				if s, ok := p.string(); ok {
					a.Scopes = append(a.Scopes, s)
				}
			})
		case "limit":
			a.Limit = p.int()
		case "hits":
			a.Hits = nil
			p.array(func() {
				var h retrievalHit
				p.object(func(key string) {
					switch key {
					case "source":
						h.Source = p.str()
					case "lines":
						h.Lines = p.str()
					case "score":
						h.Score = p.float()
					default:
						p.skip()
					}
				})
				a.Hits = append(a.Hits, h)
			})
		case "egress":
			a.Egress, a.EgressRefused = 0, 0
			p.array(func() {
				a.Egress++
				p.object(func(key string) {
					if key != "policy" || p.peek() != '{' {
						p.skip()
						return
					}
					var d decision
					p.decision(&d)
					if d.Outcome != "allow" {
						a.EgressRefused++
					}
				})
			})
		case "policy":
			a.Policy = spanPolicy{}
			switch p.peek() {
			case '{':
				d := &decision{}
				p.decision(d)
				a.Policy.Decision = d
			case '[':
				p.array(func() {
					var d modelDecision
					p.object(func(key string) {
						switch key {
						case "provider":
							d.Provider = p.str()
						case "model":
							d.Model = p.str()
						case "explanation":
							d.Explanation = p.str()
						default:
							p.skip()
						}
					})
					a.Policy.Decisions = append(a.Policy.Decisions, d)
				})
			default:
				p.skip()
			}
		default:
			p.skip()
		}
	})
	if p.bad {
		return spanAttrs{}
	}
	return a
}

// attrScanner reads JSON from s, from i on. A syntax error sets bad,
// after which every method returns at once. A method that reads a value
// of a type and finds another skips it.
type attrScanner struct {
	s     string
	i     int
	bad   bool
	depth int
}

// maxAttrDepth bounds the nesting the scanner follows.
const maxAttrDepth = 32

// peek returns the next byte after white space, 0 at the end.
func (p *attrScanner) peek() byte {
	for p.i < len(p.s) {
		switch c := p.s[p.i]; c {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return c
		}
	}
	return 0
}

// next consumes c, the next byte after white space, if it is there.
func (p *attrScanner) next(c byte) bool {
	if !p.bad && p.peek() == c {
		p.i++
		return true
	}
	return false
}

// object reads an object, calling field with each key, positioned at
// its value, which field must read or skip. A value that is not an
// object is skipped.
func (p *attrScanner) object(field func(key string)) {
	if p.bad {
		return
	}
	if p.peek() != '{' {
		p.skip()
		return
	}
	if p.depth++; p.depth > maxAttrDepth {
		p.bad = true
		return
	}
	defer func() { p.depth-- }()
	p.i++
	if p.next('}') {
		return
	}
	for !p.bad {
		key, ok := p.string()
		if !ok || !p.next(':') {
			p.bad = true
			return
		}
		field(key)
		if p.next(',') {
			continue
		}
		if !p.next('}') {
			p.bad = true
		}
		return
	}
}

// array reads an array, calling elem at each element, which elem must
// read or skip. A value that is not an array is skipped.
func (p *attrScanner) array(elem func()) {
	if p.bad {
		return
	}
	if p.peek() != '[' {
		p.skip()
		return
	}
	if p.depth++; p.depth > maxAttrDepth {
		p.bad = true
		return
	}
	defer func() { p.depth-- }()
	p.i++
	if p.next(']') {
		return
	}
	for !p.bad {
		elem()
		if p.next(',') {
			continue
		}
		if !p.next(']') {
			p.bad = true
		}
		return
	}
}

// decision reads a policy decision's outcome and explanation.
func (p *attrScanner) decision(d *decision) {
	p.object(func(key string) {
		switch key {
		case "outcome":
			d.Outcome = p.str()
		case "explanation":
			d.Explanation = p.str()
		default:
			p.skip()
		}
	})
}

// str reads a string; another value is skipped and read as "".
func (p *attrScanner) str() string {
	if p.bad {
		return ""
	}
	if p.peek() != '"' {
		p.skip()
		return ""
	}
	s, _ := p.string()
	return s
}

// string reads a string: ok is false, and the value is skipped, when it
// is not one.
func (p *attrScanner) string() (s string, ok bool) {
	if p.bad {
		return "", false
	}
	if p.peek() != '"' {
		p.skip()
		return "", false
	}
	start, escaped, ascii := p.i, false, true
	for p.i++; p.i < len(p.s); p.i++ {
		switch c := p.s[p.i]; {
		case c == '\\':
			escaped = true
			p.i++
		case c >= utf8.RuneSelf:
			ascii = false
		case c == '"':
			p.i++
			if s = p.s[start+1 : p.i-1]; !escaped && (ascii || utf8.ValidString(s)) {
				return s, true
			}
			// Escapes, or bytes that are not UTF-8 (which protobuf's
			// strings must be): decoded as encoding/json does.
			return p.decoded(p.s[start:p.i])
		}
	}
	p.bad = true
	return "", false
}

// decoded returns JSON string q decoded, as encoding/json does; not
// inline in string, whose result would then be moved to the heap at
// every call.
func (p *attrScanner) decoded(q string) (string, bool) {
	var s string
	if json.Unmarshal([]byte(q), &s) != nil {
		p.bad = true
		return "", false
	}
	return s, true
}

// int reads an integer; another value is skipped and read as 0.
func (p *attrScanner) int() int {
	if p.bad {
		return 0
	}
	start := p.i
	p.skip()
	n, err := strconv.Atoi(strings.TrimSpace(p.s[start:p.i]))
	if err != nil {
		return 0
	}
	return n
}

// float reads a number; another value, or one out of float64's range,
// is skipped and read as 0.
func (p *attrScanner) float() float64 {
	if p.bad {
		return 0
	}
	start := p.i
	p.skip()
	f, err := strconv.ParseFloat(strings.TrimSpace(p.s[start:p.i]), 64)
	if err != nil {
		return 0
	}
	return f
}

// skip skips a value of any type.
func (p *attrScanner) skip() {
	if p.bad {
		return
	}
	switch p.peek() {
	case '{':
		p.object(func(string) { p.skip() })
	case '[':
		p.array(p.skip)
	case '"':
		p.string()
	case 0:
		p.bad = true
	default:
		// A number, true, false or null: up to the next delimiter.
		start := p.i
		for p.i < len(p.s) {
			c := p.s[p.i]
			if c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
				break
			}
			p.i++
		}
		if p.i == start {
			p.bad = true
		}
	}
}

// runInfo is what the mapping knows of a span's run.
type runInfo struct {
	run   keel.Run
	trace trace.TraceID
	// parent, when valid, is the parent of the run's root span in
	// another environment (a step handed to this one): a remote parent.
	parent trace.SpanID
}

// spanContent is what was said in a span, when it may be exported.
type spanContent struct {
	input, output string // gen_ai.input.messages, gen_ai.output.messages (JSON)
	args, result  string // gen_ai.tool.call.arguments, .result
	query, docs   string // gen_ai.retrieval.query.text, .documents (JSON)
}

// documentsJSON is gen_ai.retrieval.documents of hits: each one's ID
// (its citation: source, and lines where known) and score.
func documentsJSON(hits []retrievalHit) string {
	type doc struct {
		ID    string  `json:"id"`
		Score float64 `json:"score"`
	}
	docs := make([]doc, len(hits))
	for i, h := range hits {
		docs[i] = doc{ID: h.Source, Score: h.Score}
		if h.Lines != "" {
			docs[i].ID += ":" + h.Lines
		}
	}
	b, err := json.Marshal(docs)
	if err != nil {
		return ""
	}
	return string(b)
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
