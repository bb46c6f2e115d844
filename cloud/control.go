package cloud

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud/jsstore"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// What a client asks of a run (Ask.Op). Cancel, pause, say and replay
// go to the worker that holds the run (its loop is there), or to any
// worker when none does; decide, approve and resume make the run go on,
// so they go through the work queue, and the worker that takes the item
// gives the answer under the run's lease and runs the run on.
const (
	opCancel  = "cancel"
	opPause   = "pause"
	opSay     = "say"
	opReplay  = "replay"
	opDecide  = "decide"
	opApprove = "approve"
	opResume  = "resume"
)

// Ask is a client's request about one run, as a worker receives it.
type Ask struct {
	Op  string     `json:"op"`
	Run keel.RunID `json:"run"`
	// decide
	CallID   string          `json:"call_id,omitempty"`
	Decision string          `json:"decision,omitempty"`
	Output   json.RawMessage `json:"output,omitempty"`
	Note     string          `json:"note,omitempty"`
	// approve
	Approval *keel.ApprovalData `json:"approval,omitempty"`
	// say
	Text   string   `json:"text,omitempty"`
	Labels []string `json:"labels,omitempty"`
}

// launches reports whether a's op can make the run go on: those are
// given only under the run's lease (through the work queue).
func (a Ask) launches() bool {
	return a.Op == opDecide || a.Op == opApprove || a.Op == opResume
}

// outcome is a worker's answer to an Ask.
type outcome struct {
	Run    *keel.Run         `json:"run,omitempty"`
	Replay *keel.ReplayCheck `json:"replay,omitempty"`
	Error  *wireError        `json:"error,omitempty"`
}

// wireError is an error as it crosses from a worker to a client: its
// kind (the keel sentinel it wraps) and its message.
type wireError struct {
	Kind    string                    `json:"kind"`
	Message string                    `json:"message"`
	Decided *keel.AlreadyDecidedError `json:"decided,omitempty"`
}

// kinds are the sentinels an error keeps across the wire.
var kinds = []struct {
	name string
	err  error
}{{"not_found", keel.ErrNotFound}, {"conflict", keel.ErrConflict}, {"invalid", keel.ErrInvalid},
	{"model_unavailable", keel.ErrModelUnavailable}, {"budget", ErrBudget}, {"unavailable", keel.ErrUnavailable}}

func toWire(err error) *wireError {
	if err == nil {
		return nil
	}
	w := &wireError{Kind: "internal", Message: err.Error()}
	if ad, ok := errors.AsType[*keel.AlreadyDecidedError](err); ok {
		w.Kind, w.Decided = "decided", ad
		return w
	}
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			w.Kind = k.name
			break
		}
	}
	return w
}

// remoteError is a worker's error on the client's side: it wraps the
// sentinel of its kind.
type remoteError struct {
	msg  string
	kind error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.kind }

func (w *wireError) err() error {
	if w == nil {
		return nil
	}
	if w.Kind == "decided" && w.Decided != nil {
		return w.Decided
	}
	for _, k := range kinds {
		if k.name == w.Kind {
			return &remoteError{msg: w.Message, kind: k.err}
		}
	}
	return errors.New(w.Message)
}

// ctlAny is the subject any worker of a namespace answers (one of
// them: a queue group); ctlWorker the one worker name answers.
func ctlAny(ns string) string { return ns + ".ctl.any" }

func ctlWorker(ns, name string) string {
	sum := sha256.Sum256([]byte(name))
	return ns + ".ctl.w." + hex.EncodeToString(sum[:8])
}

// serveControl subscribes the worker to its control subjects.
func (w *Worker) serveControl() error {
	ns := w.cfg.Namespace
	a, err := w.nc.QueueSubscribe(ctlAny(ns), "workers", w.onAsk)
	if err != nil {
		return fmt.Errorf("cloud: control: %w", err)
	}
	b, err := w.nc.Subscribe(ctlWorker(ns, w.cfg.Name), w.onAsk)
	if err != nil {
		a.Unsubscribe()
		return fmt.Errorf("cloud: control: %w", err)
	}
	w.ctlSubs = []*nats.Subscription{a, b}
	return w.nc.Flush()
}

