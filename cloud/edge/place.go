package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud/route"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/nats-io/nats.go"
)

// A joined daemon's plans hand steps to other edges by themselves: the
// engine asks a Placer (engine.Placer, which Placer implements over root
// types only) when a step needs a tool the daemon lacks; the Placer
// decides over the edges' declarations, offers the step to the edge
// chosen (Offer, the same request/reply as Handoff), follows the run in
// that edge's mirror (Await) and asks that edge for the run's spans
// (SpansSubject), which cross as the run's journal did.

// SpansSubject is where edge answers for the spans of a run of its own
// (request/reply, SpansRequest → SpansReply).
func SpansSubject(ns, edge string) string { return ns + ".edge." + edge + ".spans" }

// SpansRequest asks an edge for the spans of one of its runs.
type SpansRequest struct {
	Run keel.RunID `json:"run"`
	// ParentSpan is the span of the asker's trace that the run's root
	// span goes under.
	ParentSpan string `json:"parent_span,omitempty"`
	// Origin, when set, is the edge that asks (AskSubject): the edge
	// answers an edge only for a run of a step that edge handed it.
	Origin string `json:"origin,omitempty"`
}

// SpansReply is an edge's answer to a SpansRequest.
type SpansReply struct {
	Spans []keel.Span `json:"spans,omitempty"`
	// Withheld: the run's journal did not cross whole (its labels), so
	// its spans do not either; Spans holds one stub, the root's timing.
	Withheld bool   `json:"withheld,omitempty"`
	Error    string `json:"error,omitempty"`
	// Tokens and CostUSD are what the run's model calls spent, withheld
	// or not: the origin counts them in its run's budget.
	Tokens  int64   `json:"tokens,omitempty"`
	CostUSD float64 `json:"cost_usd,omitempty"`
}

// spentBy is what the model call spans of spans spent.
func spentBy(spans []keel.Span) (tok int64, usd float64) {
	for _, sp := range spans {
		if sp.Kind == keel.SpanModelCall {
			tok += int64(sp.PromptTokens + sp.CompletionTokens)
			usd += sp.CostUSD
		}
	}
	return tok, usd
}

// serveSpans answers a SpansRequest: the run's spans if its journal
// crossed whole, else a stub of its root span. What crossed is read
// from the outbox, after the events taken so far are in it: the run's
// last event there is whole or a stub.
func (e *Edge) serveSpans(m *nats.Msg) {
	reply := func(r SpansReply) {
		b, _ := json.Marshal(r)
		m.Respond(b)
	}
	var req SpansRequest
	if err := json.Unmarshal(m.Data, &req); err != nil || req.Run == "" {
		reply(SpansReply{Error: "not a spans request"})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if asker, ok := askerOf(m, SpansSubject(e.cfg.Namespace, e.cfg.Name)); ok && e.src.Offers != nil {
		// An edge is given the spans of the runs of its own steps only.
		if off, err := e.src.Offers.StepOfferOf(ctx, req.Run); err != nil || off.Origin != asker {
			reply(SpansReply{Error: fmt.Sprintf("run %s is not a step %s handed to %s", req.Run, asker, e.cfg.Name)})
			return
		}
	}
	spans, err := e.src.Spans(ctx, req.Run)
	if err != nil {
		reply(SpansReply{Error: err.Error()})
		return
	}
	for i := range spans {
		if spans[i].ParentID == "" {
			spans[i].ParentID = req.ParentSpan
		}
	}
	tok, usd := spentBy(spans)
	if e.crossed(ctx, req.Run) {
		reply(SpansReply{Spans: spans, Tokens: tok, CostUSD: usd})
		return
	}
	out := SpansReply{Withheld: true, Tokens: tok, CostUSD: usd}
	for _, sp := range spans {
		if sp.Kind == keel.SpanRun {
			out.Spans = []keel.Span{{ID: sp.ID, RunID: sp.RunID, ParentID: sp.ParentID, Kind: keel.SpanRun, Name: "withheld",
				Start: sp.Start, Duration: sp.Duration, Status: sp.Status}}
			break
		}
	}
	reply(out)
}

// crossed reports whether run's last event in the outbox crossed whole.
func (e *Edge) crossed(ctx context.Context, run keel.RunID) bool {
	if err := e.Flush(ctx); err != nil {
		return false
	}
	st, err := e.local.Stream(ctx, OutboxStream)
	if err != nil {
		return false
	}
	msg, err := st.GetLastMsgForSubject(ctx, outboxSubject+string(run))
	if err != nil {
		return false
	}
	var ev keel.Event
	var w Withheld
	if json.Unmarshal(msg.Data, &ev) != nil || json.Unmarshal(ev.Data, &w) != nil {
		return false
	}
	return !w.Withheld
}

// Placer places a joined daemon's plan steps on the other edges that
// declare what they need: it implements engine.Placer. Its methods are
// safe for concurrent use; Close stops its watch of the declarations.
type Placer struct {
	e *Edge

	mu     sync.Mutex
	reg    *Registry
	closed bool
}

// NewPlacer returns the Placer of e's steps. It watches the cloud's
// edges bucket from its first decision on (the link may be down until
// then).
func NewPlacer(e *Edge) *Placer { return &Placer{e: e} }

// registry returns the watch of the declarations, made on first use.
func (p *Placer) registry(ctx context.Context) (*Registry, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("edge: the placer is closed")
	}
	if p.reg == nil {
		// The link may be coming up: no responder yet is tried again,
		// for a few seconds.
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for {
			reg, err := Watch(wctx, p.e.cloud, p.e.cfg.Namespace, p.e.log)
			if err == nil {
				p.reg = reg
				break
			}
			if !errors.Is(err, nats.ErrNoResponders) || !sleep(wctx, 100*time.Millisecond) {
				return nil, fmt.Errorf("the cloud's declarations (is the link up?): %w", err)
			}
		}
	}
	return p.reg, nil
}

