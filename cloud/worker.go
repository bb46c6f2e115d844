package cloud

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud/jsstore"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Config configures a Worker. NewEngine is required.
type Config struct {
	// Namespace is the jsstore namespace the fleet shares (its journal,
	// work queue and leases); default "keel".
	Namespace string
	// Replicas of the streams and buckets Start creates: 1 or 3;
	// default 3.
	Replicas int
	// Name identifies the worker in its leases and logs; default random.
	Name string
	// MaxRuns is how many runs the worker runs at once; default 4.
	MaxRuns int
	// LeaseTTL is how long a lease lives unless renewed (the worker
	// renews it every third of it), and how long a work item stays
	// with a worker that does not say it is working on it: a dead
	// worker's runs are taken over after about LeaseTTL. Default 30 s.
	// Every worker of a namespace must use the same: the first to start
	// sets it on the shared bucket and consumer.
	LeaseTTL time.Duration
	// NewEngine builds the worker's engine over the store it is given
	// (the engine's Store; the rest of engine.Config is the caller's:
	// model, tools, policy). Required.
	NewEngine func(st engine.Store) (*engine.Engine, error)
	// Limits are what every run the worker starts keeps, whatever its
	// request asks (a tenant's, see Tenant); default none. A run it
	// adopts keeps those it was started with.
	Limits Limits
	// Logger; default discards.
	Logger *slog.Logger
}

// Worker runs runs from the fleet's work queue. Its methods are safe for
// concurrent use.
type Worker struct {
	cfg    Config
	log    *slog.Logger
	nc     *nats.Conn
	st     *jsstore.Store
	eng    *engine.Engine
	js     jetstream.JetStream
	cons   jetstream.Consumer
	leases jetstream.KeyValue

	ctx    context.Context // the worker's lifetime, cancelled by Close and Kill
	cancel context.CancelFunc
	wg     sync.WaitGroup
	slots  chan struct{}
	once   sync.Once

	workers  jetstream.KeyValue   // the workers bucket (workers.go)
	budget   jetstream.KeyValue   // the tenant's budget (budget.go)
	busy     atomic.Int32         // work items being handled
	ctlSubs  []*nats.Subscription // the control subjects (control.go)
	mu       sync.Mutex
	stopping bool // set by Close and Kill: track starts nothing
}

// Work is one item of the work queue: a run to start (or, if it exists,
// to adopt), named by its idempotency key.
type Work struct {
	Request keel.StartRequest `json:"request"`
	// Ask, if set, is a client's answer to the run's wait (or its
	// resume): the worker that takes the item gives it under the run's
	// lease, sends the outcome to Reply, and runs the run on. Such an
	// item never starts a run.
	Ask   *Ask   `json:"ask,omitempty"`
	Reply string `json:"reply,omitempty"`
}

// queue holds the names of the work queue's parts in a namespace.
type queue struct{ stream, subject, consumer, leases string }

func names(ns string) queue {
	return queue{stream: ns + "_WORK", subject: ns + ".work", consumer: "workers", leases: ns + "_leases"}
}

// ErrNoKey is returned by Submit for a request without an idempotency key:
// the key names the run across workers.
var ErrNoKey = errors.New("cloud: a submitted run needs an idempotency key")

// Submit queues a run for the fleet of namespace ns. The request's
// idempotency key names the run: a second Submit with the same key
// within the queue's two-minute duplicate window is dropped, and a run
// that exists is adopted rather than started again. It returns once the
// queue has the item (on a quorum of its replicas).
func Submit(ctx context.Context, js jetstream.JetStream, ns string, req keel.StartRequest) error {
	if req.IdempotencyKey == "" {
		return ErrNoKey
	}
	if ns == "" {
		ns = "keel"
	}
	if err := enqueue(ctx, js, ns, req, req.IdempotencyKey); err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	return nil
}

// enqueue publishes a work item for req with message ID id (the queue
// drops a second item with the same ID within two minutes).
func enqueue(ctx context.Context, js jetstream.JetStream, ns string, req keel.StartRequest, id string) error {
	data, err := json.Marshal(Work{Request: req})
	if err != nil {
		return err
	}
	_, err = js.Publish(ctx, names(ns).subject, data, jetstream.WithMsgID(id))
	return err
}

