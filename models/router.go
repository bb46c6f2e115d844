package models

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/keel-runtime/keel/internal/ctxtime"
	"github.com/keel-runtime/keel/internal/logkey"
)

// Target is one model a route may send a call to.
type Target struct {
	Provider string `json:"provider"`
	Model    string `json:"model"`
	// Weight is the target's share of an A/B split; 0 counts as 1.
	Weight int `json:"weight,omitempty"`
}

func (t Target) String() string { return t.Provider + "/" + t.Model }

// ParseTarget reads "provider/model". The model part may itself contain
// slashes (Ollama names such as "hf.co/org/model").
func ParseTarget(s string) (Target, error) {
	p, m, ok := strings.Cut(s, "/")
	if !ok || p == "" || m == "" {
		return Target{}, fmt.Errorf("model target %q: want provider/model", s)
	}
	return Target{Provider: p, Model: m}, nil
}

// Route is a routing rule: calls that name it (ChatRequest.Route, or no
// route and no model for the rule "default") go to one of Targets, picked
// by weight (an A/B split; the choice is recorded in CallMeta.Variant),
// then down Fallback in order while the failure allows it.
type Route struct {
	Name     string   `json:"name"`
	Targets  []Target `json:"targets"`
	Fallback []Target `json:"fallback,omitempty"`
}

// ProviderConfig is one provider behind the router with the limits the
// router enforces for it. Zero values take the defaults noted.
type ProviderConfig struct {
	Provider Provider
	// Cloud marks a provider whose calls leave this machine. Policy
	// decides which calls may go to it.
	Cloud bool
	// Prices per model name; models without one are free.
	Prices map[string]Price
	// Timeout bounds a whole call (default 10 minutes).
	Timeout time.Duration
	// FirstTokenTimeout bounds the wait for the first streamed fragment
	// (default 2 minutes: a local model may have to load first).
	FirstTokenTimeout time.Duration
	// MaxConcurrent caps calls in flight (default 4).
	MaxConcurrent int
	// RequestsPerMinute caps the call rate; 0 is no cap.
	RequestsPerMinute float64
	// MaxRetries is how often a retryable failure is retried on the same
	// model (default 2; negative means never).
	MaxRetries int
	// DefaultMaxTokens is the completion cap, and so the budget
	// reservation, of a call that sets none (default 512, which is also
	// what the Ollama provider caps a reply at by default).
	DefaultMaxTokens int
}

// Ledger persists what the day's calls spent, so the daily budget holds
// across restarts.
type Ledger interface {
	DaySpent(ctx context.Context, day string) (tokens int64, usd float64, err error)
	AddDaySpent(ctx context.Context, day string, tokens int64, usd float64) error
}

