package recall

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/knowledge"
	"github.com/keel-runtime/keel/policy"
)

// ToolName is the built-in tool's name. An installed tool of the same
// name is shadowed by it.
const ToolName = "knowledge_search"

// Limits of a call.
const (
	// DefaultLimit is how many hits a call asks for unless it says.
	DefaultLimit = 5
	// MaxLimit is the most hits a call may ask for.
	MaxLimit = 20
	// DefaultMaxOutputBytes bounds a call's output unless configured:
	// about 2,000 tokens.
	DefaultMaxOutputBytes = 8 << 10
)

// Tracer records spans in runs' traces (engine.Tracer's methods).
type Tracer interface {
	StartSpan(ctx context.Context, sp keel.Span) error
	FinishSpan(ctx context.Context, sp keel.Span) error
}

// Config configures a Tool. Index, Runs and Policy are required.
type Config struct {
	Index *knowledge.Index
	// Runs returns a run (its workspace, its own rules): the store's.
	Runs func(ctx context.Context, id keel.RunID) (keel.Run, error)
	// Policy returns the policy run's calls are decided by now
	// (engine.Engine.PolicyOf); nil: none, and only the built-in rules
	// decide (a run reads its own scopes).
	Policy func(run keel.Run) (*policy.Policy, uint64)
	// Tracer, when set, records each call's retrieval span.
	Tracer Tracer
	// Interceptors see every call, as the tool runtime's calls (the
	// audit trail).
	Interceptors intercept.Tools
	// MaxOutputBytes bounds a call's output; default
	// DefaultMaxOutputBytes. Hits that do not fit are left out, the best
	// kept.
	MaxOutputBytes int
	// Now is the clock of spans; default time.Now.
	Now func() time.Time
	// Logger; default discards.
	Logger *slog.Logger
}

// Tool is the knowledge_search tool. Safe for concurrent use.
type Tool struct {
	cfg Config
	log *slog.Logger
}

// NewTool returns the tool.
func NewTool(cfg Config) (*Tool, error) {
	if cfg.Index == nil || cfg.Runs == nil || cfg.Policy == nil {
		return nil, errors.New("recall: Index, Runs and Policy are required")
	}
	if cfg.MaxOutputBytes <= 0 {
		cfg.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Tool{cfg: cfg, log: log}, nil
}

var inputSchema = json.RawMessage(`{"type":"object","properties":{` +
	`"query":{"type":"string","minLength":1,"description":"what to look for: words the text holds, or a question"},` +
	`"scope":{"type":"string","description":"one knowledge scope to search (user, workspace:ROOT, run:ID); default: every scope this run may read"},` +
	`"limit":{"type":"integer","minimum":1,"maximum":20,"description":"how many hits, best first (default 5)"},` +
	`"path_prefix":{"type":"string","description":"only documents whose source starts with this"}` +
	`},"required":["query"],"additionalProperties":false}`)

var outputSchema = json.RawMessage(`{"type":"object","properties":{` +
	`"query":{"type":"string"},"scopes":{"type":"array","items":{"type":"string"}},"note":{"type":"string"},` +
	`"hits":{"type":"array","items":{"type":"object","properties":{"n":{"type":"integer"},"cite":{"type":"string"},` +
	`"scope":{"type":"string"},"score":{"type":"number"},"heading":{"type":"string"},"text":{"type":"string"}}}}}}`)

// Spec is the tool's spec: read-only (a search changes nothing, and may
// run again after a crash).
func (t *Tool) Spec() keel.ToolSpec {
	return keel.ToolSpec{Name: ToolName, Version: keel.Version, SideEffects: keel.SideEffectReadOnly,
		Description: "Search the user's indexed notes, documents and code (keel's knowledge store) and return the passages that match, " +
			"best first, each cited as [n] source:lines. Cite the hits you use as [n] in your answer.",
		InputSchema: inputSchema, OutputSchema: outputSchema}
}

// args are a call's arguments.
type args struct {
	Query      string `json:"query"`
	Scope      string `json:"scope"`
	Limit      int    `json:"limit"`
	PathPrefix string `json:"path_prefix"`
}

func invalid(format string, a ...any) *keel.ToolError {
	return &keel.ToolError{Code: keel.ToolInvalidInput, Message: fmt.Sprintf(format, a...)}
}

func parseArgs(raw json.RawMessage) (args, *keel.ToolError) {
	var a args
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return a, invalid("want an object with query (and optionally scope, limit, path_prefix): %v", err)
	}
	a.Query = strings.TrimSpace(a.Query)
	switch {
	case a.Query == "":
		return a, &keel.ToolError{Code: keel.ToolInvalidInput, Message: "query must not be empty", Path: "/query"}
	case a.Limit < 0 || a.Limit > MaxLimit:
		return a, &keel.ToolError{Code: keel.ToolInvalidInput, Message: fmt.Sprintf("limit must be between 1 and %d", MaxLimit), Path: "/limit"}
	}
	if a.Limit == 0 {
		a.Limit = DefaultLimit
	}
	return a, nil
}

