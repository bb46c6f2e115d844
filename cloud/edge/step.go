package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud/route"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Step is a step the cloud hands an environment: a run of its own there.
type Step struct {
	// ID names the step; the run it becomes on an edge has the
	// idempotency key "step-ID", so a step handed off twice runs once.
	ID       string `json:"id"`
	Goal     string `json:"goal"`
	Model    string `json:"model,omitempty"`
	MaxSteps int    `json:"max_steps,omitempty"`
	// Tools is the subset of tools the run may call; nil: every tool.
	Tools []string `json:"tools,omitempty"`
	// Need is what the step needs (route.Decide); its Labels are the
	// labels of the step's inputs, which the run starts with.
	Need route.Need `json:"need"`
	// TraceParent is the W3C trace context of the hand-off, and
	// ParentSpan the keel ID of the hand-off span in the origin's trace:
	// the run's spans, as they cross back (Spans), go under it.
	TraceParent string `json:"traceparent,omitempty"`
	ParentSpan  string `json:"parent_span,omitempty"`
}

// Accepted is an edge's answer to a step handed to it.
type Accepted struct {
	Edge  string     `json:"edge"`
	RunID keel.RunID `json:"run_id,omitempty"`
	// Error, when set, is why the edge refused the step.
	Error string `json:"error,omitempty"`
}

// Completion is how a step handed off ended, as the cloud sees it: what
// crossed back from the edge's journal.
type Completion struct {
	Edge   string         `json:"edge"`
	RunID  keel.RunID     `json:"run_id"`
	Status keel.RunStatus `json:"status"`
	// Result is the run's result, when it crossed.
	Result string `json:"result,omitempty"`
	// Error is why it failed, when it crossed.
	Error string `json:"error,omitempty"`
	// Withheld: the run's data may not cross (its labels); the cloud
	// knows how it ended, not what it found.
	Withheld bool `json:"withheld,omitempty"`
	// Labels are the labels of the run's events that crossed (those its
	// edge lets cross): its result carries them.
	Labels []string `json:"labels,omitempty"`
}

// The cross-environment events of a step, in the hand-off stream
// (docs/protocol.md, "Cross-environment events").
const (
	EventHandedOff          = "step.handed_off"          // data: HandedOffData
	EventAccepted           = "step.accepted"            // data: Accepted
	EventCompletedElsewhere = "step.completed_elsewhere" // data: Completion
)

// HandoffEvent is one entry of the hand-off stream.
type HandoffEvent struct {
	Step string          `json:"step"`
	Type string          `json:"type"`
	Time time.Time       `json:"time"`
	Data json.RawMessage `json:"data"`
}

// HandedOffData is the data of step.handed_off: the decision and what it
// was made for.
type HandedOffData struct {
	Decision route.Decision `json:"decision"`
	Need     route.Need     `json:"need"`
}

// Offers keeps the steps handed to an edge beside the runs that carry
// them out (the daemon's store, store.Store's methods): who offered each,
// so that only its origin may cancel its run, after a restart too.
type Offers interface {
	// OfferStep records offer as the offer of the step whose run has
	// idempotency key offer.Key, unless one is recorded, and returns the
	// offer as recorded (the first one's origin and trace context).
	OfferStep(ctx context.Context, offer keel.StepOffer) (keel.StepOffer, error)
	// CancelStepOffer records that origin cancelled the step of key, if
	// it is the step's origin or none is recorded (origin becomes it),
	// and returns the offer as recorded.
	CancelStepOffer(ctx context.Context, key, origin string) (keel.StepOffer, error)
	// StepOfferOf returns the offer of the step run carries out, or an
	// error wrapping keel.ErrNotFound.
	StepOfferOf(ctx context.Context, run keel.RunID) (keel.StepOffer, error)
}