// RouterConfig configures a Router.
type RouterConfig struct {
	Providers map[string]ProviderConfig
	Routes    []Route
	// AllowCloud is the master switch for cloud providers; off by
	// default. A call reaches a cloud model only when this is on, the
	// call allows it (ChatRequest.AllowCloud) and nothing in it is
	// private.
	AllowCloud bool
	// Day limits what all calls of one UTC day may spend.
	Day Limits
	// Ledger persists the day's spending; nil keeps it in memory.
	Ledger Ledger
	// BackoffBase and BackoffMax shape the exponential backoff between
	// retries (defaults 500 ms and 20 s); each wait is jittered ±50%.
	BackoffBase, BackoffMax time.Duration
	// MaxRetryAfter is the longest Retry-After the router waits out;
	// a longer one moves on to the fallback (default 60 s).
	MaxRetryAfter time.Duration
	// ModelCacheTTL is how long a provider's model list is reused
	// (default 30 s).
	ModelCacheTTL time.Duration
	// Rand returns a number in [0, 1) for A/B splits and jitter; default
	// math/rand/v2.
	Rand func() float64
	// Now is the clock (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Router is the model layer as callers see it: it implements Provider
// over every configured provider and adds routing by rule, A/B splits,
// policy (cloud only where allowed, private content never), per-provider
// timeouts, rate limits and concurrency caps, classified retries with
// backoff and jitter, fallback chains, token and money budgets per run
// and per day, and accounting in ChatResponse.Meta.
type Router struct {
	cfg   RouterConfig
	log   *slog.Logger
	names []string // provider names, sorted, local first
	prov  map[string]*routed
	route map[string]Route

	dayMu  sync.Mutex
	day    string
	budget *Budget
}

type routed struct {
	name string
	cfg  ProviderConfig
	sem  chan struct{}
	lim  *rate.Limiter // nil: no cap

	mu      sync.Mutex
	models  []ModelInfo
	fetched time.Time
}

var _ Provider = (*Router)(nil)

// NewRouter checks cfg and returns a router.
func NewRouter(cfg RouterConfig) (*Router, error) {
	if len(cfg.Providers) == 0 {
		return nil, errors.New("models: router needs at least one provider")
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = 500 * time.Millisecond
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 20 * time.Second
	}
	if cfg.MaxRetryAfter <= 0 {
		cfg.MaxRetryAfter = time.Minute
	}
	if cfg.ModelCacheTTL <= 0 {
		cfg.ModelCacheTTL = 30 * time.Second
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r := &Router{cfg: cfg, log: cfg.Logger, prov: map[string]*routed{}, route: map[string]Route{}}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	for name, pc := range cfg.Providers {
		if pc.Provider == nil {
			return nil, fmt.Errorf("models: provider %q has no implementation", name)
		}
		if pc.Timeout <= 0 {
			pc.Timeout = 10 * time.Minute
		}
		if pc.FirstTokenTimeout <= 0 {
			pc.FirstTokenTimeout = 2 * time.Minute
		}
		if pc.MaxConcurrent <= 0 {
			pc.MaxConcurrent = 4
		}
		if pc.MaxRetries == 0 {
			pc.MaxRetries = 2
		}
		if pc.DefaultMaxTokens <= 0 {
			pc.DefaultMaxTokens = 512
		}
		rp := &routed{name: name, cfg: pc, sem: make(chan struct{}, pc.MaxConcurrent)}
		if pc.RequestsPerMinute > 0 {
			rp.lim = rate.NewLimiter(rate.Limit(pc.RequestsPerMinute/60), 1)
		}
		r.prov[name] = rp
		r.names = append(r.names, name)
	}
	slices.SortFunc(r.names, func(a, b string) int {
		ca, cb := r.prov[a].cfg.Cloud, r.prov[b].cfg.Cloud
		if ca != cb {
			if ca {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	for _, rt := range cfg.Routes {
		if rt.Name == "" || len(rt.Targets) == 0 {
			return nil, fmt.Errorf("models: route %q needs a name and at least one target", rt.Name)
		}
		if _, dup := r.route[rt.Name]; dup {
			return nil, fmt.Errorf("models: route %q is defined twice", rt.Name)
		}
		for _, t := range append(slices.Clone(rt.Targets), rt.Fallback...) {
			if _, ok := r.prov[t.Provider]; !ok {
				return nil, fmt.Errorf("models: route %q names provider %q, which is not configured", rt.Name, t.Provider)
			}
			if t.Weight < 0 {
				return nil, fmt.Errorf("models: route %q: negative weight for %s", rt.Name, t)
			}
		}
		r.route[rt.Name] = rt
	}
	return r, nil
}

// Name implements Provider.
func (r *Router) Name() string { return "router" }

// Models lists the models of every provider, local ones first, marked
// Cloud and priced as configured. A provider that cannot be reached is
// left out; only when none can be reached is the error returned.
func (r *Router) Models(ctx context.Context) ([]ModelInfo, error) {
	var all []ModelInfo
	var errs []error
	for _, name := range r.names {
		ms, err := r.prov[name].list(ctx, r.cfg.Now(), r.cfg.ModelCacheTTL)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		all = append(all, ms...)
	}
	if len(all) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return all, nil
}

// list returns the provider's models, cached for ttl.
func (p *routed) list(ctx context.Context, now time.Time, ttl time.Duration) ([]ModelInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.models != nil && now.Sub(p.fetched) < ttl {
		return p.models, nil
	}
	ms, err := p.cfg.Provider.Models(ctx)
	if err != nil {
		return nil, err
	}
	for i := range ms {
		ms[i].Provider = p.name
		ms[i].Cloud = ms[i].Cloud || p.cfg.Cloud
		if price, ok := p.cfg.Prices[ms[i].Name]; ok {
			ms[i].Price = &price
		}
	}
	p.models, p.fetched = ms, now
	return ms, nil
}

// info returns what the provider says about model; ok is false when the
// list cannot be had or does not name it.
func (p *routed) info(ctx context.Context, model string, now time.Time, ttl time.Duration) (ModelInfo, bool) {
	ms, err := p.list(ctx, now, ttl)
	if err != nil {
		return ModelInfo{}, false
	}
	for _, m := range ms {
		if m.Name == model {
			return m, true
		}
	}
	return ModelInfo{}, false
}

// plan returns the targets to try in order, the route's name and the
// A/B variant chosen.
func (r *Router) plan(ctx context.Context, req ChatRequest) (targets []Target, route, variant string, err error) {
	if req.Model != "" {
		if rt, ok := r.route[req.Model]; ok && req.Route == "" {
			return r.split(rt)
		}
		if t, perr := ParseTarget(req.Model); perr == nil {
			if _, ok := r.prov[t.Provider]; ok {
				return []Target{t}, "", "", nil
			}
		}
		// A bare model name: the first provider serving it, local first.
		for _, name := range r.names {
			if _, ok := r.prov[name].info(ctx, req.Model, r.cfg.Now(), r.cfg.ModelCacheTTL); ok {
				return []Target{{Provider: name, Model: req.Model}}, "", "", nil
			}
		}
		if len(r.names) == 1 {
			// Let the provider say what is wrong (not pulled, unreachable).
			return []Target{{Provider: r.names[0], Model: req.Model}}, "", "", nil
		}
		return nil, "", "", &Error{Kind: KindNotFound, Model: req.Model, Msg: "no configured provider serves this model; `keel models list` shows those that do"}
	}
	name := req.Route
	if name == "" {
		name = "default"
	}
	rt, ok := r.route[name]
	if !ok {
		return nil, "", "", &Error{Kind: KindInvalidRequest, Msg: fmt.Sprintf("no model named and no route %q configured", name)}
	}
	return r.split(rt)
}

// split picks one of rt's targets by weight, then lists the fallbacks.
func (r *Router) split(rt Route) ([]Target, string, string, error) {
	total := 0
	for _, t := range rt.Targets {
		total += max(t.Weight, 1)
	}
	pick := rt.Targets[0]
	x := r.cfg.Rand() * float64(total)
	for _, t := range rt.Targets {
		if x < float64(max(t.Weight, 1)) {
			pick = t
			break
		}
		x -= float64(max(t.Weight, 1))
	}
	targets := []Target{pick}
	for _, t := range rt.Fallback {
		if t.Provider != pick.Provider || t.Model != pick.Model {
			targets = append(targets, t)
		}
	}
	variant := ""
	if len(rt.Targets) > 1 {
		variant = pick.String()
	}
	return targets, rt.Name, variant, nil
}

// policy returns why req may not go to model of provider p, or nil.
// The caller's check (req.Admit, the policy) is asked first, so that a
// refusal both would make (private content to the cloud) is the
// policy's, recorded and explained by it; the router's own rules still
// hold for callers without one.
func (r *Router) policy(p *routed, model string, req ChatRequest) error {
	if req.Admit != nil {
		if err := req.Admit(p.name, model, p.cfg.Cloud); err != nil {
			return &Error{Kind: KindPolicy, Provider: p.name, Model: model, Msg: err.Error() + "; nothing was sent", Err: err}
		}
	}
	return r.cloudPolicy(p, req)
}

// cloudPolicy returns why req may not go to the cloud provider p, or nil.
func (r *Router) cloudPolicy(p *routed, req ChatRequest) error {
	if !p.cfg.Cloud {
		return nil
	}
	var why string
	switch {
	case req.IsPrivate():
		why = "the request holds content marked private, which never leaves this machine"
	case !r.cfg.AllowCloud:
		why = "cloud models are switched off (set allow_cloud in the models configuration to use them)"
	case !req.AllowCloud:
		why = "this call does not allow cloud models (start the run with --allow-cloud)"
	default:
		return nil
	}
	return &Error{Kind: KindPolicy, Provider: p.name, Msg: why + "; nothing was sent"}
}

// Chat routes req and returns the first successful reply. See Router.
func (r *Router) Chat(ctx context.Context, req ChatRequest, onDelta func(Delta)) (ChatResponse, error) {
	start := r.cfg.Now()
	targets, route, variant, err := r.plan(ctx, req)
	if err != nil {
		return ChatResponse{}, err
	}
	meta := CallMeta{Route: route, Variant: variant}
	st := &stream{onDelta: onDelta}
	var last error
	for _, t := range targets {
		p := r.prov[t.Provider]
		if err := r.policy(p, t.Model, req); err != nil {
			last = err
			meta.Attempts = append(meta.Attempts, Attempt{Provider: t.Provider, Model: t.Model, Kind: KindPolicy, Error: err.Error()})
			continue
		}
		treq := req
		treq.Model = t.Model
		for retry := 0; ; retry++ {
			attemptStart := r.cfg.Now()
			resp, err := r.try(ctx, p, treq, st, &meta)
			if err == nil {
				resp.Meta.Route, resp.Meta.Variant = meta.Route, meta.Variant
				resp.Meta.Attempts, resp.Meta.Retries = meta.Attempts, meta.Retries
				resp.Meta.Latency = r.cfg.Now().Sub(start)
				return resp, nil
			}
			kind := KindOf(err)
			if ctx.Err() != nil {
				return ChatResponse{}, &Error{Kind: KindCancelled, Provider: t.Provider, Model: t.Model, Msg: "the call was cancelled", Err: ctx.Err()}
			}
			last = err
			meta.Attempts = append(meta.Attempts, Attempt{Provider: t.Provider, Model: t.Model, Kind: kind, Error: err.Error(), Duration: r.cfg.Now().Sub(attemptStart)})
			r.log.LogAttrs(ctx, slog.LevelWarn, "models: call failed", slog.String(logkey.Target, t.String()), slog.String(logkey.ErrKind, string(kind)), slog.Int(logkey.Retry, retry), slog.String(logkey.Err, err.Error()))
			if !kind.Retryable() || retry >= p.cfg.MaxRetries || p.cfg.MaxRetries < 0 {
				break
			}
			wait := r.backoff(retry)
			if ra := RetryAfterOf(err); ra > 0 {
				if ra > r.cfg.MaxRetryAfter {
					break // not worth waiting: try the fallback
				}
				wait = ra
			}
			if err := ctxtime.Sleep(ctx, wait); err != nil {
				return ChatResponse{}, &Error{Kind: KindCancelled, Provider: t.Provider, Model: t.Model, Msg: "the call was cancelled", Err: err}
			}
			meta.Retries++
		}
		if !KindOf(last).Fallback() {
			return ChatResponse{}, last
		}
	}
	if len(meta.Attempts) > 1 {
		return ChatResponse{}, fmt.Errorf("%w (after %d attempts: %s)", last, len(meta.Attempts), attemptSummary(meta.Attempts))
	}
	return ChatResponse{}, last
}

func attemptSummary(as []Attempt) string {
	parts := make([]string, len(as))
	for i, a := range as {
		parts[i] = a.Provider + "/" + a.Model + " " + string(a.Kind)
	}
	return strings.Join(parts, ", ")
}

// backoff is the wait before retry n (0-based): exponential, capped,
// jittered ±50%.
func (r *Router) backoff(n int) time.Duration {
	d := r.cfg.BackoffBase << min(n, 16)
	if d > r.cfg.BackoffMax || d <= 0 {
		d = r.cfg.BackoffMax
	}
	return time.Duration(float64(d) * (0.5 + r.cfg.Rand()))
}

// stream forwards deltas to the caller across attempts: after an attempt
// that streamed something failed, the next attempt's first delta carries
// Restart.
type stream struct {
	onDelta  func(Delta)
	streamed bool // the current attempt has forwarded content
	restart  bool // the next forwarded delta must carry Restart
}

func (s *stream) newAttempt() {
	if s.streamed {
		s.restart, s.streamed = true, false
	}
}

func (s *stream) emit(d Delta) {
	if s.onDelta == nil || d.Content == "" {
		return
	}
	if s.restart {
		d.Restart, s.restart = true, false
	}
	s.streamed = true
	s.onDelta(d)
}

// Causes of a call the router itself stops.
var (
	errFirstToken = errors.New("no first token in time")
	errCallTime   = errors.New("the call ran out of time")
	errSpent      = errors.New("the reply reached its reserved tokens")
)

// try makes one attempt on one provider: context check, budget
// reservation, rate and concurrency limits, the timed call, settlement.
func (r *Router) try(ctx context.Context, p *routed, req ChatRequest, st *stream, meta *CallMeta) (ChatResponse, error) {
	st.newAttempt()
	now := r.cfg.Now()
	info, known := p.info(ctx, req.Model, now, r.cfg.ModelCacheTTL)
	prompt := EstimateTokens(req.Messages, req.Tools)
	maxOut := req.MaxTokens
	if maxOut <= 0 {
		maxOut = p.cfg.DefaultMaxTokens
	}
	if known && info.ContextLength > 0 {
		if prompt >= info.ContextLength {
			return ChatResponse{}, &Error{Kind: KindContextTooLong, Provider: p.name, Model: req.Model,
				Msg: fmt.Sprintf("the prompt is about %d tokens and the model's context holds %d; shorten it or use a model with a longer context", prompt, info.ContextLength)}
		}
		maxOut = min(maxOut, info.ContextLength-prompt)
	}
	var price *Price
	if pr, ok := p.cfg.Prices[req.Model]; ok {
		price = &pr
	}
	day := r.dayBudget(ctx)
	// Reserve the worst case, shrinking the completion cap to what the
	// budgets have left rather than refusing outright.
	for _, b := range []*Budget{req.Budget, day} {
		if b == nil {
			continue
		}
		leftTok, leftUSD := b.Left()
		if leftTok >= 0 {
			maxOut = min(maxOut, int(leftTok)-prompt)
		}
		if leftUSD >= 0 && price != nil && price.OutputPerMTok > 0 {
			maxOut = min(maxOut, int((leftUSD-price.Cost(prompt, 0))*1e6/price.OutputPerMTok))
		}
	}
	const minOut = 16
	if maxOut < minOut {
		maxOut = minOut // too little left: let Reserve say which budget
	}
	res, err := Reserve(int64(prompt+maxOut), price.Cost(prompt, maxOut), req.Budget, day)
	if err != nil {
		var be *Error
		if errors.As(err, &be) {
			be.Provider, be.Model = p.name, req.Model
		}
		return ChatResponse{}, err
	}
	var usage Usage
	defer func() { r.settle(ctx, res, usage, price) }()
	if p.lim != nil {
		if err := p.lim.Wait(ctx); err != nil {
			return ChatResponse{}, err
		}
	}
	select {
	case p.sem <- struct{}{}:
		defer func() { <-p.sem }()
	case <-ctx.Done():
		return ChatResponse{}, ctx.Err()
	}

	callCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	callCtx, cancelT := context.WithTimeoutCause(callCtx, p.cfg.Timeout, errCallTime)
	defer cancelT()
	first := time.AfterFunc(p.cfg.FirstTokenTimeout, func() { cancel(errFirstToken) })
	defer first.Stop()
	started := time.Now()
	var ttft time.Duration
	outBytes, chunks := 0, 0
	req.MaxTokens = maxOut
	resp, err := p.cfg.Provider.Chat(callCtx, req, func(d Delta) {
		if ttft == 0 {
			ttft = time.Since(started)
			first.Stop()
		}
		if d.Content != "" {
			chunks++ // a chunk without content (a tool call, the end) may not count: it may be one past the cap
		}
		outBytes += len(d.Content)
		// Stop a reply that outgrows its reservation (a provider that
		// ignores the completion cap); what overflows is not delivered.
		if max(chunks, outBytes/4) > maxOut {
			cancel(errSpent)
			return
		}
		st.emit(d)
	})
	usage = resp.Usage
	if usage.PromptTokens == 0 && usage.CompletionTokens == 0 && err == nil {
		usage = Usage{PromptTokens: prompt, CompletionTokens: max(chunks, (outBytes+BytesPerToken-1)/BytesPerToken)}
	}
	if err != nil {
		if usage == (Usage{}) {
			// A failed call may still have cost something; count what streamed.
			usage = Usage{PromptTokens: prompt, CompletionTokens: max(chunks, outBytes/4)}
			if chunks == 0 {
				usage = Usage{}
			}
		}
		if ctx.Err() == nil {
			switch cause := context.Cause(callCtx); {
			case errors.Is(cause, errFirstToken):
				return ChatResponse{}, &Error{Kind: KindTimeout, Provider: p.name, Model: req.Model, Msg: fmt.Sprintf("no first token within %s", p.cfg.FirstTokenTimeout)}
			case errors.Is(cause, errCallTime):
				return ChatResponse{}, &Error{Kind: KindTimeout, Provider: p.name, Model: req.Model, Msg: fmt.Sprintf("the reply did not finish within %s", p.cfg.Timeout)}
			case errors.Is(cause, errSpent):
				return ChatResponse{}, &Error{Kind: KindBudget, Provider: p.name, Model: req.Model, Msg: fmt.Sprintf("the reply was stopped at its reserved %d tokens", maxOut)}
			}
		}
		return ChatResponse{}, err
	}
	resp.Meta.Provider = p.name
	resp.Meta.CostUSD = price.Cost(usage.PromptTokens, usage.CompletionTokens)
	resp.Meta.FirstByte = ttft
	if resp.Model == "" {
		resp.Model = req.Model
	}
	return resp, nil
}

// settle charges the reservation with what was spent and records the
// day's spending in the ledger.
func (r *Router) settle(ctx context.Context, res *Reservation, u Usage, price *Price) {
	tokens := int64(u.PromptTokens + u.CompletionTokens)
	usd := price.Cost(u.PromptTokens, u.CompletionTokens)
	res.Settle(tokens, usd)
	if r.cfg.Ledger != nil && tokens > 0 {
		r.dayMu.Lock()
		day := r.day
		r.dayMu.Unlock()
		if err := r.cfg.Ledger.AddDaySpent(context.WithoutCancel(ctx), day, tokens, usd); err != nil {
			r.log.Warn("models: record the day's spending", logkey.Err, err)
		}
	}
}

// dayBudget returns the budget of the current UTC day, loading what the
// ledger says was spent when the day changes.
func (r *Router) dayBudget(ctx context.Context) *Budget {
	day := r.cfg.Now().UTC().Format(time.DateOnly)
	r.dayMu.Lock()
	defer r.dayMu.Unlock()
	if r.day == day && r.budget != nil {
		return r.budget
	}
	var tok int64
	var usd float64
	if r.cfg.Ledger != nil {
		var err error
		if tok, usd, err = r.cfg.Ledger.DaySpent(ctx, day); err != nil {
			r.log.Warn("models: read the day's spending", logkey.Err, err)
		}
	}
	r.day, r.budget = day, NewBudget("daily", r.cfg.Day, tok, usd)
	return r.budget
}

// DaySpent returns what today's calls spent.
func (r *Router) DaySpent(ctx context.Context) (tokens int64, usd float64) {
	return r.dayBudget(ctx).Spent()
}

// AllowCloud reports the master switch for cloud providers
// (RouterConfig.AllowCloud).
func (r *Router) AllowCloud() bool { return r.cfg.AllowCloud }

// IsCloud reports whether provider is a configured cloud provider
// (false for a local one and for a name not configured).
func (r *Router) IsCloud(provider string) bool {
	p := r.prov[provider]
	return p != nil && p.cfg.Cloud
}

// HasRoute reports whether a routing rule called name is configured.
func (r *Router) HasRoute(name string) bool {
	_, ok := r.route[name]
	return ok
}

// Embed routes an embedding request: to req.Model ("provider/model" or a
// bare name served by some provider) or, when empty, to the route named
// "embedding". Cloud policy applies as for Chat; embedding requests are
// not retried.
func (r *Router) Embed(ctx context.Context, req EmbedRequest) (EmbedResponse, error) {
	creq := ChatRequest{Model: req.Model, Private: req.Private}
	if req.Model == "" {
		creq.Route = "embedding"
	}
	targets, _, _, err := r.plan(ctx, creq)
	if err != nil {
		return EmbedResponse{}, err
	}
	var last error
	for _, t := range targets {
		p := r.prov[t.Provider]
		if err := r.policy(p, t.Model, creq); err != nil {
			last = err
			continue
		}
		em, ok := p.cfg.Provider.(Embedder)
		if !ok {
			last = &Error{Kind: KindInvalidRequest, Provider: t.Provider, Model: t.Model, Msg: "this provider serves no embeddings"}
			continue
		}
		req.Model = t.Model
		resp, err := em.Embed(ctx, req)
		if err == nil {
			return resp, nil
		}
		last = err
		if !KindOf(err).Fallback() {
			break
		}
	}
	return EmbedResponse{}, last
}