// Readable returns the scopes run may read now, of those the store
// holds and run's own, sorted, with the policy that decided.
func (t *Tool) Readable(ctx context.Context, run keel.Run) ([]knowledge.Scope, *policy.Policy, error) {
	p, _ := t.cfg.Policy(run)
	occupied, err := t.cfg.Index.Occupied(ctx)
	if err != nil {
		return nil, p, err
	}
	var out []knowledge.Scope
	for _, s := range occupied {
		if decide(p, run, s).Outcome == policy.Allow {
			out = append(out, s)
		}
	}
	return out, p, nil
}

// Offers reports whether run is offered the tool: whether it may read a
// scope that holds something (engine.Offerer). Other names: true.
func (t *Tool) Offers(ctx context.Context, run keel.Run, name string) bool {
	if name != ToolName {
		return true
	}
	scopes, _, err := t.Readable(ctx, run)
	if err != nil {
		t.log.Warn("knowledge: list the scopes a run may read", logkey.Run, run.ID, logkey.Err, err)
		return false
	}
	return len(scopes) > 0
}

// Call searches for a run (inv.Run), between the interceptors. It fails
// with a *keel.ToolError: invalid_input (bad arguments, a malformed
// scope), policy_denied (the scope asked for, or every scope, is not the
// run's to read; the message is the policy's explanation), tool_error
// (the store failed). Its output's labels (inv.Touched) are its hits'.
func (t *Tool) Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	if inv.Touched != nil {
		*inv.Touched = keel.Touched{}
	}
	o := t.cfg.Interceptors.Call(ctx, inv, func(ctx context.Context) intercept.ToolOutcome {
		out, scopes, err := t.call(ctx, inv)
		grants := make([]string, len(scopes))
		for i, s := range scopes {
			grants[i] = "knowledge:" + string(s)
		}
		return intercept.ToolOutcome{Output: out, Err: err, Build: intercept.ToolBuild{Version: keel.Version, Grants: grants}}
	})
	if o.Err != nil {
		return nil, o.Err
	}
	return o.Output, nil
}

// call is Call's work: the output, the scopes searched and the error.
func (t *Tool) call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, []knowledge.Scope, *keel.ToolError) {
	a, te := parseArgs(inv.Args)
	if te != nil {
		return nil, nil, te
	}
	if inv.Run == "" {
		return nil, nil, &keel.ToolError{Code: keel.ToolPermissionDenied, Message: ToolName + " searches for a run: a direct call has no run to decide its scopes (use knowledge.search)"}
	}
	run, err := t.cfg.Runs(ctx, inv.Run)
	if err != nil {
		return nil, nil, &keel.ToolError{Code: keel.ToolFailed, Message: fmt.Sprintf("read run %s: %v", inv.Run, err)}
	}
	var scopes []knowledge.Scope
	var p *policy.Policy
	if a.Scope != "" {
		s, err := knowledge.ParseScope(a.Scope)
		if err != nil {
			return nil, nil, &keel.ToolError{Code: keel.ToolInvalidInput, Message: fmt.Sprintf("scope %q: want user, workspace:ROOT or run:ID", a.Scope), Path: "/scope"}
		}
		p, _ = t.cfg.Policy(run)
		if d := decide(p, run, s); d.Outcome != policy.Allow {
			// ask counts as deny: a search cannot wait for a person.
			return nil, nil, &keel.ToolError{Code: keel.ToolPolicyDenied, Message: fmt.Sprintf("the policy does not let this run read knowledge scope %s: %s", s, d)}
		}
		scopes = []knowledge.Scope{s}
	} else {
		if scopes, p, err = t.Readable(ctx, run); err != nil {
			return nil, nil, &keel.ToolError{Code: keel.ToolFailed, Message: fmt.Sprintf("list the knowledge scopes: %v", err)}
		}
		if len(scopes) == 0 {
			return nil, nil, &keel.ToolError{Code: keel.ToolPolicyDenied, Message: "this run may read no knowledge scope that holds anything: " +
				"a run reads its workspace's and its own scopes, and others where a knowledge rule of the policy allows them"}
		}
	}
	sp := t.startSpan(ctx, inv, a, scopes)
	start := t.cfg.Now()
	hits, err := t.cfg.Index.Search(ctx, knowledge.Query{Text: a.Query, Scopes: scopes, PathPrefix: a.PathPrefix, Limit: a.Limit})
	if err != nil {
		te := &keel.ToolError{Code: keel.ToolFailed, Message: fmt.Sprintf("search: %v", err)}
		t.finishSpan(ctx, sp, inv.CallID, start, a, scopes, nil, 0, nil, te)
		return nil, scopes, te
	}
	out, shown := render(a.Query, scopes, hits, t.cfg.MaxOutputBytes)
	if inv.Touched != nil {
		*inv.Touched = touched(p, hits[:shown])
	}
	t.finishSpan(ctx, sp, inv.CallID, start, a, scopes, hits, shown, hitLabels(p, hits), nil)
	return out, scopes, nil
}