// Setup creates the namespace's work queue, its consumer and its lease
// bucket, those that do not exist (one that exists is used as it is:
// the first to create them sets the lease TTL and the replicas). Start
// calls it; a client that submits before any worker started calls it
// too.
func Setup(ctx context.Context, js jetstream.JetStream, ns string, replicas int, leaseTTL time.Duration) error {
	if ns == "" {
		ns = "keel"
	}
	if replicas == 0 {
		replicas = 3
	}
	if leaseTTL <= 0 {
		leaseTTL = 30 * time.Second
	}
	q := names(ns)
	s, err := jsstore.EnsureStream(ctx, js, jetstream.StreamConfig{Name: q.stream, Subjects: []string{q.subject},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Replicas: replicas, Duplicates: 2 * time.Minute})
	if err != nil {
		return fmt.Errorf("cloud: work queue: %w", err)
	}
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: q.consumer, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: leaseTTL, MaxDeliver: -1, MaxAckPending: -1}); err != nil {
		return fmt.Errorf("cloud: work consumer: %w", err)
	}
	if _, err := jsstore.EnsureKeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: q.leases, TTL: leaseTTL, Storage: jetstream.FileStorage, Replicas: replicas}); err != nil {
		return fmt.Errorf("cloud: lease bucket: %w", err)
	}
	if _, err := jsstore.EnsureKeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: workersBucket(ns), TTL: leaseTTL, History: 1, Storage: jetstream.FileStorage, Replicas: replicas}); err != nil {
		return fmt.Errorf("cloud: workers bucket: %w", err)
	}
	if _, err := jsstore.EnsureKeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: budgetBucket(ns), History: 1, Storage: jetstream.FileStorage, Replicas: replicas}); err != nil {
		return fmt.Errorf("cloud: budget bucket: %w", err)
	}
	return nil
}

// Start starts a worker over nc, which it uses until Close or Kill (and
// closes then). It returns once the worker pulls from the queue.
func Start(ctx context.Context, nc *nats.Conn, cfg Config) (*Worker, error) {
	if cfg.NewEngine == nil {
		return nil, errors.New("cloud: Config.NewEngine is required")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "keel"
	}
	if cfg.Name == "" {
		var b [4]byte
		rand.Read(b[:])
		cfg.Name = "worker-" + hex.EncodeToString(b[:])
	}
	if cfg.MaxRuns <= 0 {
		cfg.MaxRuns = 4
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 30 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("cloud: %w", err)
	}
	if err := Setup(ctx, js, cfg.Namespace, cfg.Replicas, cfg.LeaseTTL); err != nil {
		return nil, err
	}
	q := names(cfg.Namespace)
	w := &Worker{cfg: cfg, log: log.With(logkey.Worker, cfg.Name), nc: nc, slots: make(chan struct{}, cfg.MaxRuns)}
	if w.st, err = jsstore.Open(ctx, js, jsstore.Config{Namespace: cfg.Namespace, Replicas: cfg.Replicas}); err != nil {
		return nil, err
	}
	if w.cons, err = js.Consumer(ctx, q.stream, q.consumer); err != nil {
		return nil, fmt.Errorf("cloud: work consumer: %w", err)
	}
	if w.leases, err = js.KeyValue(ctx, q.leases); err != nil {
		return nil, fmt.Errorf("cloud: lease bucket: %w", err)
	}
	if w.workers, err = js.KeyValue(ctx, workersBucket(cfg.Namespace)); err != nil {
		return nil, fmt.Errorf("cloud: workers bucket: %w", err)
	}
	if w.budget, err = js.KeyValue(ctx, budgetBucket(cfg.Namespace)); err != nil {
		return nil, fmt.Errorf("cloud: budget bucket: %w", err)
	}
	if w.eng, err = cfg.NewEngine(w.st); err != nil {
		return nil, fmt.Errorf("cloud: engine: %w", err)
	}
	w.js = js
	w.ctx, w.cancel = context.WithCancel(context.Background())
	if err := w.serveControl(); err != nil {
		w.cancel()
		return nil, err
	}
	w.wg.Add(3)
	go w.pull()
	go w.sweep()
	go w.heartbeat(time.Now().UTC())
	return w, nil
}

