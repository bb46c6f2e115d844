package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/internal/ctxtime"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/policy"
)

// Store is the persistence the engine needs: a run's journal and its
// trace, usually one database (store.Store).
type Store interface {
	Journal
	Tracer
}

// Journal holds runs and their events, the state a run resumes and is
// replayed from. A write returns once it is durable; errors wrap
// keel.ErrNotFound (no such run) or keel.ErrConflict (a run that exists
// already, a status change the lifecycle forbids).
type Journal interface {
	// CreateRun stores a new run.
	CreateRun(ctx context.Context, r keel.Run) error
	// CreateRunWith stores a new run and its first events (as AppendAll)
	// in one transaction.
	CreateRunWith(ctx context.Context, r keel.Run, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error)
	GetRun(ctx context.Context, id keel.RunID) (keel.Run, error)
	// AppendAll journals events (Type, Time, Data) in one transaction,
	// all or none, upd applying with the last, and returns them numbered.
	AppendAll(ctx context.Context, id keel.RunID, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error)
	// Events returns the run's events after afterSeq, in order.
	Events(ctx context.Context, id keel.RunID, afterSeq int64) ([]keel.Event, error)
	RunsWithStatus(ctx context.Context, states ...keel.RunStatus) ([]keel.Run, error)
	RunByIdempotencyKey(ctx context.Context, key string) (keel.Run, error)
}

// Tracer keeps runs' trace spans. When a span reaches the disk is the
// Tracer's choice, within one rule: a span that is the only record of
// something (what a failed model call spent, a person's answer ending a
// wait) is durable no later than the journal's next write. Spans returns
// every span started or finished before it is called.
type Tracer interface {
	// StartSpan records a running span; starting a span the run already
	// has (same ID) replaces it.
	StartSpan(ctx context.Context, sp keel.Span) error
	// FinishSpan records a span's outcome.
	FinishSpan(ctx context.Context, sp keel.Span) error
	// Sync returns once every span started or finished so far is durable.
	Sync(ctx context.Context) error
	// Spans returns the run's spans in start order.
	Spans(ctx context.Context, id keel.RunID) ([]keel.Span, error)
	// RunsWithOpenSpans returns the runs with a span still running.
	RunsWithOpenSpans(ctx context.Context) ([]keel.RunID, error)
}

// Model is the model provider the engine calls.
type Model interface {
	Models(ctx context.Context) ([]models.ModelInfo, error)
	Chat(ctx context.Context, req models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error)
}

// Tools runs tools. Call runs the call inv names, for the run step (or
// the person) inv says, validating its input against the tool's schema,
// and returns a *keel.ToolError on failure.
//
// Specs may wait for tools that are still loading, until ctx ends; it
// then returns the tools loaded so far. A Tools that can wait also
// implements Loading, so that Start never does: Start journals a run's
// start with its creation, in one commit, when Specs would not wait, and
// otherwise leaves the run queued for its loop to start.
type Tools interface {
	Specs(ctx context.Context) []keel.ToolSpec
	Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error)
}

// SideEffecter is implemented by Tools that can say one tool's
// side-effect class without listing every spec; the engine asks it at
// every tool step (whether the call may run twice).
type SideEffecter interface {
	SideEffects(name string) (keel.SideEffect, bool)
}

// PrivateReader is implemented by Tools that know which tools may read
// private data (a directory the user marked private). The output of
// such a tool makes the run private from that step on: no later
// request of the run, nor a summary of it, goes to a cloud model.
type PrivateReader interface {
	ReadsPrivate(name string) bool
}

// Offerer is implemented by Tools that offer a tool to some runs only:
// the knowledge_search tool, to runs whose policy lets them read a
// knowledge scope that holds something. The engine asks it for each tool
// when it lists a run's tools (at its start, a resume, a fork, a plan's
// steps); a tool not offered is left out, as one the run's policy does
// not name. It must be safe for concurrent use.
type Offerer interface {
	Offers(ctx context.Context, run keel.Run, name string) bool
}