// onAsk answers one control request, on a goroutine of its own.
func (w *Worker) onAsk(m *nats.Msg) {
	var a Ask
	if err := json.Unmarshal(m.Data, &a); err != nil || a.Run == "" {
		w.respond(m.Reply, outcome{Error: &wireError{Kind: "invalid", Message: "not a request about a run"}})
		return
	}
	if a.launches() {
		// Only under the run's lease: through the work queue.
		w.respond(m.Reply, outcome{Error: &wireError{Kind: "invalid", Message: a.Op + " goes through the work queue"}})
		return
	}
	w.track(func() {
		ctx, cancel := context.WithTimeout(w.ctx, askFor)
		defer cancel()
		w.respond(m.Reply, w.answer(ctx, a))
	})
}

// askFor bounds what a worker does for one Ask.
const askFor = 30 * time.Second

// track runs f on a goroutine the worker waits for in Close, unless the
// worker is stopping.
func (w *Worker) track(f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopping {
		return
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		f()
	}()
}

// answer does what a asks of the worker's engine.
func (w *Worker) answer(ctx context.Context, a Ask) outcome {
	var run keel.Run
	var err error
	switch a.Op {
	case opCancel:
		if run, err = w.eng.Cancel(ctx, a.Run); err == nil {
			w.settle(ctx, run) // a run that waited ends here, not in a handle
		}
	case opPause:
		run, err = w.eng.Pause(ctx, a.Run)
	case opSay:
		run, err = w.eng.SayLabeled(ctx, a.Run, a.Text, a.Labels)
	case opReplay:
		rc, err := w.eng.CheckReplay(ctx, a.Run)
		if err != nil {
			return outcome{Error: toWire(err)}
		}
		return outcome{Replay: &rc}
	case opDecide:
		run, err = w.eng.Decide(ctx, a.Run, a.CallID, a.Decision, a.Output, a.Note)
	case opApprove:
		if a.Approval == nil {
			err = fmt.Errorf("an approval without its answer: %w", keel.ErrInvalid)
			break
		}
		run, err = w.eng.Approve(ctx, a.Run, *a.Approval)
	case opResume:
		run, err = w.eng.Unpause(ctx, a.Run)
	default:
		err = fmt.Errorf("unknown request %q: %w", a.Op, keel.ErrInvalid)
	}
	if err != nil && !errors.Is(err, keel.ErrNotFound) && !errors.Is(err, keel.ErrConflict) && !errors.Is(err, keel.ErrInvalid) {
		w.log.Warn("a client's request", logkey.Run, a.Run, logkey.Method, a.Op, logkey.Err, err)
	}
	o := outcome{Error: toWire(err)}
	if run.ID != "" {
		o.Run = &run
	}
	return o
}

func (w *Worker) respond(reply string, o outcome) {
	if reply == "" {
		return
	}
	b, err := json.Marshal(o)
	if err != nil {
		return
	}
	if err := w.nc.Publish(reply, b); err != nil && w.ctx.Err() == nil {
		w.log.Warn("answer a client", logkey.Err, err)
	}
}

// ClientConfig configures a Client.
type ClientConfig struct {
	// Namespace is the fleet's namespace; default "keel".
	Namespace string
	// Wait bounds how long a request waits for a worker: its answer, or
	// the work queue's item of a decision, approval or resume taken;
	// default 30 s.
	Wait time.Duration
}

// Client reaches a fleet's runs wherever they run, for a client of the
// fleet (cloud/gateway): a run's worker, found by its lease, is asked to
// cancel, pause or give it a message; an answer to a wait and a resume
// go through the work queue, to the worker that takes the run's lease.
// A run is read through the Client's store, so a run of another tenant
// (another NATS account) is not found. Its methods are safe for
// concurrent use, and serve ipc's RunControl.
type Client struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	st   *jsstore.Store
	ns   string
	wait time.Duration
}