// Name returns the worker's name.
func (w *Worker) Name() string { return w.cfg.Name }

// Engine returns the worker's engine: a run's events can be watched
// there (Engine.Subscribe) and a waiting run answered (Engine.Decide).
func (w *Worker) Engine() *engine.Engine { return w.eng }

// pull takes work items while a run slot is free, until the worker stops.
func (w *Worker) pull() {
	defer w.wg.Done()
	for {
		select {
		case w.slots <- struct{}{}:
		case <-w.ctx.Done():
			return
		}
		batch, err := w.cons.Fetch(1, jetstream.FetchContext(w.ctx))
		if err != nil {
			<-w.slots
			if w.ctx.Err() != nil {
				return
			}
			w.log.Warn("fetch work", logkey.Err, err)
			continue
		}
		got := false
		for m := range batch.Messages() {
			got = true
			w.wg.Add(1)
			go func() {
				defer w.wg.Done()
				defer func() { <-w.slots }()
				w.handle(m)
			}()
		}
		if !got {
			<-w.slots
		}
	}
}

// sweep gives the queue again, every lease TTL, each run that no worker
// holds: not ended and not waiting for a person, with no lease, and
// whose journal did not move since the previous sweep saw it so. Its
// work item is delivered again after the ack wait when its worker dies;
// the sweep is what still adopts the run if that delivery never comes
// (an item acked by mistake, or a redelivery lost while the work
// consumer's leader changed), so that adoption never rests on one
// message. Several workers sweeping give the same item: the queue keeps
// one (its ID names the run and its journal's last seq), and a second
// item of a run only costs a worker a lease check.
func (w *Worker) sweep() {
	defer w.wg.Done()
	seen := map[keel.RunID]int64{} // unheld at the last sweep, with their last seq
	t := time.NewTicker(w.cfg.LeaseTTL)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-w.ctx.Done():
			return
		}
		ctx, cancel := context.WithTimeout(w.ctx, sweepFor)
		seen = w.sweepOnce(ctx, seen)
		cancel()
	}
}

// sweepFor bounds one sweep.
const sweepFor = 30 * time.Second

// sweepOnce is one sweep: it queues the runs unheld now and at the
// previous sweep (seen) with the same last seq, and returns the runs
// unheld now.
func (w *Worker) sweepOnce(ctx context.Context, seen map[keel.RunID]int64) map[keel.RunID]int64 {
	runs, err := w.st.RunsWithStatus(ctx, keel.RunQueued, keel.RunRunning, keel.RunInterrupted)
	if err != nil {
		if w.ctx.Err() == nil {
			w.log.Warn("sweep runs", logkey.Err, err)
		}
		return seen
	}
	unheld := map[keel.RunID]int64{}
	for _, r := range runs {
		// A run without a key is not the queue's (a plan's sub-agent
		// runs under its parent's engine).
		if r.IdempotencyKey == "" || r.ParentID != "" {
			continue
		}
		if _, err := w.leases.Get(ctx, leaseKey(r.IdempotencyKey)); !errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // held, or unknown
		}
		unheld[r.ID] = r.LastSeq
		if last, ok := seen[r.ID]; !ok || last != r.LastSeq {
			continue
		}
		w.log.Warn("a run no worker holds: queued again", logkey.Run, r.ID, logkey.RunKey, r.IdempotencyKey)
		id := fmt.Sprintf("sweep-%s-%d", r.ID, r.LastSeq)
		if err := enqueue(ctx, w.js, w.cfg.Namespace, keel.StartRequest{Goal: r.Goal, IdempotencyKey: r.IdempotencyKey}, id); err != nil {
			w.log.Warn("sweep: queue a run", logkey.Run, r.ID, logkey.Err, err)
		}
	}
	return unheld
}

// leaseKey is a run's lease key: the SHA-256 of its idempotency key.
func leaseKey(idem string) string {
	sum := sha256.Sum256([]byte(idem))
	return hex.EncodeToString(sum[:])
}

