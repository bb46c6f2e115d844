package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Config configures an edge. URL is required; the zero value of every
// other field is a usable default.
type Config struct {
	// URL is the cloud's leaf node URL(s), comma-separated
	// (nats-leaf://host:7422). Required.
	URL string
	// Credentials is a file with what the cloud's leaf node port asks
	// for: a NATS credentials file (a user JWT and nkey seed), or one
	// line "user:password", or one line holding a token. Default none.
	Credentials string
	// Name names the edge among the cloud's edges: lower-case letters,
	// digits, '-' and '_'. Default the host name, so cleaned.
	Name string
	// Dir holds the leaf server's JetStream store (the outbox). Required
	// in practice: default a directory under os.TempDir().
	Dir string
	// Namespace is the cloud's namespace (cloud.Config.Namespace);
	// default "keel".
	Namespace string
	// CloudDomain is the JetStream domain of the cloud cluster; default
	// DefaultDomain.
	CloudDomain string
	// Heartbeat is how often the declaration is published; default 5 s.
	// The cloud's edges bucket forgets an edge after its TTL (Setup).
	Heartbeat time.Duration
	// AllowLabels are the labels whose data may cross to the cloud
	// (never "private"); default none: an event of a run whose context
	// holds any label stays on the edge (its stub crosses).
	AllowLabels []string
	// Logger; default discards.
	Logger *slog.Logger
}

// Sources are what an edge reads from, and asks of, its daemon.
type Sources struct {
	// Describe is env.describe. Required.
	Describe func(context.Context) (capabilities.Environment, error)
	// Labels is a run's context labels from its journal
	// (engine.ContextLabels). Nil: a run first seen mid-way is held.
	Labels func(context.Context, keel.RunID) ([]string, error)
	// Start starts a run for a step the cloud hands off (engine.Start).
	// Nil: the edge accepts no steps.
	Start func(context.Context, keel.StartRequest) (keel.Run, error)
	// Offers keeps the steps handed to the edge with its runs (the
	// daemon's store): who offered each. Required with Start.
	Offers Offers
	// Spans is a run's trace spans (engine.Store's Spans), which the
	// edge gives the origin of a step it ran, as the run's labels allow
	// (SpansSubject). Nil: no spans cross.
	Spans func(context.Context, keel.RunID) ([]keel.Span, error)
	// Journal is the daemon's journal: at Join, the outbox is given
	// what it misses of it (catchUp). Nil: no catch-up.
	Journal Journal
	// Cancel cancels a run (engine.Cancel), for the origin of a step the
	// edge runs (CancelSubject). Nil: no cancel crosses.
	Cancel func(context.Context, keel.RunID) (keel.Run, error)
}

// DefaultDomain is the cloud cluster's JetStream domain, which an edge
// reaches the cloud's streams and buckets through.
const DefaultDomain = "cloud"

// Outbox names, on the edge's own JetStream domain.
const (
	OutboxStream  = "KEEL_OUTBOX"
	outboxSubject = "keel.outbox."
	// outboxBorn is the mirror's metadata key naming the outbox it
	// mirrors.
	outboxBorn = "keel_outbox_created"
)

// Edge is a daemon joined to a cloud. Its methods are safe for
// concurrent use.
type Edge struct {
	cfg    Config
	src    Sources
	log    *slog.Logger
	srv    *server.Server
	nc     *nats.Conn
	local  jetstream.JetStream
	cloud  jetstream.JetStream
	filter *Filter
	// subs answer the steps handed to the edge, their runs' spans and
	// their cancels (each on its subject, and with an asker's name).
	subs []*nats.Subscription

	// offerMu orders the offers and cancels of steps: a cancel of a key
	// comes before its offer's start or after it.
	offerMu sync.Mutex

	mu    sync.Mutex
	queue []keel.Event
	wake  chan struct{}
	// taken counts the events OnEvent took, stored those in the outbox;
	// progress is closed (and replaced) at each store.
	taken, stored uint64
	progress      chan struct{}
	// steps are the runs of steps handed to the edge, not yet ended.
	steps map[keel.RunID]bool
	// caught is, per run, the last seq the catch-up gave the outbox:
	// queued events up to it are in the outbox already.
	caught map[keel.RunID]int64
	// cut, a test's seam, stops the outbox for good at the first event
	// it returns true for, as a crash between journaling that event and
	// storing it would; dead is set then.
	cut  func(keel.Event) bool
	dead bool

	load     atomic.Int32
	mirrored atomic.Bool
	kv       atomic.Pointer[jetstream.KeyValue]

	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed sync.Once
}

