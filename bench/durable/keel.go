package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
)

// tools is the benchmark's in-memory tool runner: "echo" (read-only)
// returns its input, "write" (non-idempotent, so it can be made to wait
// for approval) pretends to write. Neither does I/O.
type tools struct{}

var toolSpecs = []keel.ToolSpec{
	{Name: "echo", Description: "echo text", SideEffects: keel.SideEffectReadOnly,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`)},
	{Name: "write", Description: "pretends to write", SideEffects: keel.SideEffectNonIdempotentWrite,
		InputSchema: json.RawMessage(`{"type":"object"}`)},
}

func (tools) Specs(context.Context) []keel.ToolSpec { return slices.Clone(toolSpecs) }

func (tools) Call(ctx context.Context, inv keel.ToolInvocation) (json.RawMessage, error) {
	switch inv.Name {
	case "echo":
		return inv.Args, nil
	case "write":
		return json.RawMessage(`{"written":true}`), nil
	}
	return nil, &keel.ToolError{Code: keel.ToolNotFound, Message: "no tool " + inv.Name}
}

// chain is the benchmark's model: a deterministic graph of n steps. Each
// run's first n-1 calls ask for the echo tool, the n-th answers. It
// counts the tool results in the conversation to know where it is, and
// keeps nothing: unlike the scripted test provider, which records every
// request (a copy of the whole conversation at each step), its cost does
// not grow with the run, so what is timed is keel's.
type chain struct{ n int }

func (chain) Models(context.Context) ([]models.ModelInfo, error) {
	return []models.ModelInfo{scripted.DefaultModel}, nil
}

func (c chain) Chat(_ context.Context, req models.ChatRequest, _ func(models.Delta)) (models.ChatResponse, error) {
	done := 0
	for _, m := range req.Messages {
		if m.Role == models.RoleTool {
			done++
		}
	}
	msg := models.Message{Role: models.RoleAssistant}
	finish := "stop"
	if done < c.n-1 {
		msg.ToolCalls = []keel.ToolCall{{ID: fmt.Sprintf("call_%d", done+1), Name: "echo", Arguments: json.RawMessage(`{"text":"hi"}`)}}
		finish = "tool_calls"
	} else {
		msg.Content = "done"
	}
	return models.ChatResponse{Model: req.Model, FinishReason: finish, Message: msg,
		Usage: models.Usage{PromptTokens: 10, CompletionTokens: 5}}, nil
}

// writer is a model that asks for the "write" tool at every call. Unlike
// the scripted provider, which records every request it gets, it keeps
// nothing, so the memory measured per waiting run is the engine's and the
// store's alone.
type writer struct{}

func (writer) Models(context.Context) ([]models.ModelInfo, error) {
	return []models.ModelInfo{scripted.DefaultModel}, nil
}

func (writer) Chat(_ context.Context, req models.ChatRequest, _ func(models.Delta)) (models.ChatResponse, error) {
	return models.ChatResponse{Model: req.Model, FinishReason: "tool_calls", Message: models.Message{Role: models.RoleAssistant,
		ToolCalls: []keel.ToolCall{{Name: "write", Arguments: json.RawMessage(`{"n":1}`)}}}}, nil
}

// bed is a store on a fresh database file and an engine over it.
type bed struct {
	st  *store.Store
	eng *engine.Engine
}

func newBed(ctx context.Context, path, synchronous string, model engine.Model, maxSteps int, approve ...keel.SideEffect) (*bed, error) {
	return newPolicyBed(ctx, path, synchronous, model, maxSteps, nil, approve...)
}

// newPolicyBed is newBed with pol in force (nil: no policy).
func newPolicyBed(ctx context.Context, path, synchronous string, model engine.Model, maxSteps int, pol engine.Policy, approve ...keel.SideEffect) (*bed, error) {
	st, err := store.OpenWith(ctx, path, store.Options{Synchronous: synchronous})
	if err != nil {
		return nil, err
	}
	eng, err := engine.New(engine.Config{Store: st, Model: model, Tools: tools{}, DefaultMaxSteps: maxSteps, RequireApproval: approve, Policy: pol})
	if err != nil {
		st.Close()
		return nil, err
	}
	return &bed{st: st, eng: eng}, nil
}

// Close stops the engine (runs still going are left interrupted) and
// closes the store.
func (b *bed) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return errors.Join(b.eng.Close(ctx), b.st.Close())
}

// tracker follows runs through an engine's event stream: it counts
// journaled events and steps (model results), and closes done once want
// runs have stopped, by ending or by waiting for an approval.
type tracker struct {
	steps, events atomic.Int64
	unsub         func()
	done          chan struct{}

	mu      sync.Mutex
	want    int
	stopped int
	failed  error // the first run that stopped otherwise
}

func track(eng *engine.Engine, want int) *tracker {
	t := &tracker{want: want, done: make(chan struct{})}
	t.unsub = eng.Subscribe(t.see)
	return t
}

func (t *tracker) see(ev keel.Event) {
	if ev.Seq == 0 {
		return // a live-only model delta
	}
	t.events.Add(1)
	var failed error
	switch ev.Type {
	case keel.EventModelResult:
		t.steps.Add(1)
		return
	case keel.EventRunSucceeded, keel.EventApprovalAsked:
	case keel.EventRunFailed, keel.EventRunCancelled, keel.EventRunInterrupted, keel.EventRunWaiting, keel.EventRunPaused:
		failed = fmt.Errorf("run %s: %s %s", ev.RunID, ev.Type, ev.Data)
	default:
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if failed != nil && t.failed == nil {
		t.failed = failed
	}
	t.stopped++
	if t.stopped == t.want {
		close(t.done)
	}
}

// wait waits until every run tracked has stopped, for at most limit.
func (t *tracker) wait(limit time.Duration) error {
	defer t.unsub()
	select {
	case <-t.done:
	case <-time.After(limit):
		t.mu.Lock()
		defer t.mu.Unlock()
		return fmt.Errorf("%d of %d runs stopped in %v", t.stopped, t.want, limit)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

// batch is what running c runs together measured.
type batch struct {
	elapsed                time.Duration
	end                    time.Time // when the last run stopped
	steps, events, commits int64
	ids                    []keel.RunID
}

// runAll starts c runs together, each in its own goroutine (goals "prefix
// i", n steps at most), and waits until all have stopped.
func runAll(ctx context.Context, b *bed, prefix string, c, n int) (batch, error) {
	t := track(b.eng, c)
	ids := make([]keel.RunID, c)
	errs := make([]error, c)
	var wg sync.WaitGroup
	commits := b.st.Commits()
	start := time.Now()
	for i := range c {
		wg.Go(func() {
			r, err := b.eng.Start(ctx, engine.StartRequest{Goal: fmt.Sprintf("%s %d", prefix, i), MaxSteps: n})
			ids[i], errs[i] = r.ID, err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.unsub()
		return batch{}, err
	}
	if err := t.wait(30 * time.Minute); err != nil {
		return batch{}, err
	}
	end := time.Now()
	elapsed := end.Sub(start)
	return batch{elapsed: elapsed, end: end, steps: t.steps.Load(), events: t.events.Load(), commits: b.st.Commits() - commits, ids: ids}, nil
}

// keelOne is one run's cost per journaled step and per event, and per
// commit against the floor measured just before it.
type keelOne struct {
	perStep, perEvent time.Duration
	events            int   // in the run's journal
	commits           int64 // transactions the run's writes took
	// Paired with the floor: each repetition times floorPair bare
	// commits, then one keel run; the medians over the repetitions of
	// keel's per-commit and per-step cost divided by that floor's mean.
	commitRatio, stepRatio float64
	// The same per step, counting the run until its trace is on disk
	// too (its spans commit right after its end, which does not wait
	// for them).
	tracedRatio float64
}

// floorPair is how many bare commits are timed before each keel run.
const floorPair = 100

// warmCommits is how many commits make a database warm: past SQLite's
// first automatic checkpoint (1000 WAL pages), whatever a commit writes.
const warmCommits = 1200

// measureKeelOne times one run of n steps on a fresh store, after one
// untimed run: the median of reps runs made one after the other, each
// right after floorPair commits of f, so that each run has a floor taken
// on the disk as it was at that moment (its latency drifts).
func measureKeelOne(ctx context.Context, dir, synchronous string, n, reps int, f *floorDB) (keelOne, error) {
	b, err := newBed(ctx, filepath.Join(dir, "keel-one-"+synchronous+".db"), synchronous, chain{n}, n)
	if err != nil {
		return keelOne{}, err
	}
	defer b.Close()
	// Warm up past the first checkpoint, as the floor does: from then on
	// the WAL is reused rather than grown (growing a file makes an fsync
	// dearer), as in a daemon that has been running.
	for i := 0; b.st.Commits() < warmCommits; i++ {
		if _, err := runAll(ctx, b, fmt.Sprintf("warm-up-%d", i), 1, n); err != nil {
			return keelOne{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	bts := make([]batch, reps)
	commitRatios, stepRatios, tracedRatios := make([]float64, reps), make([]float64, reps), make([]float64, reps)
	for i := range bts {
		fd, err := f.commits(ctx, floorPair)
		if err != nil {
			return keelOne{}, fmt.Errorf("floor: %w", err)
		}
		bt, err := runAll(ctx, b, fmt.Sprintf("one-%d", i), 1, n)
		if err != nil {
			return keelOne{}, err
		}
		// The run's spans commit right after its end: wait for them, so
		// that the next floor commits do not share the disk with them.
		if err := b.st.Sync(ctx); err != nil {
			return keelOne{}, err
		}
		traced := bt.elapsed + time.Since(bt.end)
		if bt.steps != int64(n) {
			return keelOne{}, fmt.Errorf("the run made %d steps, want %d", bt.steps, n)
		}
		bts[i] = bt
		floor := float64(mean(fd))
		commitRatios[i] = float64(bt.elapsed) / float64(bt.commits) / floor
		stepRatios[i] = float64(bt.elapsed) / float64(n) / floor
		tracedRatios[i] = float64(traced) / float64(n) / floor
	}
	slices.SortFunc(bts, func(a, b batch) int { return cmp.Compare(a.elapsed, b.elapsed) })
	slices.Sort(commitRatios)
	slices.Sort(stepRatios)
	slices.Sort(tracedRatios)
	bt := bts[reps/2]
	evs, err := b.st.Events(ctx, bt.ids[0], 0)
	if err != nil {
		return keelOne{}, err
	}
	return keelOne{perStep: bt.elapsed / time.Duration(n), perEvent: bt.elapsed / time.Duration(len(evs)), events: len(evs), commits: bt.commits,
		commitRatio: commitRatios[reps/2], stepRatio: stepRatios[reps/2], tracedRatio: tracedRatios[reps/2]}, nil
}

// keelMany is the throughput of c runs going together.
type keelMany struct {
	c                     int
	elapsed               time.Duration
	stepsPerS, eventsPerS float64
}

// measureKeelMany times c runs of n steps started together on a fresh
// store, after one untimed run.
func measureKeelMany(ctx context.Context, dir, synchronous string, n, c int) (keelMany, error) {
	b, err := newBed(ctx, filepath.Join(dir, fmt.Sprintf("keel-%d-%s.db", c, synchronous)), synchronous, chain{n}, n)
	if err != nil {
		return keelMany{}, err
	}
	defer b.Close()
	if _, err := runAll(ctx, b, "warm-up", 1, n); err != nil {
		return keelMany{}, fmt.Errorf("warm-up: %w", err)
	}
	bt, err := runAll(ctx, b, "run", c, n)
	if err != nil {
		return keelMany{}, err
	}
	if bt.steps != int64(c*n) {
		return keelMany{}, fmt.Errorf("%d runs made %d steps, want %d", c, bt.steps, c*n)
	}
	s := bt.elapsed.Seconds()
	return keelMany{c: c, elapsed: bt.elapsed, stepsPerS: float64(bt.steps) / s, eventsPerS: float64(bt.events) / s}, nil
}

// keelWaiting is what a run waiting for a person costs while it waits.
type keelWaiting struct {
	runs          int
	heapPerRun    float64 // bytes of live Go heap
	goroutinesPer float64
}

// measureKeelWaiting starts m runs whose only tool call needs approval,
// waits until all are waiting, and compares the live Go heap (after GC)
// and the goroutine count with those before they started.
func measureKeelWaiting(ctx context.Context, dir string, m int) (keelWaiting, error) {
	b, err := newBed(ctx, filepath.Join(dir, "keel-waiting.db"), "FULL", writer{}, 4, keel.SideEffectNonIdempotentWrite)
	if err != nil {
		return keelWaiting{}, err
	}
	defer b.Close()
	if _, err := runAll(ctx, b, "warm-up", 1, 4); err != nil {
		return keelWaiting{}, fmt.Errorf("warm-up: %w", err)
	}
	heap := func() (uint64, int) {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc, runtime.NumGoroutine()
	}
	heap0, g0 := heap()
	bt, err := runAll(ctx, b, "wait", m, 4)
	if err != nil {
		return keelWaiting{}, err
	}
	// A run's goroutine returns just after journaling its approval request.
	for _, id := range bt.ids {
		if err := b.eng.Wait(ctx, id); err != nil {
			return keelWaiting{}, err
		}
	}
	waiting, err := b.st.RunsWithStatus(ctx, keel.RunWaiting)
	if err != nil {
		return keelWaiting{}, err
	}
	if len(waiting) != m+1 {
		return keelWaiting{}, fmt.Errorf("%d runs waiting, want %d", len(waiting), m+1)
	}
	heap1, g1 := heap()
	return keelWaiting{runs: m, heapPerRun: (float64(heap1) - float64(heap0)) / float64(m),
		goroutinesPer: float64(g1-g0) / float64(m)}, nil
}

// keelResume is how long resuming k interrupted runs took.
type keelResume struct {
	runs            int
	launched, ended time.Duration
}

// measureKeelResume writes k interrupted runs as a daemon that died leaves
// them (the model asked for echo, the call's intent was journaled, its
// result was not), then times engine.New and Resume until every run has
// succeeded: echo runs again (it is read-only) and the model answers.
func measureKeelResume(ctx context.Context, dir, synchronous string, k int) (keelResume, error) {
	path := filepath.Join(dir, "keel-resume-"+synchronous+".db")
	st, err := store.OpenWith(ctx, path, store.Options{Synchronous: synchronous})
	if err != nil {
		return keelResume{}, err
	}
	defer st.Close()
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() { errs[i] = interrupted(ctx, st, keel.RunID(fmt.Sprintf("run_%d", i))) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return keelResume{}, err
	}

	start := time.Now()
	eng, err := engine.New(engine.Config{Store: st, Model: scripted.New(nil, scripted.Repeat(scripted.Answer("done"))), Tools: tools{}})
	if err != nil {
		return keelResume{}, err
	}
	defer eng.Close(context.WithoutCancel(ctx))
	t := track(eng, k)
	n, err := eng.Resume(ctx)
	launched := time.Since(start)
	if err != nil {
		t.unsub()
		return keelResume{}, err
	}
	if n != k {
		t.unsub()
		return keelResume{}, fmt.Errorf("resumed %d runs, want %d", n, k)
	}
	if err := t.wait(5 * time.Minute); err != nil {
		return keelResume{}, err
	}
	ended := time.Since(start)
	done, err := st.RunsWithStatus(ctx, keel.RunSucceeded)
	if err != nil {
		return keelResume{}, err
	}
	if len(done) != k {
		return keelResume{}, fmt.Errorf("%d runs succeeded after resume, want %d", len(done), k)
	}
	return keelResume{runs: k, launched: launched, ended: ended}, nil
}

// interrupted writes the journal of run id as a daemon leaves it when it
// dies while echo runs: the model asked for the call, its intent was
// journaled, then the run was marked interrupted as Recover would.
func interrupted(ctx context.Context, st *store.Store, id keel.RunID) error {
	now := time.Now()
	model := scripted.DefaultModel.Name
	if err := st.CreateRun(ctx, keel.Run{ID: id, Goal: "resume " + string(id), Model: model, Status: keel.RunQueued, MaxSteps: 4, CreatedAt: now, UpdatedAt: now}); err != nil {
		return err
	}
	call := keel.ToolCall{ID: "c1", Name: "echo", Arguments: json.RawMessage(`{"text":"hi"}`)}
	for _, ev := range []struct {
		typ  keel.EventType
		data any
		upd  *keel.RunUpdate
	}{
		{keel.EventRunStarted, keel.RunStartedData{Goal: "resume " + string(id), Model: model, Tools: []string{"echo", "write"}, MaxSteps: 4}, &keel.RunUpdate{Status: keel.RunRunning}},
		{keel.EventModelResult, keel.ModelResultData{Step: 1, ToolCalls: []keel.ToolCall{call}}, nil},
		{keel.EventToolCall, keel.ToolCallData{Step: 1, Call: call}, nil},
		{keel.EventRunInterrupted, keel.RunEndData{Status: keel.RunInterrupted}, &keel.RunUpdate{Status: keel.RunInterrupted}},
	} {
		raw, err := json.Marshal(ev.data)
		if err != nil {
			return err
		}
		if _, err := st.Append(ctx, id, ev.typ, now, raw, ev.upd); err != nil {
			return err
		}
	}
	return nil
}
