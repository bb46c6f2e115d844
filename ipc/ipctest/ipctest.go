// Package ipctest provides a hand-written, in-memory backend for the
// tests of the protocol server and of its Go client, which both run it
// behind a real server on loopback.
package ipctest

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/ipc"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// Backend is a hand-written in-memory backend of every ipc.Services
// group but run control, steering and chat (see Services). Events it emits are
// stored first (if Seq > 0) and then passed to every subscriber, as the
// engine does. Its tools: "echo" returns its input; any other fails with
// a tool_error. Set the hooks before a server uses it.
type Backend struct {
	mu      sync.Mutex
	runs    map[keel.RunID]keel.Run
	events  map[keel.RunID][]keel.Event
	started []protocol.RunStartParams
	subs    map[int]func(keel.Event)
	nextSub int
	// changed is closed, and replaced, at each change WaitUntil watches.
	changed chan struct{}

	// Err, if set for a method name, is what that method returns.
	Err map[string]error
	// OnEvents, if set, runs inside Events: before reading the store
	// with before=true, after with before=false.
	OnEvents func(before bool)
	// OnCallTool, if set, implements CallTool.
	OnCallTool func(ctx context.Context, name string, input json.RawMessage) (json.RawMessage, error)
	// OnPullModel, if set, implements PullModel (the ID of what it
	// reports is ignored: the server sets it); by default a pull
	// succeeds at once.
	OnPullModel func(ctx context.Context, name string, progress func(protocol.ModelsPullProgress)) error
}

// New returns an empty Backend.
func New() *Backend {
	return &Backend{
		runs:    make(map[keel.RunID]keel.Run),
		events:  make(map[keel.RunID][]keel.Event),
		subs:    make(map[int]func(keel.Event)),
		Err:     make(map[string]error),
		changed: make(chan struct{}),
	}
}

// WaitUntil waits until cond returns true, calling it now and after each
// change of the backend: a run started, a subscription opened or
// closed, a pull begun or ended. It returns ctx's error if ctx ends
// first. cond must not hold the backend's lock (its getters are fine).
func (f *Backend) WaitUntil(ctx context.Context, cond func() bool) error {
	for {
		f.mu.Lock()
		changed := f.changed
		f.mu.Unlock()
		if cond() {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// notify wakes WaitUntil. f.mu must be held.
func (f *Backend) notify() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// AddRun stores a run with id and status.
func (f *Backend) AddRun(id keel.RunID, status keel.RunStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runs[id] = keel.Run{ID: id, Goal: "goal of " + string(id), Status: status, MaxSteps: 8}
}

// Run returns the stored run id, and whether there is one.
func (f *Backend) Run(id keel.RunID) (keel.Run, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.runs[id]
	return r, ok
}

// Started returns the parameters of every StartRun so far.
func (f *Backend) Started() []protocol.RunStartParams {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.started)
}

func (f *Backend) failWith(method string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Err[method]
}

// Emit stores ev if it is persisted, then calls every subscriber.
func (f *Backend) Emit(ev keel.Event) {
	f.mu.Lock()
	if ev.Seq > 0 {
		f.events[ev.RunID] = append(f.events[ev.RunID], ev)
		r := f.runs[ev.RunID]
		r.LastSeq = ev.Seq
		f.runs[ev.RunID] = r
	}
	fns := make([]func(keel.Event), 0, len(f.subs))
	for _, fn := range f.subs {
		fns = append(fns, fn)
	}
	f.mu.Unlock()
	for _, fn := range fns {
		fn(ev)
	}
}

// EmitSeq emits persisted events from..to of run id.
func (f *Backend) EmitSeq(id keel.RunID, from, to int64) {
	for seq := from; seq <= to; seq++ {
		f.Emit(Event(id, seq))
	}
}

// Event is the persisted event seq of run id that EmitSeq emits.
func Event(id keel.RunID, seq int64) keel.Event {
	return keel.Event{
		RunID: id,
		Seq:   seq,
		Type:  keel.EventModelResult,
		Time:  time.Unix(1700000000+seq, 0).UTC(),
		Data:  json.RawMessage(`{"step":` + strconv.FormatInt(seq, 10) + `}`),
	}
}

// Subscribers returns how many subscriptions are open.
func (f *Backend) Subscribers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.subs)
}