// NewClient returns a Client over nc, reading runs through st (a store
// of the same account and namespace).
func NewClient(nc *nats.Conn, st *jsstore.Store, cfg ClientConfig) (*Client, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = "keel"
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 30 * time.Second
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("cloud: %w", err)
	}
	return &Client{nc: nc, js: js, st: st, ns: cfg.Namespace, wait: cfg.Wait}, nil
}

// Cancel stops run id wherever it runs; a run waiting, paused or
// interrupted is journaled cancelled by any worker.
func (c *Client) Cancel(ctx context.Context, id keel.RunID) (keel.Run, error) {
	return c.direct(ctx, Ask{Op: opCancel, Run: id})
}

// Pause asks the worker running run id to pause it at its next step
// boundary.
func (c *Client) Pause(ctx context.Context, id keel.RunID) (keel.Run, error) {
	return c.direct(ctx, Ask{Op: opPause, Run: id})
}

// Unpause queues a paused run to go on: the worker that takes the item
// resumes it under its lease. It returns the run as that worker left it
// (running again).
func (c *Client) Unpause(ctx context.Context, id keel.RunID) (keel.Run, error) {
	return c.queued(ctx, Ask{Op: opResume, Run: id})
}

// Decide answers a failed call's wait (engine.Engine.Decide) through the
// work queue: the worker that takes the item journals the decision and
// runs the run on under its lease.
func (c *Client) Decide(ctx context.Context, id keel.RunID, callID, decision string, output json.RawMessage, note string) (keel.Run, error) {
	return c.queued(ctx, Ask{Op: opDecide, Run: id, CallID: callID, Decision: decision, Output: output, Note: note})
}

// Approve answers an approval request (engine.Engine.Approve), as Decide.
func (c *Client) Approve(ctx context.Context, id keel.RunID, d keel.ApprovalData) (keel.Run, error) {
	return c.queued(ctx, Ask{Op: opApprove, Run: id, Approval: &d})
}

// SayLabeled gives run id a person's message where it runs.
func (c *Client) SayLabeled(ctx context.Context, id keel.RunID, text string, labels []string) (keel.Run, error) {
	return c.direct(ctx, Ask{Op: opSay, Run: id, Text: text, Labels: labels})
}

// CheckReplay replays an ended run from its journal on any worker.
func (c *Client) CheckReplay(ctx context.Context, id keel.RunID) (keel.ReplayCheck, error) {
	if _, err := c.st.GetRun(ctx, id); err != nil {
		return keel.ReplayCheck{}, err
	}
	o, err := c.request(ctx, ctlAny(c.ns), Ask{Op: opReplay, Run: id})
	if err != nil {
		return keel.ReplayCheck{}, err
	}
	if err := o.Error.err(); err != nil {
		return keel.ReplayCheck{}, err
	}
	if o.Replay == nil {
		return keel.ReplayCheck{}, errors.New("cloud: a worker answered a replay without its check")
	}
	return *o.Replay, nil
}

// root returns the run whose work item runs run id: the run itself, or
// for a plan's sub-agent, its topmost parent.
func (c *Client) root(ctx context.Context, id keel.RunID) (keel.Run, error) {
	r, err := c.st.GetRun(ctx, id)
	for err == nil && r.ParentID != "" {
		r, err = c.st.GetRun(ctx, r.ParentID)
	}
	return r, err
}