// Loading is implemented by Tools whose Specs may wait: it reports
// whether Specs would wait now.
type Loading interface {
	Loading() bool
}

// Config configures an Engine. Store, Model and Tools are required.
type Config struct {
	Store Store
	Model Model
	Tools Tools
	// DefaultModel is used when a run names none. When empty, the first
	// local model with native tool calling is used, else the first model.
	DefaultModel string
	// RequireApproval lists the side-effect classes whose tool calls wait
	// for a person's approval before they run; empty (the default) means
	// runs advance by themselves. It is shorthand for run-layer rules
	// (policy.RequireApproval) added to Policy; an unknown class fails
	// New with keel.ErrInvalid.
	RequireApproval []keel.SideEffect
	// Policy, if set, is consulted before every tool call of a run:
	// allow runs it, ask waits for a person's approval bound to the
	// exact arguments, deny fails it as a policy_denied tool error the
	// model sees, without running the tool. A decision a rule or setting
	// made is journaled with the call (tool.call, approval.requested or
	// tool.result) and put on its span, so that a resume and a replay
	// use the decision in force at the time. A run's calls are decided
	// by the policy of its workspace (keel.Run.Workspace), which the
	// engine keeps in use while the run lives; a change of the policy in
	// force is journaled in the run (policy.changed; see PolicyChanged).
	// Nil: only RequireApproval decides.
	Policy Policy
	// DefaultMaxSteps bounds model calls per run; default 8.
	DefaultMaxSteps int
	// SystemPrompt opens every run's context; default DefaultSystemPrompt.
	SystemPrompt string
	// Now is the clock: event times, span starts, IDs and durations;
	// default time.Now.
	Now func() time.Time
	// Sleep waits d, or until ctx ends, and then returns ctx's error;
	// default a timer. The engine waits only before retrying a failed
	// step (keel.RunPolicy.RetryBackoff). A replay sleeps not at all.
	Sleep func(ctx context.Context, d time.Duration) error
	// NewID returns a fresh unique ID; default random hex.
	NewID func() string
	// Logger; default discards.
	Logger *slog.Logger
	// MaxParallelSteps is how many steps of one plan or DAG run may run
	// at once (each a sub-agent); default DefaultMaxParallelSteps (4). A
	// sub-agent waiting for a person holds its slot.
	MaxParallelSteps int
	// MaxReplans bounds how many times a plan run's planner revises its
	// plan after a step failed; default DefaultMaxReplans (2), negative
	// for none.
	MaxReplans int
	// ModelInterceptors see every model call a run makes (a step's, the
	// planner's, a summary's) before and after it, in the order package
	// intercept defines, with the run and step that call; one may deny a
	// call, which then fails without reaching the model. Nil: none. A
	// replay, which calls no model, runs none. They run on the run's
	// goroutine and must be safe for concurrent calls.
	ModelInterceptors intercept.Models
	// Audit, if set, records the tool calls of a run that never reach
	// Tools because a decision refused them: the policy denied the call
	// (policy_denied) or a person denied it (denied), each with the
	// decision (keel.ToolInvocation.Policy). The calls that reach Tools
	// are recorded there, by its interceptors (store.AuditTrail is both).
	// A replay records nothing. Nil: denied calls are only journaled.
	Audit DeniedCalls
	// Placer, if set, runs elsewhere the plan steps this environment
	// cannot: a step of a plan or DAG run that names a tool no tool
	// here provides is handed to the environment Placer names (another
	// daemon joined to the same cloud, the cloud), and the parent waits
	// for its end, durably (place.go). A plan may then name tools that
	// some environment declares. Nil (the default): every step is a
	// local sub-agent, and a plan naming a tool not here is invalid.
	Placer Placer
}

// DeniedCalls records the tool calls a decision kept from running (see
// Config.Audit); *store.AuditTrail is one. ToolDenied is called on the
// run's goroutine before the call's result is journaled, may be called
// concurrently for different calls, and reports nothing: a record it
// cannot write it logs.
type DeniedCalls interface {
	ToolDenied(ctx context.Context, inv keel.ToolInvocation, err *keel.ToolError)
}