// handle runs one work item: takes the run's lease (or leaves the item
// for later if another worker holds it), starts or adopts the run, keeps
// the lease and the item alive while the run goes on, and acknowledges
// the item once the run ended or waits for a person.
func (w *Worker) handle(m jetstream.Msg) {
	w.busy.Add(1)
	defer w.busy.Add(-1)
	ctx := w.ctx
	var item Work
	if err := json.Unmarshal(m.Data(), &item); err != nil || item.Request.IdempotencyKey == "" {
		w.log.Error("a work item that is not one: dropped", logkey.Err, err)
		m.Term()
		return
	}
	key := leaseKey(item.Request.IdempotencyKey)
	rev, err := w.leases.Create(ctx, key, []byte(w.cfg.Name))
	if errors.Is(err, jetstream.ErrKeyExists) {
		// Another worker runs it; if that one dies, its lease lapses and
		// the item comes back.
		m.NakWithDelay(w.cfg.LeaseTTL / 2)
		return
	}
	if err != nil {
		w.log.Warn("take a lease", logkey.Err, err)
		m.Nak()
		return
	}
	log := w.log.With(logkey.RunKey, item.Request.IdempotencyKey)
	renewed := make(chan struct{}) // closed when the renewal stops
	stop := make(chan struct{})    // closed by done: stop renewing
	var current uint64 = rev
	go func() { // keeps the lease and the item while the run goes on
		defer close(renewed)
		t := time.NewTicker(w.cfg.LeaseTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				r, err := w.renew(ctx, key, current)
				if errors.Is(err, errLeaseTaken) {
					log.Warn("lease lost: another worker may adopt the run; the journal fences this one", logkey.Err, err)
					return
				}
				if err != nil {
					// No leader (an election), or no answer in time: the
					// lease may lapse meanwhile; the next tick renews it,
					// or takes it again if no other worker took it.
					if ctx.Err() == nil {
						log.Warn("renew a lease", logkey.Err, err)
					}
				} else {
					current = r
				}
				// The item stays ours while the lease may be: a consumer
				// that can be reached keeps it from going to another
				// worker while the lease bucket elects a leader.
				m.InProgress()
			case <-ctx.Done():
				return
			case <-stop:
				return
			}
		}
	}()
	// done ends the item: acked, given back (retry after delay), or
	// terminated (it can never run).
	type ending int
	const (
		ack ending = iota
		retry
		drop
	)
	done := func(how ending) {
		close(stop) // done is called once
		<-renewed
		if ctx.Err() != nil {
			return // killed or closing: the lease lapses, the item comes back
		}
		switch how {
		case ack:
			m.Ack()
		case retry:
			m.NakWithDelay(w.cfg.LeaseTTL)
		case drop:
			m.Term()
		}
		w.leases.Delete(context.WithoutCancel(ctx), key, jetstream.LastRevision(current))
	}
	actx, cancel := context.WithTimeout(ctx, adoptFor)
	if item.Ask != nil {
		// Given under the lease: a decision or approval launches the
		// run here, and startOrAdopt finds it running. An item given
		// again (its worker died after the answer) finds the answer
		// journaled: the second is refused, and the run is adopted.
		w.respond(item.Reply, w.answer(actx, *item.Ask))
	}
	id, err := w.startOrAdopt(actx, item.Request, item.Ask == nil)
	cancel()
	if errors.Is(err, keel.ErrInvalid) || errors.Is(err, ErrBudget) {
		log.Error("a run that cannot start: its work item is dropped", logkey.Err, err)
		done(drop)
		return
	}
	if err != nil {
		log.Error("start or adopt a run", logkey.Err, err)
		done(retry)
		return
	}
	if err := w.eng.Wait(ctx, id); err != nil {
		done(retry)
		return
	}
	r, err := w.st.GetRun(ctx, id)
	if err != nil {
		done(retry)
		return
	}
	w.settle(ctx, r)
	// An ended run, or one that waits for a person, is done with; an
	// interrupted one (this engine is closing) goes back to the queue.
	switch r.Status {
	case keel.RunInterrupted, keel.RunQueued, keel.RunRunning:
		done(retry)
	default:
		done(ack)
	}
}