// touched is what a call that returned hits read: the files among their
// sources (the policy's path sources label them), and the labels of
// their scopes and of the policy's sources of those scopes.
func touched(p *policy.Policy, hits []knowledge.Hit) keel.Touched {
	var tc keel.Touched
	ls := policy.LabelSet{}
	for _, h := range hits {
		for _, l := range h.Labels {
			if pl, err := policy.ParseLabel(l); err == nil {
				ls = ls.Union(policy.Labels(pl))
			}
		}
		ls = ls.Union(scopeLabels(p, h.Scope))
		if filepath.IsAbs(h.Source) && !slices.Contains(tc.Paths, h.Source) && len(tc.Paths) < keel.MaxTouchedPaths {
			tc.Paths = append(tc.Paths, h.Source)
		} else if filepath.IsAbs(h.Source) && !slices.Contains(tc.Paths, h.Source) {
			tc.Truncated = true
		}
	}
	for _, l := range ls.Slice() {
		tc.Labels = append(tc.Labels, string(l))
	}
	return tc
}

// hitLabels are the labels of every hit: touched's, and the policy's
// path sources' for the files among their sources.
func hitLabels(p *policy.Policy, hits []knowledge.Hit) []string {
	tc := touched(p, hits)
	ls := policy.LabelSet{}
	for _, l := range tc.Labels {
		if pl, err := policy.ParseLabel(l); err == nil {
			ls = ls.Union(policy.Labels(pl))
		}
	}
	if p != nil {
		for _, path := range tc.Paths {
			ls = ls.Union(p.LabelsOf(policy.Source{Kind: policy.SourcePath, Name: path}))
		}
		if tc.Truncated {
			ls = ls.Union(p.PathLabels())
		}
	}
	var out []string
	for _, l := range ls.Slice() {
		out = append(out, string(l))
	}
	return out
}

// Cite is how hit number n is cited: "[n] source:start-end".
func Cite(n int, h knowledge.Hit) string {
	switch {
	case h.StartLine <= 0:
		return fmt.Sprintf("[%d] %s", n, h.Source)
	case h.EndLine <= h.StartLine:
		return fmt.Sprintf("[%d] %s:%d", n, h.Source, h.StartLine)
	}
	return fmt.Sprintf("[%d] %s:%d-%d", n, h.Source, h.StartLine, h.EndLine)
}

// outHit is one hit of the output.
type outHit struct {
	N       int     `json:"n"`
	Cite    string  `json:"cite"`
	Scope   string  `json:"scope"`
	Score   float64 `json:"score"`
	Heading string  `json:"heading,omitempty"`
	Text    string  `json:"text"`
}

const citeNote = "Each hit is cited [n] source:lines, best first. Refer to the hits you use by their [n] in your answer."