// direct asks the worker holding run a.Run, or any worker if none does.
func (c *Client) direct(ctx context.Context, a Ask) (keel.Run, error) {
	root, err := c.root(ctx, a.Run)
	if err != nil {
		return keel.Run{}, err
	}
	subject, holder := ctlAny(c.ns), ""
	if root.IdempotencyKey != "" {
		if kv, err := c.js.KeyValue(ctx, names(c.ns).leases); err == nil {
			e, err := kv.Get(ctx, leaseKey(root.IdempotencyKey))
			switch {
			case err == nil:
				holder = string(e.Value())
				subject = ctlWorker(c.ns, holder)
			case !errors.Is(err, jetstream.ErrKeyNotFound):
				return keel.Run{}, fmt.Errorf("%w: find run %s's worker: %v", keel.ErrUnavailable, a.Run, err)
			}
		} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
			return keel.Run{}, fmt.Errorf("%w: find run %s's worker: %v", keel.ErrUnavailable, a.Run, err)
		}
	}
	o, err := c.request(ctx, subject, a)
	if errors.Is(err, nats.ErrNoResponders) && holder != "" {
		return keel.Run{}, fmt.Errorf("%w: worker %s holds run %s and does not answer; another worker adopts the run once its lease lapses: try again", keel.ErrUnavailable, holder, a.Run)
	}
	if err != nil {
		return keel.Run{}, err
	}
	return o.run(a.Run)
}

func (o outcome) run(id keel.RunID) (keel.Run, error) {
	var r keel.Run
	if o.Run != nil {
		r = *o.Run
	}
	if err := o.Error.err(); err != nil {
		return r, err
	}
	if o.Run == nil {
		return r, fmt.Errorf("cloud: a worker answered about run %s without the run", id)
	}
	return r, nil
}

// request sends a to subject and returns the worker's outcome.
func (c *Client) request(ctx context.Context, subject string, a Ask) (outcome, error) {
	b, err := json.Marshal(a)
	if err != nil {
		return outcome{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.wait)
	defer cancel()
	m, err := c.nc.RequestWithContext(ctx, subject, b)
	if errors.Is(err, nats.ErrNoResponders) {
		return outcome{}, fmt.Errorf("%w: no worker answers (%w)", keel.ErrUnavailable, err)
	}
	if err != nil {
		return outcome{}, fmt.Errorf("%w: %s of run %s: %v", keel.ErrUnavailable, a.Op, a.Run, err)
	}
	var o outcome
	if err := json.Unmarshal(m.Data, &o); err != nil {
		return outcome{}, fmt.Errorf("cloud: a worker's answer: %w", err)
	}
	return o, nil
}

// queued puts a on the work queue as an item of its run and waits for
// the answer of the worker that takes it.
func (c *Client) queued(ctx context.Context, a Ask) (keel.Run, error) {
	root, err := c.root(ctx, a.Run)
	if err != nil {
		return keel.Run{}, err
	}
	if root.IdempotencyKey == "" {
		return root, fmt.Errorf("%w: run %s was not queued (it has no idempotency key), so no worker takes it", keel.ErrUnavailable, a.Run)
	}
	inbox := c.nc.NewRespInbox()
	sub, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		return keel.Run{}, fmt.Errorf("%w: %v", keel.ErrUnavailable, err)
	}
	defer sub.Unsubscribe()
	var id [12]byte
	rand.Read(id[:])
	item := Work{Request: keel.StartRequest{Goal: root.Goal, IdempotencyKey: root.IdempotencyKey}, Ask: &a, Reply: inbox}
	data, err := json.Marshal(item)
	if err != nil {
		return keel.Run{}, err
	}
	if _, err := c.js.Publish(ctx, names(c.ns).subject, data, jetstream.WithMsgID("ask-"+hex.EncodeToString(id[:]))); err != nil {
		return keel.Run{}, fmt.Errorf("%w: queue the %s: %v", keel.ErrUnavailable, a.Op, err)
	}
	wctx, cancel := context.WithTimeout(ctx, c.wait)
	defer cancel()
	m, err := sub.NextMsgWithContext(wctx)
	if err != nil {
		if ctx.Err() == nil {
			return keel.Run{}, fmt.Errorf("%w: the %s of run %s is queued, and no worker took it within %s; a worker gives it when it does", keel.ErrUnavailable, a.Op, a.Run, c.wait)
		}
		return keel.Run{}, ctx.Err()
	}
	var o outcome
	if err := json.Unmarshal(m.Data, &o); err != nil {
		return keel.Run{}, fmt.Errorf("cloud: a worker's answer: %w", err)
	}
	return o.run(a.Run)
}