// serveStep answers a step handed to this edge: it records the offer
// (its origin), starts the run and replies with its ID.
func (e *Edge) serveStep(m *nats.Msg) {
	reply := func(a Accepted) {
		a.Edge = e.cfg.Name
		b, _ := json.Marshal(a)
		m.Respond(b)
	}
	var s Step
	if err := json.Unmarshal(m.Data, &s); err != nil || s.ID == "" {
		reply(Accepted{Error: "not a step"})
		return
	}
	if asker, ok := askerOf(m, StepSubject(e.cfg.Namespace, e.cfg.Name)); ok {
		s.Need.Origin = asker // an edge hands off as itself
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "step-" + s.ID
	// The offer is kept before the run starts: a run of a step is never
	// without its origin. A cancel of the key waits for the start, and
	// an offer after the cancel starts nothing.
	e.offerMu.Lock()
	defer e.offerMu.Unlock()
	off, err := e.src.Offers.OfferStep(ctx, keel.StepOffer{Key: key, Origin: s.Need.Origin, TraceParent: s.TraceParent})
	if err != nil {
		e.log.Warn("edge: keep a step's offer", logkey.Step, s.ID, logkey.Err, err)
		reply(Accepted{Error: "the step's offer could not be kept"})
		return
	}
	if off.Cancelled {
		reply(Accepted{Error: "the step was cancelled by its origin"})
		return
	}
	req := keel.StartRequest{Goal: s.Goal, Model: s.Model, MaxSteps: s.MaxSteps, IdempotencyKey: key,
		Policy: keel.RunPolicy{Labels: s.Need.Labels, Tools: s.Tools}}
	run, err := e.src.Start(ctx, req)
	if err != nil {
		reply(Accepted{Error: err.Error()})
		return
	}
	e.mu.Lock()
	if e.steps == nil {
		e.steps = map[keel.RunID]bool{}
	}
	if !e.steps[run.ID] && !run.Status.Terminal() {
		e.steps[run.ID] = true
		e.load.Add(1)
	}
	e.mu.Unlock()
	reply(Accepted{RunID: run.ID})
}

// stepEnded counts a handed-off run that ended out of the edge's load.
func (e *Edge) stepEnded(id keel.RunID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.steps[id] {
		delete(e.steps, id)
		e.load.Add(-1)
	}
}

// ErrRefused is wrapped by the error of a step an edge refused.
var ErrRefused = errors.New("the edge refused the step")

// Handoff hands step to the edge dec names and waits for its run to end:
// it journals step.handed_off, asks the edge (request/reply on its step
// subject, through its leaf link), journals step.accepted, follows the
// run in the edge's mirror, and journals step.completed_elsewhere with
// what crossed back. A Decision of the cloud is not for Handoff (the
// cloud's steps go to its work queue).
func Handoff(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, ns string, dec route.Decision, step Step) (Completion, error) {
	if dec.Kind != route.KindEdge {
		return Completion{}, fmt.Errorf("hand-off to %s: not an edge", dec.Env)
	}
	if err := journal(ctx, js, ns, step.ID, EventHandedOff, HandedOffData{Decision: dec, Need: step.Need}); err != nil {
		return Completion{}, err
	}
	a, err := Offer(ctx, nc, ns, dec.Env, step)
	if err != nil {
		return Completion{}, err
	}
	if err := journal(ctx, js, ns, step.ID, EventAccepted, a); err != nil {
		return Completion{}, err
	}
	c, err := Await(ctx, js, ns, a.Edge, a.RunID)
	if err != nil {
		return c, err
	}
	return c, journal(ctx, js, ns, step.ID, EventCompletedElsewhere, c)
}

// Offer hands step to edge and returns its answer: the run it started.
// It asks under the name of step.Need.Origin (AskSubject): an edge's
// credentials let it offer steps as itself only.
func Offer(ctx context.Context, nc *nats.Conn, ns, edge string, step Step) (Accepted, error) {
	b, err := json.Marshal(step)
	if err != nil {
		return Accepted{}, err
	}
	m, err := nc.RequestWithContext(ctx, AskSubject(StepSubject(ns, edge), step.Need.Origin), b)
	if err != nil {
		return Accepted{}, fmt.Errorf("hand-off to %s: %w", edge, err)
	}
	var a Accepted
	if err := json.Unmarshal(m.Data, &a); err != nil {
		return Accepted{}, fmt.Errorf("hand-off to %s: %w", edge, err)
	}
	if a.Error != "" || a.RunID == "" {
		return a, fmt.Errorf("%w: %s: %s", ErrRefused, edge, a.Error)
	}
	return a, nil
}

// Await follows run in edge's mirror until it ends, and returns how, as
// far as it crossed.
func Await(ctx context.Context, js jetstream.JetStream, ns, edge string, run keel.RunID) (Completion, error) {
	c := Completion{Edge: edge, RunID: run}
	err := Follow(ctx, js, ns, edge, run, func(ev keel.Event) bool {
		var el eventLabels
		if json.Unmarshal(ev.Data, &el) == nil {
			c.Labels = keel.UnionLabels(c.Labels, el.Labels)
			if el.Private {
				c.Labels = keel.UnionLabels(c.Labels, []string{keel.LabelPrivate})
			}
		}
		if !terminal(ev.Type) {
			return true
		}
		var end keel.RunEndData
		var w Withheld
		json.Unmarshal(ev.Data, &end)
		json.Unmarshal(ev.Data, &w)
		c.Status, c.Result, c.Error, c.Withheld = end.Status, end.Result, end.Reason, w.Withheld
		return false
	})
	return c, err
}

// Follow calls fn with each event of run in edge's mirror, in order,
// waiting for more, until fn returns false or ctx ends. It waits for the
// mirror to exist.
func Follow(ctx context.Context, js jetstream.JetStream, ns, edge string, run keel.RunID, fn func(keel.Event) bool) error {
	var cons jetstream.Consumer
	for {
		var err error
		cons, err = js.OrderedConsumer(ctx, MirrorName(ns, edge), jetstream.OrderedConsumerConfig{FilterSubjects: []string{outboxSubject + string(run)}})
		if err == nil {
			break
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("mirror of %s: %w", edge, err)
		}
		if !sleep(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		var ev keel.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			return fmt.Errorf("mirror of %s: %w", edge, err)
		}
		if !fn(ev) {
			return nil
		}
	}
}

// journal appends one cross-environment event of step to the hand-off
// stream.
func journal(ctx context.Context, js jetstream.JetStream, ns, step, typ string, data any) error {
	d, err := json.Marshal(data)
	if err != nil {
		return err
	}
	b, err := json.Marshal(HandoffEvent{Step: step, Type: typ, Time: time.Now().UTC(), Data: d})
	if err != nil {
		return err
	}
	if _, err := js.Publish(ctx, ns+".handoff."+step, b); err != nil {
		return fmt.Errorf("hand-off stream: %w", err)
	}
	return nil
}

// Handoffs reads the cross-environment events of step, in order.
func Handoffs(ctx context.Context, js jetstream.JetStream, ns, step string) ([]HandoffEvent, error) {
	// A request of the read (the consumer's creation, its info, a fetch)
	// finds no responder while the stream or the cluster's meta group has
	// no leader (an election under way, a node going down): the whole read
	// is made again until ctx ends.
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		out, err := readHandoffs(ctx, js, ns, step)
		if err == nil {
			return out, nil
		}
		if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, jetstream.ErrNoStreamResponse) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read the hand-off events of step %s: %w (%w)", step, ctx.Err(), err)
		case <-time.After(delay):
		}
	}
}

// readHandoffs reads step's hand-off events once, through an ordered
// consumer of their subject.
func readHandoffs(ctx context.Context, js jetstream.JetStream, ns, step string) ([]HandoffEvent, error) {
	cons, err := js.OrderedConsumer(ctx, HandoffStream(ns), jetstream.OrderedConsumerConfig{FilterSubjects: []string{ns + ".handoff." + step}})
	if err != nil {
		return nil, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []HandoffEvent
	for range info.NumPending {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			return nil, err
		}
		var ev HandoffEvent
		if json.Unmarshal(m.Data(), &ev) == nil {
			out = append(out, ev)
		}
	}
	return out, nil
}