// render writes the output: the query, the scopes and a note on one
// line, then one hit a line, best first, as many as fit in max bytes
// (the first always, its text cut to fit). It returns the output and
// how many hits it holds.
func render(query string, scopes []knowledge.Scope, hits []knowledge.Hit, limit int) (json.RawMessage, int) {
	var b bytes.Buffer
	head, _ := json.Marshal(struct {
		Query  string            `json:"query"`
		Scopes []knowledge.Scope `json:"scopes"`
		Note   string            `json:"note"`
	}{query, scopes, citeNote})
	b.Write(head[:len(head)-1])
	if len(hits) == 0 {
		b.WriteString(`,"hits":[]}`)
		return b.Bytes(), 0
	}
	b.WriteString(`,"hits":[` + "\n")
	shown := 0
	for i, h := range hits {
		oh := outHit{N: i + 1, Cite: Cite(i+1, h), Scope: string(h.Scope), Score: h.Score, Heading: h.Heading, Text: h.Text}
		line, _ := json.Marshal(oh)
		if b.Len()+len(line)+4 > limit {
			if i > 0 {
				break
			}
			// The best hit is shown, its text cut to what fits.
			over := b.Len() + len(line) + 4 - limit
			keep := max(0, len(oh.Text)-over-16)
			for keep > 0 && !utf8.RuneStart(oh.Text[keep]) {
				keep--
			}
			oh.Text = oh.Text[:keep] + " …"
			line, _ = json.Marshal(oh)
		}
		if i > 0 {
			b.WriteString(",\n")
		}
		b.Write(line)
		shown++
	}
	b.WriteString("\n]}")
	return b.Bytes(), shown
}

// retrievalHit is one hit on the retrieval span.
type retrievalHit struct {
	N          int     `json:"n"`
	Source     string  `json:"source"`
	Lines      string  `json:"lines,omitempty"`
	Scope      string  `json:"scope"`
	Score      float64 `json:"score"`
	BM25Rank   int     `json:"bm25_rank,omitempty"`
	VectorRank int     `json:"vector_rank,omitempty"`
	Shown      bool    `json:"shown"` // in the output (else left out by its size bound)
}

// RetrievalAttrs are the attributes of a retrieval span.
type RetrievalAttrs struct {
	Query      string         `json:"query"`
	Scopes     []string       `json:"scopes"`
	PathPrefix string         `json:"path_prefix,omitempty"`
	Limit      int            `json:"limit"`
	Hits       []retrievalHit `json:"hits"`
	CallID     string         `json:"call_id,omitempty"`
	// Labels are the labels of every hit found (shown or not): its own,
	// its scope's and its file's by the policy. An export of the span
	// reads them: a labelled search's query and hits stay home.
	Labels []string `json:"labels,omitempty"`
}

func (t *Tool) startSpan(ctx context.Context, inv keel.ToolInvocation, a args, scopes []knowledge.Scope) *keel.Span {
	if t.cfg.Tracer == nil || inv.Run == "" {
		return nil
	}
	sp := keel.Span{ID: keel.NewSpanID(t.cfg.Now()), RunID: inv.Run, ParentID: inv.SpanID, Kind: keel.SpanRetrieval, Name: "knowledge", Step: inv.Step, Start: t.cfg.Now()}
	if err := t.cfg.Tracer.StartSpan(context.WithoutCancel(ctx), sp); err != nil {
		t.log.Warn("knowledge: start a retrieval span", logkey.Run, inv.Run, logkey.Err, err)
	}
	return &sp
}

func (t *Tool) finishSpan(ctx context.Context, sp *keel.Span, callID string, start time.Time, a args, scopes []knowledge.Scope, hits []knowledge.Hit, shown int, labels []string, te *keel.ToolError) {
	if sp == nil {
		return
	}
	sp.Duration, sp.Status = t.cfg.Now().Sub(start), keel.SpanOK
	if te != nil {
		sp.Status, sp.Error = keel.SpanError, te.Error()
	}
	at := RetrievalAttrs{Query: a.Query, PathPrefix: a.PathPrefix, Limit: a.Limit, Hits: []retrievalHit{}, CallID: callID, Labels: labels}
	for _, s := range scopes {
		at.Scopes = append(at.Scopes, string(s))
	}
	for i, h := range hits {
		rh := retrievalHit{N: i + 1, Source: h.Source, Scope: string(h.Scope), Score: h.Score, BM25Rank: h.BM25Rank, VectorRank: h.VectorRank, Shown: i < shown}
		if h.StartLine > 0 {
			rh.Lines = fmt.Sprintf("%d-%d", h.StartLine, max(h.StartLine, h.EndLine))
		}
		at.Hits = append(at.Hits, rh)
	}
	sp.Attrs, _ = json.Marshal(at)
	if err := t.cfg.Tracer.FinishSpan(context.WithoutCancel(ctx), *sp); err != nil {
		t.log.Warn("knowledge: finish a retrieval span", logkey.Run, sp.RunID, logkey.Err, err)
	}
}