// Place decides which other edge runs a step with need: route.Decide
// over the declarations, this edge the origin, edges only (the cloud
// takes no hand-off from an edge yet).
func (p *Placer) Place(ctx context.Context, need keel.StepNeed) (keel.Placement, error) {
	reg, err := p.registry(ctx)
	if err != nil {
		return keel.Placement{}, err
	}
	d, err := reg.Table.Decide(route.Need{Tools: need.Tools, Model: need.Model, Labels: need.Labels, Origin: p.e.cfg.Name, Kind: route.KindEdge})
	if err != nil {
		return keel.Placement{}, err
	}
	if d.Env == p.e.cfg.Name {
		return keel.Placement{}, fmt.Errorf("%w: only %s declares what it needs, and it does not run it now", route.ErrNoEnvironment, d.Env)
	}
	return keel.Placement{Env: d.Env, Kind: d.Kind, Reason: d.Reason}, nil
}

// offerTimeout bounds one offer of a step: an answer lost leaves its
// outcome unknown, and the engine offers it again (the same run).
const offerTimeout = 30 * time.Second

// HandOff offers the step to edge env (Offer) and returns its run there.
// A refusal, or no edge listening, wraps keel.ErrUnavailable.
func (p *Placer) HandOff(ctx context.Context, env string, h keel.HandOff) (keel.RunID, error) {
	step := Step{ID: string(h.Key), Goal: h.Goal, Model: h.Model, MaxSteps: h.MaxSteps, Tools: h.Tools,
		Need:        route.Need{Tools: h.Need.Tools, Model: h.Need.Model, Labels: h.Need.Labels, Origin: p.e.cfg.Name},
		TraceParent: h.TraceParent, ParentSpan: h.ParentSpan}
	octx, cancel := context.WithTimeout(ctx, offerTimeout)
	defer cancel()
	a, err := Offer(octx, p.e.nc, p.e.cfg.Namespace, env, step)
	if errors.Is(err, ErrRefused) || errors.Is(err, nats.ErrNoResponders) {
		return "", fmt.Errorf("%w: %w", keel.ErrUnavailable, err)
	}
	if err != nil {
		return "", err
	}
	return a.RunID, nil
}

// Await follows run in env's mirror until it ends (Await), then asks env
// for its spans, under parentSpan. Spans that do not come are logged and
// left out: the step's outcome does not wait on its trace.
func (p *Placer) Await(ctx context.Context, env string, run keel.RunID, parentSpan string) (keel.StepOutcome, error) {
	c, err := Await(ctx, p.e.cloud, p.e.cfg.Namespace, env, run)
	if err != nil {
		return keel.StepOutcome{}, err
	}
	o := keel.StepOutcome{Status: c.Status, Result: c.Result, Error: c.Error, Withheld: c.Withheld, Labels: c.Labels}
	r, err := RemoteSpans(ctx, p.e.nc, p.e.cfg.Namespace, env, SpansRequest{Run: run, ParentSpan: parentSpan, Origin: p.e.cfg.Name})
	if err != nil {
		p.e.log.Warn("edge: the spans of a step run elsewhere", logkey.Edge, env, logkey.Run, run, logkey.Err, err)
	}
	o.Spans, o.Tokens, o.CostUSD = r.Spans, r.Tokens, r.CostUSD
	return o, nil
}

// RemoteSpans asks edge for the spans of one of its runs, and what they
// spent.
func RemoteSpans(ctx context.Context, nc *nats.Conn, ns, edge string, req SpansRequest) (SpansReply, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return SpansReply{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(rctx, AskSubject(SpansSubject(ns, edge), req.Origin), b)
	if err != nil {
		return SpansReply{}, err
	}
	var r SpansReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return SpansReply{}, err
	}
	if r.Error != "" {
		return SpansReply{}, errors.New(r.Error)
	}
	return r, nil
}

// Close stops the watch of the declarations.
func (p *Placer) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.reg != nil {
		p.reg.Close()
		p.reg = nil
	}
}
