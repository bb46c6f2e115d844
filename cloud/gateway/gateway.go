package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud"
	"github.com/keel-runtime/keel/cloud/jsstore"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/ipc"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Tenant is one tenant the gateway serves.
type Tenant struct {
	// Name names the tenant in logs.
	Name string
	// Token is the secret its clients present (as to the daemon: a
	// bearer header or the token subprotocol). Required; no two tenants
	// share one.
	Token string
	// Conn is a connection to the cluster as the tenant's NATS user:
	// everything the tenant's clients ask is answered through it, so
	// from the tenant's account only. The caller closes it after Run.
	Conn *nats.Conn
	// Tools, if set, are the workers' tools: tools.list shows those
	// Limits.Tools allow (tools.call is not served: a tool runs inside a
	// run). Nil: neither is served.
	Tools ToolSpecs
	// Models, if set, is the workers' model provider: models.list shows
	// its models (models.pull is not served). Nil: neither is served.
	Models ModelLister
	// Limits are the tenant's (cloud.Tenant.Limits): tools.list shows
	// only the tools they allow.
	Limits cloud.Limits
}

// Config configures a Gateway. Tenants is required.
type Config struct {
	// Namespace is the fleet's namespace (cloud.Config.Namespace);
	// default "keel".
	Namespace string
	// Replicas of the streams and buckets created if none exist (as
	// jsstore.Config.Replicas); default 3.
	Replicas int
	// Tenants are served, each with its own token. At least one.
	Tenants []Tenant
	// AllowedHosts are the Host names clients may reach the gateway by
	// beside the loopback names (ipc.Config.AllowedHosts); default none.
	AllowedHosts []string
	// StartWait bounds how long run.start waits for a worker to create
	// the run it queued; the run stays queued after. Default 30 s.
	StartWait time.Duration
	// Version is the version initialize reports; default "dev".
	Version string
	// Logger; default discards.
	Logger *slog.Logger
}

// Gateway serves keel/1 to every tenant of its Config. Create it with
// New and serve with Run.
type Gateway struct {
	cfg     Config
	log     *slog.Logger
	tenants []*tenant
	nobody  *ipc.Server // answers requests that present no tenant's token
}

// tenant is one tenant's server.
type tenant struct {
	name string
	sum  [sha256.Size]byte // of its token
	srv  *ipc.Server
	feed *feed
}

// New opens every tenant's store (creating its streams if none exist)
// and builds its server.
func New(ctx context.Context, cfg Config) (*Gateway, error) {
	if len(cfg.Tenants) == 0 {
		return nil, errors.New("gateway: no tenants")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "keel"
	}
	if cfg.StartWait <= 0 {
		cfg.StartWait = 30 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{cfg: cfg, log: log}
	seen := map[[sha256.Size]byte]bool{}
	for _, t := range cfg.Tenants {
		if t.Token == "" || t.Conn == nil {
			return nil, fmt.Errorf("gateway: tenant %q needs a token and a connection", t.Name)
		}
		sum := sha256.Sum256([]byte(t.Token))
		if seen[sum] {
			return nil, fmt.Errorf("gateway: tenant %q has another tenant's token", t.Name)
		}
		seen[sum] = true
		js, err := jetstream.New(t.Conn)
		if err != nil {
			return nil, fmt.Errorf("gateway: tenant %s: %w", t.Name, err)
		}
		st, err := jsstore.Open(ctx, js, jsstore.Config{Namespace: cfg.Namespace, Replicas: cfg.Replicas})
		if err != nil {
			return nil, fmt.Errorf("gateway: tenant %s: %w", t.Name, err)
		}
		cl, err := cloud.NewClient(t.Conn, st, cloud.ClientConfig{Namespace: cfg.Namespace, Wait: cfg.StartWait})
		if err != nil {
			return nil, fmt.Errorf("gateway: tenant %s: %w", t.Name, err)
		}
		tlog := log.With(logkey.Tenant, t.Name)
		f := &feed{st: st, log: tlog, subs: map[*sub]struct{}{}}
		svc := ipc.Services{
			Runs:    &runs{st: st, js: js, ns: cfg.Namespace, wait: cfg.StartWait, feed: f, cl: cl, limits: t.Limits},
			History: history{st: st},
			Control: cl,
		}
		if t.Tools != nil {
			svc.Tools = catalog{tools: t.Tools, limits: t.Limits}
		}
		if t.Models != nil {
			svc.Models = catalog{models: t.Models, limits: t.Limits}
		}
		srv, err := ipc.NewServer(svc, ipc.Config{Token: t.Token, AllowedHosts: cfg.AllowedHosts, Logger: tlog, Version: cfg.Version})
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		g.tenants = append(g.tenants, &tenant{name: t.Name, sum: sum, srv: srv, feed: f})
	}
	var b [32]byte
	rand.Read(b[:])
	nobody, err := ipc.NewServer(ipc.Services{}, ipc.Config{Token: hex.EncodeToString(b[:]), AllowedHosts: cfg.AllowedHosts, Logger: log, Version: cfg.Version})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.nobody = nobody
	return g, nil
}

// Run serves on ln (a TCP listener, or a TLS listener over one) until
// ctx is done or ln fails, then closes ln and every client connection,
// and returns once every goroutine it started has exited. It returns nil
// after ctx is done. A Gateway runs once.
func (g *Gateway) Run(ctx context.Context, ln net.Listener) error {
	hs := make([]http.Handler, len(g.tenants))
	var stops []func()
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	for i, t := range g.tenants {
		h, stop, err := t.srv.Handler(ln.Addr())
		if err != nil {
			ln.Close()
			return fmt.Errorf("gateway: %w", err)
		}
		hs[i], stops = h, append(stops, stop)
	}
	none, stop, err := g.nobody.Handler(ln.Addr())
	if err != nil {
		ln.Close()
		return fmt.Errorf("gateway: %w", err)
	}
	stops = append(stops, stop)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if i := g.tenantOf(r); i >= 0 {
				hs[i].ServeHTTP(w, r)
				return
			}
			none.ServeHTTP(w, r) // checks Host, then refuses (401)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
		ConnContext:       ipc.ConnContext,
	}
	g.log.Info("gateway: serving", logkey.Addr, ln.Addr().String(), logkey.Tenants, len(g.tenants))
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	var runErr error
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
		cancel()
		<-serveErr
	case err := <-serveErr:
		runErr = fmt.Errorf("gateway: serve: %w", err)
		srv.Close()
	}
	return runErr // the deferred stops close the upgraded connections
}