// DefaultSystemPrompt is the system message of a run unless configured.
const DefaultSystemPrompt = "You are an agent running inside keel. Use the tools when they help; " +
	"when you have the answer, reply with it directly."

// MaxStepsLimit is the largest step limit a run may ask for.
const MaxStepsLimit = 100

var (
	errShutdown = errors.New("daemon shutting down")
	errCanceled = errors.New("cancelled by client")
)

// Engine runs agent runs. It is safe for concurrent use.
type Engine struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	active  map[keel.RunID]context.CancelCauseFunc
	pausing map[keel.RunID]bool         // pause asked; the loop stops at its next step boundary
	inbox   map[keel.RunID][]inboxMsg   // human messages the loop has not read yet
	held    map[keel.RunID][]keel.Event // journaled with the run's next event (see hold)
	order   map[keel.RunID]*pubOrder    // runs with appends in flight or events to publish; made on first use
	again   map[keel.RunID]bool         // answered while its loop was ending: launch again (see launchAnswered); made on first use
	traces  map[keel.RunID]*runTrace    // the open root and step spans of each running loop (see trace.go)
	runPol  map[keel.RunID]*runPolicy   // the policy of each running loop (see useWorkspace)
	closed  bool
	subs    map[int]func(keel.Event)
	nextSub int
	wg      sync.WaitGroup
	// fit fits a step's context to its model: fitContext, or in a
	// replay the journal's summaries (see Replay).
	fit fitFunc

	// calib corrects context-size estimates per model with the prompt
	// tokens models report (see fitContext).
	calib models.Calibration

	// runLayer is RequireApproval as a run-layer policy file, nil when
	// empty; emptyPolicy what it adds to when there is no Policy.
	runLayer    *policy.LayerFile
	emptyPolicy *policy.Policy
	pol         policyCache
	// replay, in a replay, holds the journal's decisions (see decideTool).
	replay *recorded

	// labels holds the context labels of live runs (see labels.go).
	labels labelTracker

	// deciding serializes the answers to a run's waits (Decide, Approve)
	// so that exactly one is journaled per wait.
	deciding runLocks
}