// errLeaseTaken says another worker holds a lease this one held.
var errLeaseTaken = errors.New("cloud: the lease was taken by another worker")

// renew renews the lease key held at revision rev and returns its new
// revision, within a third of the TTL. A renewal refused as a conflict
// may be nats.go's second copy of one that went through (sent again
// while a leader changed): the lease is still ours if it names this
// worker at a later revision. A lease that lapsed (the bucket had no
// leader for longer than the TTL: its replicas expire entries by age,
// leader or not) is taken again if no other worker took it meanwhile;
// one that did returns errLeaseTaken. Other errors leave the lease's
// fate unknown.
func (w *Worker) renew(ctx context.Context, key string, rev uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.LeaseTTL/3)
	defer cancel()
	r, err := w.leases.Update(ctx, key, []byte(w.cfg.Name), rev)
	if err == nil || !errors.Is(err, jetstream.ErrKeyExists) {
		return r, err
	}
	e, err := w.leases.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		r, err := w.leases.Create(ctx, key, []byte(w.cfg.Name))
		if errors.Is(err, jetstream.ErrKeyExists) {
			return 0, errLeaseTaken
		}
		return r, err
	case err != nil:
		return 0, err
	case string(e.Value()) == w.cfg.Name && e.Revision() > rev:
		return e.Revision(), nil
	default:
		return 0, fmt.Errorf("%w: %s", errLeaseTaken, e.Value())
	}
}

// adoptFor bounds how long a worker takes to start or adopt a run while
// it holds the run's lease: one that cannot gives the item back, for
// another worker (or itself) to try again.
const adoptFor = time.Minute

// startOrAdopt starts the run req asks for (if start), or adopts it if
// a worker created it before (and died).
func (w *Worker) startOrAdopt(ctx context.Context, req keel.StartRequest, start bool) (keel.RunID, error) {
	r, err := w.st.RunByIdempotencyKey(ctx, req.IdempotencyKey)
	if errors.Is(err, keel.ErrNotFound) && !start {
		return "", fmt.Errorf("no run has key %q: %w", req.IdempotencyKey, keel.ErrInvalid)
	}
	if errors.Is(err, keel.ErrNotFound) {
		req = w.cfg.Limits.Apply(req)
		if w.cfg.Limits.hasTotal() {
			if req, err = w.reserve(ctx, req); err != nil {
				return "", err
			}
		}
		r, err = w.eng.Start(ctx, req)
		if err != nil {
			return "", err
		}
		return r.ID, nil
	}
	if err != nil {
		return "", err
	}
	if _, err := w.eng.Adopt(ctx, r.ID); err != nil && !errors.Is(err, keel.ErrConflict) {
		return "", err
	}
	return r.ID, nil
}

// Close stops taking work, interrupts the worker's runs (journaled as
// interrupted, so another worker adopts them at once), gives their work
// items back, and closes the connection.
func (w *Worker) Close(ctx context.Context) error {
	var err error
	w.once.Do(func() {
		w.stop()
		err = w.eng.Close(ctx)
		w.cancel()
		w.wg.Wait()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaseTTL/3)
		w.workers.Delete(dctx, workerKey(w.cfg.Name)) // else it lapses
		cancel()
		err = errors.Join(err, w.st.Close())
		w.nc.Close()
	})
	return err
}

// stop unsubscribes the control subjects and has track start nothing
// more.
func (w *Worker) stop() {
	w.mu.Lock()
	w.stopping = true
	w.mu.Unlock()
	for _, s := range w.ctlSubs {
		s.Unsubscribe()
	}
}

// Kill makes the worker die as a crashed process would: its connection
// is cut at once, so nothing it does afterwards reaches the cluster (no
// journal append, no lease renewal, no acknowledgement), and its
// goroutines then end. Its leases lapse and its runs are adopted by
// other workers. For tests and benchmarks.
func (w *Worker) Kill() {
	w.once.Do(func() {
		w.nc.Close()
		w.stop()
		w.cancel()
		w.eng.Close(context.Background())
		w.wg.Wait()
	})
}