// tenantOf returns the index of the tenant whose token r presents, or
// -1. Every presented token is compared with every tenant's, in
// constant time (of their SHA-256 sums): the time taken tells nothing
// of which tenant, if any, matched, nor of how much of a token did.
func (g *Gateway) tenantOf(r *http.Request) int {
	found := -1
	for _, tok := range ipc.PresentedTokens(r) {
		sum := sha256.Sum256([]byte(tok))
		for i, t := range g.tenants {
			if subtle.ConstantTimeCompare(sum[:], t.sum[:]) == 1 && found < 0 {
				found = i
			}
		}
	}
	return found
}

// runs is a tenant's Runs: run.start goes to the fleet's queue, events
// come from the tenant's journal.
type runs struct {
	st   *jsstore.Store
	js   jetstream.JetStream
	ns   string
	wait time.Duration
	feed *feed
	cl   *cloud.Client
	// limits are the tenant's: run.start is refused when they cap its
	// runs together and nothing is left.
	limits cloud.Limits
}

// Start queues req (with a random idempotency key if it has none) and
// returns the run once a worker has created it. A run that no worker
// created within the gateway's StartWait stays queued; the error, which
// wraps keel.ErrUnavailable, names its key. A tenant whose budget over
// all its runs is spent is refused (cloud.ErrBudget), before anything
// is queued.
func (r *runs) Start(ctx context.Context, req keel.StartRequest) (keel.Run, error) {
	if req.IdempotencyKey == "" {
		var b [16]byte
		rand.Read(b[:])
		req.IdempotencyKey = "ws-" + hex.EncodeToString(b[:])
	}
	if r.limits.TotalTokens > 0 || r.limits.TotalUSD > 0 {
		spent, err := cloud.ReadSpent(ctx, r.js, r.ns)
		if err != nil {
			return keel.Run{}, fmt.Errorf("%w: %v", keel.ErrUnavailable, err)
		}
		if err := r.limits.CheckBudget(spent); err != nil {
			return keel.Run{}, err
		}
	}
	if err := cloud.Submit(ctx, r.js, r.ns, req); err != nil {
		return keel.Run{}, fmt.Errorf("%w: queue the run: %v", keel.ErrUnavailable, err)
	}
	wctx, cancel := context.WithTimeout(ctx, r.wait)
	defer cancel()
	run, err := r.st.AwaitRun(wctx, req.IdempotencyKey)
	if err != nil {
		if ctx.Err() == nil && wctx.Err() != nil {
			return keel.Run{}, fmt.Errorf("%w: the run is queued with idempotency key %q, and no worker started it within %s", keel.ErrUnavailable, req.IdempotencyKey, r.wait)
		}
		return keel.Run{}, err
	}
	return run, nil
}