// Join starts the edge's leaf server (its link to cfg.URL comes up in
// the background, and comes back by itself after a loss), its outbox,
// its step service and its heartbeat. It returns once the leaf server
// runs, whether or not the cloud is reachable. Close stops it all.
func Join(ctx context.Context, cfg Config, src Sources) (*Edge, error) {
	if cfg.URL == "" {
		return nil, errors.New("edge: no cloud URL to join")
	}
	if src.Describe == nil {
		return nil, errors.New("edge: no declaration source")
	}
	if src.Start != nil && src.Offers == nil {
		return nil, errors.New("edge: steps are started, but their offers are not kept")
	}
	if cfg.Name == "" {
		h, _ := os.Hostname()
		cfg.Name = cleanName(h)
	}
	if err := checkName(cfg.Name); err != nil {
		return nil, err
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "keel"
	}
	if cfg.CloudDomain == "" {
		cfg.CloudDomain = DefaultDomain
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 5 * time.Second
	}
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(os.TempDir(), "keel-edge-"+cfg.Name)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	remote, err := remoteOpts(cfg.URL, cfg.Credentials)
	if err != nil {
		return nil, err
	}
	// The outbox's subjects stay on this server: the events reach the
	// cloud only through its mirror, as the filter left them, and never
	// another edge's outbox (whose stream listens on the same subjects).
	remote.DenyExports = []string{outboxSubject + ">"}
	remote.DenyImports = []string{outboxSubject + ">"}
	opts := &server.Options{
		ServerName:         "edge-" + cfg.Name,
		DontListen:         true,
		NoSigs:             true,
		NoLog:              true,
		JetStream:          true,
		JetStreamDomain:    Domain(cfg.Name),
		StoreDir:           cfg.Dir,
		JetStreamMaxMemory: 16 << 20,
		JetStreamMaxStore:  1 << 30,
		LeafNode:           server.LeafNodeOpts{Remotes: []*server.RemoteLeafOpts{remote}, ReconnectInterval: time.Second},
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("edge: leaf server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("edge: the leaf server did not start")
	}
	e := &Edge{cfg: cfg, src: src, log: log, srv: srv, wake: make(chan struct{}, 1), progress: make(chan struct{}),
		filter: NewFilter(cfg.AllowLabels, src.Labels), caught: map[keel.RunID]int64{}}
	if err := e.connect(ctx); err != nil {
		srv.Shutdown()
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.cancel = cancel
	e.wg.Go(func() { e.runOutbox(lctx) })
	e.wg.Go(func() { e.runHeartbeat(lctx) })
	log.Info("edge joining the cloud", logkey.Edge, cfg.Name, logkey.URL, redact(cfg.URL))
	return e, nil
}

// connect opens the in-process connection, the outbox and the step
// service.
func (e *Edge) connect(ctx context.Context) error {
	nc, err := nats.Connect("", nats.InProcessServer(e.srv), nats.Name("keel-edge-"+e.cfg.Name), nats.MaxReconnects(-1),
		nats.CustomInboxPrefix(InboxPrefix(e.cfg.Name)))
	if err != nil {
		return fmt.Errorf("edge: connect to the leaf server: %w", err)
	}
	e.nc = nc
	if e.local, err = jetstream.New(nc); err != nil {
		nc.Close()
		return err
	}
	if e.cloud, err = jetstream.NewWithDomain(nc, e.cfg.CloudDomain); err != nil {
		nc.Close()
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := e.local.CreateOrUpdateStream(sctx, jetstream.StreamConfig{Name: OutboxStream, Subjects: []string{outboxSubject + ">"},
		Storage: jetstream.FileStorage, Replicas: 1, Duplicates: 10 * time.Minute}); err != nil {
		nc.Close()
		return fmt.Errorf("edge: outbox: %w", err)
	}
	// Each service answers on its subject (the cloud's requests) and on
	// the subject with the asker's name after it (an edge's, which its
	// credentials bind to its name: AskerOf).
	serve := func(subject string, h nats.MsgHandler) error {
		for _, subj := range []string{subject, subject + ".*"} {
			sub, err := nc.Subscribe(subj, h)
			if err != nil {
				return err
			}
			e.subs = append(e.subs, sub)
		}
		return nil
	}
	if e.src.Start != nil {
		if err := serve(StepSubject(e.cfg.Namespace, e.cfg.Name), e.serveStep); err != nil {
			nc.Close()
			return err
		}
	}
	if e.src.Spans != nil {
		if err := serve(SpansSubject(e.cfg.Namespace, e.cfg.Name), e.serveSpans); err != nil {
			nc.Close()
			return err
		}
	}
	if e.src.Cancel != nil && e.src.Start != nil {
		if err := serve(CancelSubject(e.cfg.Namespace, e.cfg.Name), e.serveCancel); err != nil {
			nc.Close()
			return err
		}
	}
	return nil
}

// Name is the edge's name.
func (e *Edge) Name() string { return e.cfg.Name }

// Linked reports whether the leaf link to the cloud is up now.
func (e *Edge) Linked() bool { return e.srv.NumLeafNodes() > 0 }

// OnEvent takes one journaled event of a run for the outbox; it never
// blocks (the engine's subscriber: eng.Subscribe(edge.OnEvent)). Live
// events (model.delta) are not journaled and are ignored.
func (e *Edge) OnEvent(ev keel.Event) {
	if ev.Seq == 0 || ev.Type == keel.EventModelDelta {
		return
	}
	if terminal(ev.Type) {
		e.stepEnded(ev.RunID)
	}
	e.mu.Lock()
	e.queue = append(e.queue, ev)
	e.taken++
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// runOutbox gives the outbox what it misses of the journal (catchUp),
// then filters the queued events and stores them in the outbox, in
// order. A store that fails (the leaf server stopping) is tried again.
func (e *Edge) runOutbox(ctx context.Context) {
	for e.src.Journal != nil {
		err := e.catchUp(ctx)
		if err == nil || ctx.Err() != nil {
			break
		}
		e.log.Warn("edge: outbox catch-up", logkey.Err, err)
		if !sleep(ctx, 100*time.Millisecond) {
			return
		}
	}
	for {
		e.mu.Lock()
		evs := e.queue
		e.queue = nil
		e.mu.Unlock()
		for i := 0; i < len(evs); {
			if err := e.store(ctx, evs[i]); err != nil {
				if ctx.Err() != nil {
					e.requeue(evs[i:])
					return
				}
				e.log.Warn("edge: outbox", logkey.Err, err)
				if !sleep(ctx, 100*time.Millisecond) {
					e.requeue(evs[i:])
					return
				}
				continue
			}
			i++
		}
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		}
	}
}

func (e *Edge) requeue(evs []keel.Event) {
	e.mu.Lock()
	e.queue = append(evs, e.queue...)
	e.mu.Unlock()
}

// store writes a queued event, as the filter lets it cross, to the
// outbox, and counts it stored (Flush). One the catch-up gave the
// outbox already is only counted.
func (e *Edge) store(ctx context.Context, ev keel.Event) error {
	e.mu.Lock()
	if e.cut != nil && !e.dead && e.cut(ev) {
		e.dead = true
	}
	skip := e.dead || ev.Seq <= e.caught[ev.RunID]
	e.mu.Unlock()
	if !skip {
		if err := e.publish(ctx, ev); err != nil {
			return err
		}
	}
	e.mu.Lock()
	e.stored++
	close(e.progress)
	e.progress = make(chan struct{})
	e.mu.Unlock()
	return nil
}

// publish writes ev, as the filter lets it cross, to the outbox; the
// message ID (run and seq) makes a second copy within the outbox's
// duplicate window (10 minutes) a no-op.
func (e *Edge) publish(ctx context.Context, ev keel.Event) error {
	out, _ := e.filter.Pass(ctx, ev)
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = e.local.Publish(pctx, outboxSubject+string(ev.RunID), b, jetstream.WithMsgID(fmt.Sprintf("%s:%d", ev.RunID, ev.Seq)))
	return err
}

// Flush waits until every event taken so far is in the outbox, or ctx
// ends.
func (e *Edge) Flush(ctx context.Context) error {
	e.mu.Lock()
	want := e.taken
	e.mu.Unlock()
	for {
		e.mu.Lock()
		done, progress := e.stored >= want, e.progress
		e.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-progress:
		}
	}
}

// runHeartbeat publishes the declaration every Heartbeat, and sets up
// the cloud's mirror of the outbox once the link is up.
func (e *Edge) runHeartbeat(ctx context.Context) {
	t := time.NewTicker(e.cfg.Heartbeat)
	defer t.Stop()
	for {
		if e.Linked() {
			if err := e.beat(ctx); err != nil && ctx.Err() == nil {
				e.log.Debug("edge: heartbeat", logkey.Err, err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// beat publishes the declaration once, and makes sure of the mirror.
func (e *Edge) beat(ctx context.Context) error {
	bctx, cancel := context.WithTimeout(ctx, e.cfg.Heartbeat+5*time.Second)
	defer cancel()
	env, err := e.src.Describe(bctx)
	if err != nil {
		return fmt.Errorf("describe: %w", err)
	}
	d := Declare(e.cfg.Name, env)
	d.Load = int(e.load.Load())
	d.At = time.Now().UTC()
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	kvp := e.kv.Load()
	if kvp == nil {
		kv, err := e.cloud.KeyValue(bctx, BucketName(e.cfg.Namespace))
		if err != nil {
			return fmt.Errorf("edges bucket: %w", err)
		}
		kvp = &kv
		e.kv.Store(kvp)
	}
	if _, err := (*kvp).Put(bctx, e.cfg.Name, b); err != nil {
		return fmt.Errorf("declare: %w", err)
	}
	if !e.mirrored.Load() {
		if err := e.ensureMirror(bctx, *kvp); err != nil {
			return fmt.Errorf("mirror: %w", err)
		}
		e.mirrored.Store(true)
	}
	return nil
}

// ensureMirror creates the cloud's mirror of the outbox, with the edges
// bucket's replicas.
func (e *Edge) ensureMirror(ctx context.Context, kv jetstream.KeyValue) error {
	st, err := kv.Status(ctx)
	if err != nil {
		return err
	}
	replicas := 1
	if s, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		replicas = s.StreamInfo().Config.Replicas
	}
	name := MirrorName(e.cfg.Namespace, e.cfg.Name)
	out, err := e.local.Stream(ctx, OutboxStream)
	if err != nil {
		return err
	}
	// The mirror names the outbox it mirrors by its creation time. A
	// mirror of another (the edge's data directory was made anew) would
	// skip the new one's first messages as seen: it goes, with the
	// history of the old one.
	born := out.CachedInfo().Created.UTC().Format(time.RFC3339Nano)
	if m, err := e.cloud.Stream(ctx, name); err == nil {
		if m.CachedInfo().Config.Metadata[outboxBorn] != born {
			e.log.Warn("edge: the cloud mirrors another outbox of this name; its mirror starts again", logkey.Edge, e.cfg.Name)
			if err := e.cloud.DeleteStream(ctx, name); err != nil {
				return err
			}
		}
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	_, err = e.cloud.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: name, Storage: jetstream.FileStorage, Replicas: replicas,
		Metadata: map[string]string{outboxBorn: born},
		Mirror:   &jetstream.StreamSource{Name: OutboxStream, External: &jetstream.ExternalStream{APIPrefix: "$JS." + Domain(e.cfg.Name) + ".API"}}})
	return err
}

// Close stops the edge: its declaration is deleted from the cloud if the
// link is up (else it expires), the events taken are stored in the
// outbox, the leaf server stops. A second Close does nothing.
func (e *Edge) Close(ctx context.Context) error {
	e.closed.Do(func() {
		for _, sub := range e.subs {
			sub.Unsubscribe()
		}
		e.cancel()
		e.wg.Wait()
		// What is still queued goes to the outbox now.
		e.mu.Lock()
		evs := e.queue
		e.queue = nil
		e.mu.Unlock()
		for _, ev := range evs {
			if err := e.store(ctx, ev); err != nil {
				e.log.Warn("edge: outbox at close", logkey.Err, err)
				break
			}
		}
		if kvp := e.kv.Load(); kvp != nil && e.Linked() {
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			(*kvp).Delete(dctx, e.cfg.Name)
			cancel()
		}
		e.nc.Close()
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
	})
	return nil
}

// Domain is the JetStream domain of edge name's leaf server.
func Domain(name string) string { return "edge-" + name }

// remoteOpts builds the leaf remote for urls with the credentials file.
func remoteOpts(urls, credentials string) (*server.RemoteLeafOpts, error) {
	r := &server.RemoteLeafOpts{}
	var user *url.Userinfo
	if credentials != "" {
		b, err := os.ReadFile(credentials)
		if err != nil {
			return nil, fmt.Errorf("edge: credentials: %w", err)
		}
		s := strings.TrimSpace(string(b))
		switch {
		case strings.Contains(s, "BEGIN NATS USER JWT"):
			r.Credentials = credentials
		case s == "":
			return nil, fmt.Errorf("edge: credentials file %s is empty", credentials)
		default:
			line, _, _ := strings.Cut(s, "\n")
			if u, p, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
				user = url.UserPassword(u, p)
			} else {
				user = url.User(strings.TrimSpace(line))
			}
		}
	}
	for _, s := range strings.Split(urls, ",") {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("edge: cloud URL %q: want nats-leaf://HOST:PORT", s)
		}
		if user != nil {
			u.User = user
		}
		r.URLs = append(r.URLs, u)
	}
	return r, nil
}

// redact drops credentials from a URL list for the log.
func redact(urls string) string {
	var out []string
	for _, s := range strings.Split(urls, ",") {
		if u, err := url.Parse(strings.TrimSpace(s)); err == nil {
			u.User = nil
			s = u.String()
		}
		out = append(out, s)
	}
	return strings.Join(out, ",")
}

// checkName checks an edge's name.
func checkName(n string) error {
	ok := n != "" && len(n) <= 64
	for i := 0; ok && i < len(n); i++ {
		c := n[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_'
	}
	if !ok {
		return fmt.Errorf("edge: name %q: want lower-case letters, digits, - and _ (at most 64)", n)
	}
	if n == CloudName {
		return errors.New(`edge: the name "cloud" is the cloud's own`)
	}
	return nil
}

// cleanName makes a host name an edge name.
func cleanName(h string) string {
	h, _, _ = strings.Cut(strings.ToLower(h), ".")
	var b strings.Builder
	for _, c := range h {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteRune(c)
		}
	}
	if b.Len() == 0 {
		return "edge"
	}
	return b.String()
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