// New returns an Engine. Call Recover once before serving, and Close to
// stop every run.
func New(cfg Config) (*Engine, error) {
	if cfg.Store == nil || cfg.Model == nil || cfg.Tools == nil {
		return nil, errors.New("engine: Store, Model and Tools are required")
	}
	if cfg.DefaultMaxSteps <= 0 {
		cfg.DefaultMaxSteps = 8
	}
	if cfg.SystemPrompt == "" {
		cfg.SystemPrompt = DefaultSystemPrompt
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Sleep == nil {
		cfg.Sleep = ctxtime.Sleep
	}
	if cfg.NewID == nil {
		cfg.NewID = randomID
	}
	if cfg.MaxParallelSteps <= 0 {
		cfg.MaxParallelSteps = DefaultMaxParallelSteps
	}
	if cfg.MaxReplans == 0 {
		cfg.MaxReplans = DefaultMaxReplans
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	e := &Engine{cfg: cfg, log: log, active: map[keel.RunID]context.CancelCauseFunc{}, pausing: map[keel.RunID]bool{}, inbox: map[keel.RunID][]inboxMsg{}, held: map[keel.RunID][]keel.Event{}, traces: map[keel.RunID]*runTrace{}, runPol: map[keel.RunID]*runPolicy{}, subs: map[int]func(keel.Event){}}
	e.fit = e.fitContext
	if len(cfg.RequireApproval) > 0 {
		f, err := policy.RequireApproval(cfg.RequireApproval...)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		if _, err := policy.Compile(policy.Options{}, f); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		e.runLayer = &f
	}
	e.emptyPolicy, _ = policy.Compile(policy.Options{}) // no files: cannot fail
	return e, nil
}

func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Recover marks runs left queued or running by a previous daemon (which
// crashed or was killed) as interrupted, so a later issue's resume can
// pick them up and clients see an honest state, and closes every span
// the crash left running, in runs of any status (see closeSpans). It
// returns how many runs it marked. Call it before any run starts.
func (e *Engine) Recover(ctx context.Context) (int, error) {
	open, err := e.cfg.Store.RunsWithOpenSpans(ctx)
	if err != nil {
		return 0, fmt.Errorf("recover: %w", err)
	}
	for _, id := range open {
		e.closeSpans(ctx, id)
	}
	runs, err := e.cfg.Store.RunsWithStatus(ctx, keel.RunQueued, keel.RunRunning)
	if err != nil {
		return 0, fmt.Errorf("recover: %w", err)
	}
	for _, r := range runs {
		if _, err := e.appendEvent(ctx, r.ID, keel.EventRunInterrupted,
			keel.RunEndData{Status: keel.RunInterrupted, Reason: "daemon stopped while the run was in flight"},
			&keel.RunUpdate{Status: keel.RunInterrupted, Error: "daemon stopped while the run was in flight"}); err != nil {
			return 0, fmt.Errorf("recover %s: %w", r.ID, err)
		}
	}
	return len(runs), nil
}

// closeSpans ends the spans a crash left open in a run's trace, so the
// trace shows where the run was cut off instead of a step that never
// ends. A span whose outcome the journal holds (its call's model.result
// or tool.result, the approval.decision of a wait, the run's end for its
// root and step spans, journaled while the span's own finish, written
// lazily, was lost) is closed from it; any other (the call the daemon
// was in when it was killed) as failed, except in a run that waits or is
// paused, whose open spans are its wait.
func (e *Engine) closeSpans(ctx context.Context, id keel.RunID) {
	spans, err := e.cfg.Store.Spans(ctx, id)
	if err != nil {
		e.log.Warn("read spans to close", logkey.Run, id, logkey.Err, err)
		return
	}
	evs, err := e.cfg.Store.Events(ctx, id, 0)
	if err != nil {
		e.log.Warn("read the journal to close spans", logkey.Run, id, logkey.Err, err)
	}
	// A waiting or paused run's trace is open by design (its root, its
	// step, a person's wait): only what the journal shows ended closes.
	run, err := e.cfg.Store.GetRun(ctx, id)
	stopped := err == nil && (run.Status == keel.RunWaiting || run.Status == keel.RunPaused)
	now := e.cfg.Now()
	for _, sp := range spans {
		if sp.Status != keel.SpanRunning {
			continue
		}
		if !closeFromJournal(&sp, spans, evs) {
			if stopped {
				continue
			}
			sp.Status, sp.Error, sp.Duration = keel.SpanError, "the daemon stopped before this ended", max(0, now.Sub(sp.Start))
		}
		if err := e.cfg.Store.FinishSpan(ctx, sp); err != nil {
			e.log.Warn("close a span", logkey.Run, id, logkey.Span, sp.ID, logkey.Err, err)
		}
	}
}

// StartRequest asks for a new run; see keel.StartRequest.
type StartRequest = keel.StartRequest

// Start validates req, stores the run and starts it in the background.
// Errors wrap keel.ErrInvalid (bad request), keel.ErrModelUnavailable (no
// such model, or the provider is down) or keel.ErrUnavailable (closing).
func (e *Engine) Start(ctx context.Context, req StartRequest) (keel.Run, error) {
	req.Goal = strings.TrimSpace(req.Goal)
	if req.Goal == "" {
		return keel.Run{}, fmt.Errorf("goal is empty: %w", keel.ErrInvalid)
	}
	if req.MaxSteps < 0 || req.MaxSteps > MaxStepsLimit {
		return keel.Run{}, fmt.Errorf("max_steps %d out of range 0..%d: %w", req.MaxSteps, MaxStepsLimit, keel.ErrInvalid)
	}
	if req.MaxSteps == 0 {
		req.MaxSteps = e.cfg.DefaultMaxSteps
	}
	if err := validatePolicy(req.Policy, e.cfg.Now()); err != nil {
		return keel.Run{}, err
	}
	rules, err := normalizeRules(req.Policy.Rules)
	if err != nil {
		return keel.Run{}, err
	}
	req.Policy.Rules = rules
	if len(req.IdempotencyKey) > 200 {
		return keel.Run{}, fmt.Errorf("idempotency key longer than 200 bytes: %w", keel.ErrInvalid)
	}
	ws, err := checkWorkspace(req.Workspace)
	if err != nil {
		return keel.Run{}, err
	}
	plan, err := e.checkKind(ctx, req)
	if err != nil {
		return keel.Run{}, err
	}
	if req.IdempotencyKey != "" {
		if r, err := e.sameRun(ctx, req); err == nil || !errors.Is(err, keel.ErrNotFound) {
			return r, err
		}
	}
	model, err := e.resolveModel(ctx, req.Model)
	if err != nil {
		return keel.Run{}, err
	}
	now := e.cfg.Now()
	run := keel.Run{ID: keel.RunID("run_" + e.cfg.NewID()), Kind: req.Kind, Goal: req.Goal, Model: model, Status: keel.RunQueued,
		MaxSteps: req.MaxSteps, Policy: req.Policy, IdempotencyKey: req.IdempotencyKey, CreatedAt: now, UpdatedAt: now, Workspace: ws}
	rp, err := e.useWorkspace(run, "")
	if err != nil {
		return keel.Run{}, err
	}
	// The run's own rules must compile on top of its workspace's policy:
	// a file error (syntax, unknown field, a locked setting) refuses the
	// start, with its line and column; warnings are logged.
	if len(rules) > 0 {
		p, _, err := e.withRules(ws, rules)
		if err != nil {
			rp.release()
			return keel.Run{}, fmt.Errorf("policy.rules: %w: %w", keel.ErrInvalid, err)
		}
		for _, w := range p.Warnings() {
			if w.File == RunRulesFile {
				run.Warnings = append(run.Warnings, w.String())
			}
		}
	}
	// The run's inputs carry the labels asked for and those the policy
	// (of its workspace, with its rules) gives inputs; the run keeps
	// them, so its journal alone says what its context holds.
	run.Policy.Labels = unionNames(run.Policy.Labels, labelNames(e.labelPolicy(run).LabelsOf(policy.Source{Kind: policy.SourceInput})))
	// The policy in force at the start: a change before the run's first
	// decision is journaled.
	if p, _ := e.effective(run.Workspace, run.Policy.Rules); p != nil {
		rp.digest = p.Digest()
	}

	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		rp.release()
		return keel.Run{}, fmt.Errorf("engine closed: %w", keel.ErrUnavailable)
	}
	runCtx, cancel := context.WithCancelCause(context.Background())
	e.active[run.ID] = cancel
	e.runPol[run.ID] = rp
	e.wg.Add(1)
	e.mu.Unlock()

	untrack := e.trackFresh(run)
	fresh, err := e.create(ctx, &run, plan)
	if err != nil {
		untrack()
		e.mu.Lock()
		e.dropPolicy(run.ID)
		e.mu.Unlock()
		e.finish(run.ID)
		cancel(nil)
		if req.IdempotencyKey != "" && errors.Is(err, keel.ErrConflict) {
			return e.sameRun(ctx, req) // a concurrent Start with the key won
		}
		return keel.Run{}, fmt.Errorf("start run: %w", err)
	}
	fresh.untrack = untrack
	warnings := run.Warnings
	run.Warnings = nil // the loop's copy: not the start's result
	for _, w := range warnings {
		e.log.Warn("policy: the run's own rules", logkey.Run, run.ID, logkey.Err, w)
	}
	go func(run keel.Run) { // its own copy: the start's result gets the warnings below
		defer cancel(nil)
		defer e.finish(run.ID)
		defer e.flushHeld(runCtx, run.ID)
		e.loop(runCtx, run, fresh)
	}(run)
	run.Warnings = warnings
	return run, nil
}

// launch runs the loop of an existing run (resumed, or released by a
// decision) in the background. It fails when the run is already active
// or the engine is closed.
func (e *Engine) launch(run keel.Run) error {
	e.mu.Lock()
	rp := e.runPol[run.ID] // a run that waited keeps its workspace in use
	e.mu.Unlock()
	fresh := rp == nil
	if fresh {
		var err error
		if rp, err = e.useWorkspace(run, ""); err != nil {
			return err
		}
	}
	e.mu.Lock()
	if e.closed || e.active[run.ID] != nil {
		busy := !e.closed
		e.mu.Unlock()
		if fresh {
			rp.release()
		}
		if busy {
			return fmt.Errorf("run %s is already running: %w", run.ID, keel.ErrConflict)
		}
		return fmt.Errorf("engine closed: %w", keel.ErrUnavailable)
	}
	runCtx, cancel := context.WithCancelCause(context.Background())
	e.active[run.ID] = cancel
	if fresh && e.runPol[run.ID] == nil {
		e.runPol[run.ID] = rp
	} else if fresh {
		rp.release() // another launch registered it meanwhile
	}
	e.wg.Add(1)
	e.mu.Unlock()
	go func() {
		defer cancel(nil)
		defer e.finish(run.ID)
		defer e.flushHeld(runCtx, run.ID)
		e.loop(runCtx, run, nil)
	}()
	return nil
}

// sameRun returns the run an earlier Start with req's idempotency key
// created: keel.ErrNotFound if none did, keel.ErrConflict if it was
// started with a different goal.
func (e *Engine) sameRun(ctx context.Context, req StartRequest) (keel.Run, error) {
	r, err := e.cfg.Store.RunByIdempotencyKey(ctx, req.IdempotencyKey)
	if err != nil {
		return keel.Run{}, err
	}
	if r.Goal != req.Goal {
		return keel.Run{}, fmt.Errorf("idempotency key %q was used for run %s with another goal: %w", req.IdempotencyKey, r.ID, keel.ErrConflict)
	}
	return r, nil
}

func (e *Engine) finish(id keel.RunID) {
	e.mu.Lock()
	delete(e.active, id)
	delete(e.pausing, id)
	delete(e.inbox, id)
	again := e.again[id]
	delete(e.again, id)
	e.mu.Unlock()
	if again {
		e.relaunch(id)
	}
	e.wg.Done()
}

// relaunch launches run id again if it is still waiting with its wait
// answered: an answer came while its loop was ending (launchAnswered).
func (e *Engine) relaunch(id keel.RunID) {
	ctx := context.Background()
	r, err := e.cfg.Store.GetRun(ctx, id)
	if err != nil {
		e.log.Error("launch an answered run", logkey.Run, id, logkey.Err, err)
		return
	}
	if r.Status != keel.RunWaiting {
		return
	}
	if r.KindOrAgent() == keel.KindAgent {
		j, err := e.restore(ctx, r)
		if err != nil {
			e.log.Error("launch an answered run", logkey.Run, id, logkey.Err, err)
			return
		}
		if !j.answered() {
			return
		}
	}
	if err := e.launch(r); err != nil && !errors.Is(err, keel.ErrUnavailable) {
		e.log.Error("launch an answered run", logkey.Run, id, logkey.Err, err)
	} // closing: the next start's Resume launches it
}

func (e *Engine) resolveModel(ctx context.Context, name string) (string, error) {
	if name == "" {
		name = e.cfg.DefaultModel
	}
	list, err := e.cfg.Model.Models(ctx)
	if err != nil {
		return "", fmt.Errorf("%w: %w", keel.ErrModelUnavailable, err)
	}
	if name == "" {
		for _, m := range list {
			if m.Has(models.CapTools) {
				return m.Name, nil
			}
		}
		for _, m := range list {
			if m.Has(models.CapCompletion) {
				return m.Name, nil
			}
		}
		return "", fmt.Errorf("no local model can chat; pull one (for example `ollama pull qwen2.5:0.5b`) or pass --model: %w", keel.ErrModelUnavailable)
	}
	if r, ok := e.cfg.Model.(interface{ HasRoute(string) bool }); ok && r.HasRoute(name) {
		return name, nil // a routing rule: the model layer picks per call
	}
	var names []string
	for _, m := range list {
		full := m.Provider + "/" + m.Name
		if m.Name == name || strings.TrimSuffix(m.Name, ":latest") == name || full == name || strings.TrimSuffix(full, ":latest") == name {
			return name, nil
		}
		names = append(names, m.Name)
	}
	return "", fmt.Errorf("model %q is not available (have: %s); %s: %w",
		name, strings.Join(names, ", "), howToGet(name, list), keel.ErrModelUnavailable)
}

// howToGet says how to make the model name available: pulling it into
// Ollama, unless name is PROVIDER/MODEL of a provider that is not Ollama
// (an OpenAI-compatible server of models.json), which serves what it
// declares or discovers and cannot be pulled into.
func howToGet(name string, list []models.ModelInfo) string {
	if prov, model, ok := strings.Cut(name, "/"); ok && prov != "ollama" &&
		slices.ContainsFunc(list, func(m models.ModelInfo) bool { return m.Provider == prov }) {
		return fmt.Sprintf("provider %s does not serve %q: declare it in its models in models.json, or check the name (`keel models list` shows what each provider serves)", prov, model)
	}
	return fmt.Sprintf("pull it with `keel models pull %s` (or `ollama pull %s`)", name, name)
}

// Cancel stops a run. Cancelling a run that already ended fails with
// keel.ErrConflict; an unknown run with keel.ErrNotFound.
func (e *Engine) Cancel(ctx context.Context, id keel.RunID) (keel.Run, error) {
	e.mu.Lock()
	cancel, ok := e.active[id]
	e.mu.Unlock()
	if !ok {
		r, err := e.cfg.Store.GetRun(ctx, id)
		if err != nil {
			return keel.Run{}, err
		}
		if r.Status == keel.RunInterrupted || r.Status == keel.RunWaiting || r.Status == keel.RunPaused {
			// Nothing runs it; cancelling it makes the decision final.
			_, err := e.appendEvent(ctx, id, keel.EventRunCancelled, keel.RunEndData{Status: keel.RunCancelled, Reason: errCanceled.Error()},
				&keel.RunUpdate{Status: keel.RunCancelled, Error: errCanceled.Error()})
			if err != nil {
				return keel.Run{}, err
			}
			if r.KindOrAgent() != keel.KindAgent {
				e.cancelChildren(ctx, id) // no goroutine of its own to do it
			}
			return e.cfg.Store.GetRun(ctx, id)
		}
		return r, fmt.Errorf("run %s already %s: %w", id, r.Status, keel.ErrConflict)
	}
	// A run ends a moment before it leaves e.active; cancelling it then
	// is the same conflict as cancelling it later.
	r, err := e.cfg.Store.GetRun(ctx, id)
	if err != nil {
		return keel.Run{}, err
	}
	if r.Status.Terminal() {
		return r, fmt.Errorf("run %s already %s: %w", id, r.Status, keel.ErrConflict)
	}
	cancel(errCanceled)
	return e.cfg.Store.GetRun(ctx, id)
}

// Wait blocks until the run is no longer active in this engine or ctx ends.
func (e *Engine) Wait(ctx context.Context, id keel.RunID) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		e.mu.Lock()
		_, ok := e.active[id]
		e.mu.Unlock()
		if !ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Close stops every run in flight, leaving each interrupted with its
// journal intact, and waits for their goroutines. Start fails afterwards.
func (e *Engine) Close(ctx context.Context) error {
	e.mu.Lock()
	e.closed = true
	for _, cancel := range e.active {
		cancel(errShutdown)
	}
	e.mu.Unlock()
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("engine close: %w", ctx.Err())
	}
}