// Cancel stops the run on the worker that holds it (cloud.Client).
func (r *runs) Cancel(ctx context.Context, id keel.RunID) (keel.Run, error) {
	return r.cl.Cancel(ctx, id)
}

func (r *runs) Subscribe(fn func(keel.Event)) func() { return r.feed.subscribe(fn) }

// feed fans one following of a tenant's journal (jsstore.Follow) out to
// every subscriber: one consumer per tenant while anyone subscribes.
type feed struct {
	st  *jsstore.Store
	log *slog.Logger

	mu   sync.Mutex
	subs map[*sub]struct{}
	stop func() // the following, while subs is not empty
}

// sub is one subscriber; after it is cancelled its fn is not called.
type sub struct {
	mu      sync.Mutex
	stopped bool
	fn      func(keel.Event)
}

func (f *feed) subscribe(fn func(keel.Event)) (cancel func()) {
	s := &sub{fn: fn}
	f.mu.Lock()
	if f.stop == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		stop, err := f.st.Follow(ctx, f.publish, nil)
		cancel()
		if err != nil {
			f.mu.Unlock()
			f.log.Error("gateway: follow runs", logkey.Err, err)
			return func() {}
		}
		f.stop = stop
	}
	f.subs[s] = struct{}{}
	f.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.stopped = true
			s.mu.Unlock()
			f.mu.Lock()
			delete(f.subs, s)
			var stop func()
			if len(f.subs) == 0 {
				stop, f.stop = f.stop, nil
			}
			f.mu.Unlock()
			if stop != nil {
				stop()
			}
		})
	}
}

// publish hands ev to every subscriber; it is jsstore.Follow's fn.
func (f *feed) publish(ev keel.Event) {
	f.mu.Lock()
	subs := make([]*sub, 0, len(f.subs))
	for s := range f.subs {
		subs = append(subs, s)
	}
	f.mu.Unlock()
	for _, s := range subs {
		s.mu.Lock()
		if !s.stopped {
			s.fn(ev)
		}
		s.mu.Unlock()
	}
}

// history is a tenant's History: its journal, read through its store.
type history struct{ st *jsstore.Store }

var allStatuses = []keel.RunStatus{keel.RunQueued, keel.RunRunning, keel.RunWaiting, keel.RunPaused,
	keel.RunInterrupted, keel.RunSucceeded, keel.RunFailed, keel.RunCancelled}

// RunPage reads every run head of the tenant (jsstore.RunsWithStatus)
// and pages them, newest first; the cursor names the last run of the
// page before.
func (h history) RunPage(ctx context.Context, q keel.RunQuery) (keel.RunPage, error) {
	states := q.Status
	if len(states) == 0 {
		states = allStatuses
	}
	all, err := h.st.RunsWithStatus(ctx, states...)
	if err != nil {
		return keel.RunPage{}, err
	}
	slices.Reverse(all) // newest first
	start := 0
	if q.Cursor != "" {
		id, err := base64.RawURLEncoding.DecodeString(q.Cursor)
		i := slices.IndexFunc(all, func(r keel.Run) bool { return string(r.ID) == string(id) })
		if err != nil || i < 0 || strings.TrimSpace(string(id)) == "" {
			return keel.RunPage{}, fmt.Errorf("%w: cursor %q", keel.ErrInvalid, q.Cursor)
		}
		start = i + 1
	}
	limit := q.Limit
	if limit <= 0 {
		limit = 50
	}
	page := keel.RunPage{Runs: all[start:min(start+limit, len(all))]}
	if start+limit < len(all) {
		page.NextCursor = base64.RawURLEncoding.EncodeToString([]byte(page.Runs[len(page.Runs)-1].ID))
	}
	if page.Runs == nil {
		page.Runs = []keel.Run{}
	}
	return page, nil
}

func (h history) GetRun(ctx context.Context, id keel.RunID) (keel.Run, error) {
	return h.st.GetRun(ctx, id)
}

func (h history) Events(ctx context.Context, id keel.RunID, afterSeq int64) ([]keel.Event, error) {
	return h.st.Events(ctx, id, afterSeq)
}

func (h history) Spans(ctx context.Context, id keel.RunID) ([]keel.Span, error) {
	return h.st.Spans(ctx, id)
}