func (f *Backend) Start(_ context.Context, p keel.StartRequest) (keel.Run, error) {
	if err := f.failWith("StartRun"); err != nil {
		return keel.Run{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started = append(f.started, p)
	f.notify()
	id := keel.RunID(fmt.Sprintf("run-%d", len(f.started)))
	r := keel.Run{ID: id, Goal: p.Goal, Model: p.Model, MaxSteps: p.MaxSteps, Status: keel.RunQueued}
	f.runs[id] = r
	return r, nil
}

func (f *Backend) Cancel(_ context.Context, id keel.RunID) (keel.Run, error) {
	if err := f.failWith("CancelRun"); err != nil {
		return keel.Run{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.run(id)
	if err != nil {
		return keel.Run{}, err
	}
	if r.Status.Terminal() {
		return keel.Run{}, fmt.Errorf("run %q already %s: %w", id, r.Status, keel.ErrConflict)
	}
	r.Status = keel.RunCancelled
	f.runs[id] = r
	return r, nil
}

// RunPage lists the runs by ID, highest first (the fake's "newest");
// the cursor is the last ID of the page before. Err["ListRuns"] fails it.
func (f *Backend) RunPage(_ context.Context, p keel.RunQuery) (keel.RunPage, error) {
	if err := f.failWith("ListRuns"); err != nil {
		return keel.RunPage{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var runs []keel.Run
	for _, r := range f.runs {
		if (len(p.Status) == 0 || slices.Contains(p.Status, r.Status)) && (p.Cursor == "" || r.ID < keel.RunID(p.Cursor)) {
			runs = append(runs, r)
		}
	}
	slices.SortFunc(runs, func(a, b keel.Run) int { return strings.Compare(string(b.ID), string(a.ID)) })
	var res keel.RunPage
	if p.Limit > 0 && len(runs) > p.Limit {
		runs = runs[:p.Limit]
		res.NextCursor = string(runs[len(runs)-1].ID)
	}
	res.Runs = runs
	return res, nil
}

func (f *Backend) GetRun(_ context.Context, id keel.RunID) (keel.Run, error) {
	if err := f.failWith("GetRun"); err != nil {
		return keel.Run{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.run(id)
}

// run returns the stored run id or ErrNotFound. f.mu must be held.
func (f *Backend) run(id keel.RunID) (keel.Run, error) {
	r, ok := f.runs[id]
	if !ok {
		return keel.Run{}, fmt.Errorf("run %q: %w", id, keel.ErrNotFound)
	}
	return r, nil
}

func (f *Backend) Events(_ context.Context, id keel.RunID, afterSeq int64) ([]keel.Event, error) {
	if err := f.failWith("Events"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	hook := f.OnEvents
	f.mu.Unlock()
	if hook != nil {
		hook(true)
	}
	f.mu.Lock()
	var out []keel.Event
	for _, ev := range f.events[id] {
		if ev.Seq > afterSeq {
			out = append(out, ev)
		}
	}
	f.mu.Unlock()
	if hook != nil {
		hook(false)
	}
	return out, nil
}

func (f *Backend) Spans(_ context.Context, id keel.RunID) ([]keel.Span, error) {
	if err := f.failWith("Spans"); err != nil {
		return nil, err
	}
	return []keel.Span{{ID: "span-1", RunID: id, Kind: keel.SpanModelCall, Name: "m", Status: keel.SpanOK}}, nil
}

func (f *Backend) Subscribe(fn func(keel.Event)) func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextSub++
	n := f.nextSub
	f.subs[n] = fn
	f.notify()
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.subs, n)
		f.notify()
	}
}

func (f *Backend) ListTools(context.Context) ([]protocol.ToolInfo, error) {
	if err := f.failWith("ListTools"); err != nil {
		return nil, err
	}
	return []protocol.ToolInfo{{ToolSpec: keel.ToolSpec{
		Name: "echo", Description: "echoes its input", InputSchema: json.RawMessage(`{"type":"object"}`),
		SideEffects: keel.SideEffectReadOnly,
	}}}, nil
}

func (f *Backend) CallTool(ctx context.Context, name string, input json.RawMessage, _ string) (json.RawMessage, error) {
	f.mu.Lock()
	call := f.OnCallTool
	f.mu.Unlock()
	if call != nil {
		return call(ctx, name, input)
	}
	if err := f.failWith("CallTool"); err != nil {
		return nil, err
	}
	if name != "echo" {
		return nil, &keel.ToolError{Code: keel.ToolFailed, Message: "tool " + name + " broke"}
	}
	return input, nil
}

// ToolsProgress reports the tools ready.
func (f *Backend) ToolsProgress() (loaded, total int, ready bool) { return 1, 1, true }

// SubscribeTools never calls fn: the fake's tools do not change.
func (f *Backend) SubscribeTools(fn func()) (cancel func()) { return func() {} }

func (f *Backend) InspectTool(_ context.Context, path string) (protocol.ToolInfo, error) {
	return protocol.ToolInfo{ToolSpec: keel.ToolSpec{Name: strings.TrimSuffix(filepath.Base(path), ".wasm")}}, nil
}

func (f *Backend) InstallTool(_ context.Context, p protocol.ToolsInstallParams) (protocol.ToolInfo, error) {
	return protocol.ToolInfo{ToolSpec: keel.ToolSpec{Name: strings.TrimSuffix(filepath.Base(p.Path), ".wasm")}, Grants: p.Grants}, nil
}

func (f *Backend) RemoveTool(context.Context, string) error { return nil }

func (f *Backend) GrantTool(_ context.Context, p protocol.ToolsGrantParams) (protocol.ToolInfo, error) {
	return protocol.ToolInfo{ToolSpec: keel.ToolSpec{Name: p.Name}, Grants: p.Grants}, nil
}

func (f *Backend) RevokeTool(_ context.Context, p protocol.ToolsRevokeParams) (protocol.ToolInfo, error) {
	return protocol.ToolInfo{ToolSpec: keel.ToolSpec{Name: p.Name}}, nil
}

func (f *Backend) ToolCalls(_ context.Context, tool string, limit int) ([]keel.ToolAudit, error) {
	return []keel.ToolAudit{{Tool: tool, Step: limit, Outcome: "ok"}}, nil
}

func (f *Backend) Describe(context.Context) (capabilities.Environment, error) {
	if err := f.failWith("Describe"); err != nil {
		return capabilities.Environment{}, err
	}
	return capabilities.Environment{Runtime: "keel", Version: "test", Network: "loopback"}, nil
}

func (f *Backend) ListModels(context.Context) (protocol.ModelsListResult, error) {
	if err := f.failWith("ListModels"); err != nil {
		return protocol.ModelsListResult{}, err
	}
	return protocol.ModelsListResult{
		Models:    []protocol.ModelInfo{{Name: "tiny", Provider: "fake", Capabilities: []string{"completion"}, ContextLength: 2048}},
		Providers: []protocol.ProviderStatus{{Name: "fake", Reachable: true}},
	}, nil
}

func (f *Backend) PullModel(ctx context.Context, name string, progress func(keel.PullProgress)) error {
	f.mu.Lock()
	pull := f.OnPullModel
	f.notify()
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.notify()
		f.mu.Unlock()
	}()
	if pull != nil {
		return pull(ctx, name, func(p protocol.ModelsPullProgress) {
			progress(keel.PullProgress{Status: p.Status, Digest: p.Digest, Completed: p.Completed, Total: p.Total})
		})
	}
	return f.failWith("PullModel")
}

// Services returns the groups of ipc.Services that b implements: for
// the fake, or a type that embeds it to add or hide methods.
func Services(b any) ipc.Services {
	var s ipc.Services
	s.Runs, _ = b.(ipc.Runs)
	s.History, _ = b.(ipc.History)
	s.Control, _ = b.(ipc.RunControl)
	s.Steering, _ = b.(ipc.RunSteering)
	s.Tools, _ = b.(ipc.Tools)
	s.Admin, _ = b.(ipc.ToolAdmin)
	s.Audit, _ = b.(ipc.ToolAudit)
	s.Models, _ = b.(ipc.Models)
	s.Chat, _ = b.(ipc.Chat)
	s.Env, _ = b.(ipc.Environment)
	s.Labels, _ = b.(ipc.RunLabels)
	return s
}
