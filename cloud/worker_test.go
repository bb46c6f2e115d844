package cloud_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud"
	"github.com/keel-runtime/keel/cloud/jsstore"
	"github.com/keel-runtime/keel/cloud/natstest"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/internal/wasmtest"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/wasmtools"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// cluster is the package's 3-node cluster; each test has a namespace.
var cluster *natstest.Cluster

// namespaces numbers the tests' namespaces, so that a test run again
// (-count) on the shared cluster starts afresh.
var namespaces atomic.Int64

// namespace returns a namespace of its own, named after base.
func namespace(base string) string {
	return fmt.Sprintf("%s%d", base, namespaces.Add(1))
}

func TestMain(m *testing.M) {
	if os.Getenv(envWorkerURL) != "" {
		workerProcess() // TestKillWorkerProcess's worker
		return
	}
	var err error
	if cluster, err = natstest.Start(natstest.Options{Accounts: tenants}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	cluster.Close()
	os.Exit(code)
}

// calls is the side effect of the bump tool: how many times each call
// (run/call ID) ran, whichever worker ran it.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
}

func (c *calls) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// counter counts every call of a worker's tools as it starts; hold, if
// set, may keep a call from going on (until its context ends) after it
// counted, as a tool would that did its side effect and then hung.
type counter struct {
	calls *calls
	hold  func(inv keel.ToolInvocation) bool
}

func (c *counter) BeforeTool(ctx context.Context, inv keel.ToolInvocation) intercept.Decision {
	c.calls.add(string(inv.Run) + "/" + inv.CallID)
	if c.hold != nil && c.hold(inv) {
		<-ctx.Done()
	}
	return intercept.Decision{}
}

func (c *counter) AfterTool(context.Context, keel.ToolInvocation, intercept.Decision, intercept.ToolOutcome) {
}

// toolsDir holds bump: a canned wasm module declared non-idempotent, so
// that the engine never runs a call of it twice on its own.
func toolsDir(t *testing.T) string {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"bump.wasm": string(wasmtest.CannedReactor(`{"output":{"bumped":true}}`)),
		"bump.manifest.json": `{"name":"bump","description":"Add one to a counter.","side_effects":"non_idempotent_write",
"input_schema":{"type":"object"}}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// toolSteps is each run's script: bump three times, then answer. The
// step is chosen from the conversation (how many tool results it holds),
// so a run resumed on another worker goes on where its journal stands.
const toolSteps = 3

func script(req models.ChatRequest) (models.ChatResponse, error) {
	n := 0
	for _, m := range req.Messages {
		if m.Role == models.RoleTool {
			n++
		}
	}
	goal := scripted.Goal(req)
	if n >= toolSteps {
		return models.ChatResponse{Message: models.Message{Content: "done " + goal}}, nil
	}
	call := keel.ToolCall{ID: fmt.Sprintf("%s-c%d", goal, n+1), Name: "bump", Arguments: json.RawMessage(`{}`)}
	return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{call}}}, nil
}

// gated is a worker's model; hold, if set, keeps a request waiting
// until its context ends (the worker is killed).
type gated struct {
	*scripted.Provider
	hold func(req models.ChatRequest) bool
}

func (g gated) Chat(ctx context.Context, req models.ChatRequest, onDelta func(models.Delta)) (models.ChatResponse, error) {
	if g.hold != nil && g.hold(req) {
		<-ctx.Done()
		return models.ChatResponse{}, ctx.Err()
	}
	return g.Provider.Chat(ctx, req, onDelta)
}

type workerOpts struct {
	cl        *natstest.Cluster // default the package's
	as        *natstest.Account // the tenant; default none
	maxRuns   int
	holdModel func(models.ChatRequest) bool
	holdTool  func(keel.ToolInvocation) bool
	limits    cloud.Limits
	approve   []keel.SideEffect // engine.Config.RequireApproval
}

// connect connects to cl (the package's if nil) as the tenant as (none
// if nil).
func connect(t *testing.T, cl *natstest.Cluster, as *natstest.Account, opts ...nats.Option) *nats.Conn {
	t.Helper()
	if cl == nil {
		cl = cluster
	}
	opts = append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	var nc *nats.Conn
	var err error
	if as != nil {
		nc, err = cl.ConnectAs(*as, opts...)
	} else {
		nc, err = cl.Connect(opts...)
	}
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

const leaseTTL = 1500 * time.Millisecond

// startWorker starts a worker of namespace ns with its own connection,
// tool registry (bump, counted in c) and scripted model.
func startWorker(t *testing.T, ns, name, tools string, c *calls, o workerOpts) *cloud.Worker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := wasmtools.Open(ctx, wasmtools.Config{Dir: tools, Interceptors: intercept.Tools{&counter{calls: c, hold: o.holdTool}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close(context.Background()) })
	nc := connect(t, o.cl, o.as, nats.Name(name))
	var model engine.Model = gated{Provider: scripted.ByGoal(nil, func(string) []scripted.Step {
		return []scripted.Step{scripted.Repeat(scripted.AnswerFunc(script))}
	}), hold: o.holdModel}
	if l := o.limits; l.BudgetTokens > 0 || l.BudgetUSD > 0 || l.TotalTokens > 0 || l.TotalUSD > 0 {
		// Budgets are kept by the model layer's router, as keel cloud
		// serve's workers keep them.
		r, err := models.NewRouter(models.RouterConfig{Providers: map[string]models.ProviderConfig{"scripted": {Provider: model.(gated)}}})
		if err != nil {
			t.Fatal(err)
		}
		model = r
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	w, err := cloud.Start(ctx, nc, cloud.Config{Namespace: ns, Name: name, MaxRuns: o.maxRuns, LeaseTTL: leaseTTL, Logger: log, Limits: o.limits,
		NewEngine: func(st engine.Store) (*engine.Engine, error) {
			return engine.New(engine.Config{Store: st, Model: model, Tools: reg.RunTools(), DefaultMaxSteps: 10, RequireApproval: o.approve, Logger: log.With("worker", name)})
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		w.Close(ctx)
	})
	return w
}

// submitJobs queues n runs, goals (and idempotency keys) job-0 to
// job-(n-1), and returns their goals.
func submitJobs(t *testing.T, ctx context.Context, js jetstream.JetStream, ns string, n int) []string {
	t.Helper()
	var goals []string
	for i := range n {
		goals = append(goals, fmt.Sprintf("job-%d", i))
		if err := cloud.Submit(ctx, js, ns, keel.StartRequest{Goal: goals[i], IdempotencyKey: goals[i]}); err != nil {
			t.Fatal(err)
		}
	}
	return goals
}

// holdAfterTool is a workerOpts.holdModel that holds a run's model step
// once a tool's result is in its messages (its second step), and a
// channel closed when it first does.
func holdAfterTool() (func(models.ChatRequest) bool, <-chan struct{}) {
	reached := make(chan struct{})
	var once sync.Once
	return func(req models.ChatRequest) bool {
		for _, m := range req.Messages {
			if m.Role == models.RoleTool {
				once.Do(func() { close(reached) })
				return true
			}
		}
		return false
	}, reached
}

// startVictim starts the worker the kill tests kill, "victim": one run
// at a time, its run's second model step held (holdAfterTool). It
// returns once that step is held, and fails the test if ctx ends first.
func startVictim(t *testing.T, ctx context.Context, ns, tools string, c *calls, o workerOpts) *cloud.Worker {
	t.Helper()
	hold, reached := holdAfterTool()
	o.maxRuns, o.holdModel = 1, hold
	victim := startWorker(t, ns, "victim", tools, c, o)
	select {
	case <-reached:
	case <-ctx.Done():
		t.Fatal("the victim did not reach its run's second step")
	}
	return victim
}

// watchRuns reports each run's status changes as the journal stream
// stores them (an ordered consumer of the namespace's journal: a
// refused append, which a core subscription would see too, is not in
// it).
func watchRuns(t *testing.T, cl *natstest.Cluster, ns string) <-chan keel.RunStatus {
	return watchRunsAs(t, cl, nil, ns)
}

// watchRunsAs is watchRuns for tenant as.
func watchRunsAs(t *testing.T, cl *natstest.Cluster, as *natstest.Account, ns string) <-chan keel.RunStatus {
	nc := connect(t, cl, as)
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, ns+"_JOURNAL")
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan keel.RunStatus, 1024)
	cc, err := c.Consume(func(m jetstream.Msg) {
		var b struct {
			Update *keel.RunUpdate `json:"update"`
		}
		if json.Unmarshal(m.Data(), &b) == nil && b.Update != nil {
			ch <- b.Update.Status
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return ch
}

// waitStatus waits until n status changes to want arrived on ch.
func waitStatus(t *testing.T, ch <-chan keel.RunStatus, want keel.RunStatus, n int, diag ...func()) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for got := 0; got < n; {
		select {
		case st := <-ch:
			if st == want {
				got++
			}
		case <-timeout:
			for _, d := range diag {
				d()
			}
			t.Fatalf("%d of %d runs %s within a minute", got, n, want)
		}
	}
}

func client(t *testing.T, cl *natstest.Cluster, ns string) (jetstream.JetStream, *jsstore.Store) {
	return clientAs(t, cl, nil, ns)
}

// clientAs is client for tenant as.
func clientAs(t *testing.T, cl *natstest.Cluster, as *natstest.Account, ns string) (jetstream.JetStream, *jsstore.Store) {
	nc := connect(t, cl, as)
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cloud.Setup(ctx, js, ns, 3, leaseTTL); err != nil {
		t.Fatal(err)
	}
	st, err := jsstore.Open(ctx, js, jsstore.Config{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	return js, st
}

// checkRuns checks every run of goals succeeded, each of its calls ran
// exactly once, and its journal holds no event twice (one model result
// per step, one tool result per call, seqs 1..n). It returns the runs
// whose journal shows a takeover (run.interrupted).
func checkRuns(t *testing.T, st *jsstore.Store, c *calls, goals []string) (adopted []keel.RunID) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, g := range goals {
		r, err := st.RunByIdempotencyKey(ctx, g)
		if err != nil {
			t.Fatalf("run %s: %v", g, err)
		}
		if r.Status != keel.RunSucceeded || r.Result != "done "+g {
			t.Errorf("run %s (%s) ended %s %q, want succeeded", g, r.ID, r.Status, r.Result)
		}
		evs, err := st.Events(ctx, r.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		steps, results := map[int]int{}, map[string]int{}
		for i, ev := range evs {
			if ev.Seq != int64(i+1) {
				t.Errorf("run %s: event %d has seq %d", g, i, ev.Seq)
			}
			switch ev.Type {
			case keel.EventModelResult:
				var d keel.ModelResultData
				json.Unmarshal(ev.Data, &d)
				steps[d.Step]++
			case keel.EventToolResult:
				var d keel.ToolResultData
				json.Unmarshal(ev.Data, &d)
				results[d.CallID]++
			case keel.EventRunInterrupted:
				adopted = append(adopted, r.ID)
			}
		}
		for step, n := range steps {
			if n != 1 {
				t.Errorf("run %s: %d model results for step %d, want 1", g, n, step)
			}
		}
		for i := 1; i <= toolSteps; i++ {
			call := fmt.Sprintf("%s-c%d", g, i)
			if n := results[call]; n != 1 {
				t.Errorf("run %s: %d tool results for %s, want 1", g, n, call)
			}
			if n := c.get(string(r.ID) + "/" + call); n != 1 {
				t.Errorf("run %s: %s ran %d times, want exactly once", g, call, n)
			}
		}
	}
	return adopted
}

// scene is where a kill test starts: ns's tools, a count of the calls,
// a client and store of ns on a cluster, a watch of its runs' statuses
// and a context of 90 s (cancel it when the test ends).
type scene struct {
	tools    string
	c        *calls
	js       jetstream.JetStream
	st       *jsstore.Store
	statuses <-chan keel.RunStatus
	ctx      context.Context
	cancel   context.CancelFunc
}

func newScene(t *testing.T, cl *natstest.Cluster, ns string) scene {
	t.Helper()
	sc := scene{tools: toolsDir(t), c: &calls{}}
	sc.js, sc.st = client(t, cl, ns)
	sc.statuses = watchRuns(t, cl, ns)
	sc.ctx, sc.cancel = context.WithTimeout(context.Background(), 90*time.Second)
	return sc
}

// TestKillWorkerMidRun: three workers share nine runs; one dies (its
// connection cut) in the middle of a run, after one of its tool calls
// ran and while its model is asked for the next step. Its lease lapses,
// its work item comes back, and another worker adopts the run from the
// journal: every run succeeds, each non-idempotent call ran exactly
// once, and no journal holds an event twice.
func TestKillWorkerMidRun(t *testing.T) {
	t.Parallel()
	ns, runs := namespace("kill"), 9
	sc := newScene(t, cluster, ns)
	defer sc.cancel()
	tools, c, js, st, statuses, ctx := sc.tools, sc.c, sc.js, sc.st, sc.statuses, sc.ctx
	goals := submitJobs(t, ctx, js, ns, runs)
	// The victim runs one run at a time, and holds its second model step.
	victim := startVictim(t, ctx, ns, tools, c, workerOpts{})
	startWorker(t, ns, "w2", tools, c, workerOpts{})
	startWorker(t, ns, "w3", tools, c, workerOpts{})
	victim.Kill()
	waitStatus(t, statuses, keel.RunSucceeded, runs)
	adopted := checkRuns(t, st, c, goals)
	if len(adopted) != 1 {
		t.Errorf("%d runs were adopted after the kill (%v), want 1", len(adopted), adopted)
	}
}

// TestKillWorkerInTool: a worker dies while a non-idempotent call runs,
// after its side effect: the journal has the call's intent and no
// result. The worker that adopts the run does not run the call again (the
// engine cannot know whether it ran): the run waits for a person, who
// says it was done, and then it finishes. The call ran exactly once.
func TestKillWorkerInTool(t *testing.T) {
	t.Parallel()
	ns := namespace("killtool")
	sc := newScene(t, cluster, ns)
	defer sc.cancel()
	tools, c, js, st, statuses, ctx := sc.tools, sc.c, sc.js, sc.st, sc.statuses, sc.ctx
	goal := "tool-job"
	if err := cloud.Submit(ctx, js, ns, keel.StartRequest{Goal: goal, IdempotencyKey: goal}); err != nil {
		t.Fatal(err)
	}
	held := make(chan keel.ToolInvocation, 1)
	victim := startWorker(t, ns, "victim", tools, c, workerOpts{maxRuns: 1, holdTool: func(inv keel.ToolInvocation) bool {
		if strings.HasSuffix(inv.CallID, "-c2") {
			held <- inv
			return true
		}
		return false
	}})
	var inv keel.ToolInvocation
	select {
	case inv = <-held:
	case <-ctx.Done():
		t.Fatal("the victim did not reach its second call")
	}
	w2 := startWorker(t, ns, "w2", tools, c, workerOpts{})
	victim.Kill()
	waitStatus(t, statuses, keel.RunWaiting, 1)
	if n := c.get(string(inv.Run) + "/" + inv.CallID); n != 1 {
		t.Fatalf("the cut call ran %d times before a person decided, want 1", n)
	}
	if _, err := w2.Engine().Decide(ctx, inv.Run, inv.CallID, keel.DecisionDone, json.RawMessage(`{"bumped":true}`), "it ran"); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	waitStatus(t, statuses, keel.RunSucceeded, 1)
	// The person's answer stands for the call's result: one
	// human.decision, no tool.result for it.
	r, err := st.RunByIdempotencyKey(ctx, goal)
	if err != nil {
		t.Fatal(err)
	}
	evs, _ := st.Events(ctx, r.ID, 0)
	decisions := 0
	for _, ev := range evs {
		if ev.Type == keel.EventHumanDecision {
			decisions++
		}
	}
	if decisions != 1 || r.Status != keel.RunSucceeded {
		t.Errorf("run %s: %d decisions, status %s; want 1, succeeded", r.ID, decisions, r.Status)
	}
	for i := 1; i <= toolSteps; i++ {
		call := fmt.Sprintf("%s-c%d", goal, i)
		if n := c.get(string(r.ID) + "/" + call); n != 1 {
			t.Errorf("%s ran %d times, want exactly once", call, n)
		}
	}
}

// TestKillWorkerAndNode: as TestKillWorkerMidRun, and then the node
// leading the journal stream is shut down too, on a cluster of the
// test's own: the workers' connections move to the other nodes, the
// streams and buckets (R3) elect new leaders, and every run still
// succeeds with each call run exactly once.
func TestKillWorkerAndNode(t *testing.T) {
	t.Parallel()
	cl, err := natstest.Start(natstest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const ns, runs = "node", 6
	sc := newScene(t, cl, ns)
	defer sc.cancel()
	tools, c, js, st, statuses, ctx := sc.tools, sc.c, sc.js, sc.st, sc.statuses, sc.ctx
	goals := submitJobs(t, ctx, js, ns, runs)
	victim := startVictim(t, ctx, ns, tools, c, workerOpts{cl: cl})
	startWorker(t, ns, "w2", tools, c, workerOpts{cl: cl})
	startWorker(t, ns, "w3", tools, c, workerOpts{cl: cl})
	victim.Kill()
	s, err := js.Stream(ctx, ns+"_JOURNAL")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	killed := false
	for _, srv := range cl.Servers {
		if srv.Name() == info.Cluster.Leader {
			srv.Shutdown()
			killed = true
		}
	}
	if !killed {
		t.Fatalf("no node is the journal's leader %q", info.Cluster.Leader)
	}
	waitStatus(t, statuses, keel.RunSucceeded, runs, func() {
		// Which runs, where they stand: a run stuck, or the watcher?
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, g := range goals {
			r, err := st.RunByIdempotencyKey(ctx, g)
			evs, _ := st.Events(ctx, r.ID, max(0, r.LastSeq-4))
			var types []keel.EventType
			for _, ev := range evs {
				types = append(types, ev.Type)
			}
			t.Logf("%s: %s %s last %v (%v)", g, r.ID, r.Status, types, err)
		}
		if cons, err := js.Consumer(ctx, ns+"_WORK", "workers"); err == nil {
			ci, err := cons.Info(ctx)
			if err == nil {
				t.Logf("work consumer: pending %d ackpending %d redelivered %d waiting %d delivered %+v ackfloor %+v leader %s", ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting, ci.Delivered, ci.AckFloor, ci.Cluster.Leader)
			} else {
				t.Logf("work consumer info: %v", err)
			}
		}
		if kv, err := js.KeyValue(ctx, ns+"_leases"); err == nil {
			if ks, err := kv.ListKeys(ctx); err == nil {
				for k := range ks.Keys() {
					e, err := kv.Get(ctx, k)
					if err == nil {
						t.Logf("lease %s = %s rev %d created %v (now %v)", k[:8], e.Value(), e.Revision(), e.Created(), time.Now())
					}
				}
			}
			if s, err := js.Stream(ctx, "KV_"+ns+"_leases"); err == nil {
				if si, err := s.Info(ctx); err == nil {
					t.Logf("lease stream: %+v leader %s maxage %v", si.State, si.Cluster.Leader, si.Config.MaxAge)
				}
			}
		}
		// Where the workers' goroutines stand: a start or an adoption
		// that hangs shows here.
		var buf bytes.Buffer
		pprof.Lookup("goroutine").WriteTo(&buf, 2)
		for _, g := range strings.Split(buf.String(), "\n\n") {
			if strings.Contains(g, "cloud.(*Worker).handle") {
				t.Logf("%s", g)
			}
		}
		if s, err := js.Stream(ctx, ns+"_WORK"); err == nil {
			if si, err := s.Info(ctx); err == nil {
				t.Logf("work stream: msgs %d first %d last %d leader %s", si.State.Msgs, si.State.FirstSeq, si.State.LastSeq, si.Cluster.Leader)
			}
		}
	})
	if adopted := checkRuns(t, st, c, goals); len(adopted) != 1 {
		t.Errorf("%d runs were adopted after the kill (%v), want 1", len(adopted), adopted)
	}
}

// TestSweepAdoptsLostRun: a worker dies mid-run and its work item is
// lost with it (the queue purged: the redelivery every adoption waited
// for never comes). The sweep of a live worker finds the run held by no
// lease and not moving, queues it again, and the run is adopted and
// succeeds, its calls run once.
func TestSweepAdoptsLostRun(t *testing.T) {
	t.Parallel()
	ns := namespace("sweep")
	sc := newScene(t, cluster, ns)
	defer sc.cancel()
	tools, c, js, st, statuses, ctx := sc.tools, sc.c, sc.js, sc.st, sc.statuses, sc.ctx
	goals := submitJobs(t, ctx, js, ns, 1)
	victim := startVictim(t, ctx, ns, tools, c, workerOpts{})
	victim.Kill()
	s, err := js.Stream(ctx, ns+"_WORK")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	startWorker(t, ns, "w2", tools, c, workerOpts{})
	waitStatus(t, statuses, keel.RunSucceeded, 1)
	if adopted := checkRuns(t, st, c, goals); len(adopted) != 1 {
		t.Errorf("%d runs were adopted (%v), want 1", len(adopted), adopted)
	}
}

// TestReadWorkers: the workers of a namespace are listed by their
// heartbeats, each with its runs and the leases it holds: a worker in
// the middle of a run holds its lease, an idle one none; a worker that
// closes is gone from the list at once.
func TestReadWorkers(t *testing.T) {
	t.Parallel()
	ns := namespace("workers")
	tools := toolsDir(t)
	c := &calls{}
	js, _ := client(t, cluster, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hold, reached := holdAfterTool()
	busy := startWorker(t, ns, "busy", tools, c, workerOpts{maxRuns: 1, holdModel: hold})
	submitJobs(t, ctx, js, ns, 1)
	select {
	case <-reached:
	case <-ctx.Done():
		t.Fatal("the busy worker did not reach its run's second step")
	}
	idle := startWorker(t, ns, "idle", tools, c, workerOpts{maxRuns: 2})
	// Wait, by the bucket's watch, for the idle worker's heartbeat and
	// one of the busy worker's since it took its run (its first was put
	// before).
	kv, err := js.KeyValue(ctx, ns+"_workers")
	if err != nil {
		t.Fatal(err)
	}
	watch, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	for seen := map[string]bool{}; len(seen) < 2; {
		select {
		case e := <-watch.Updates():
			if e != nil && e.Operation() == jetstream.KeyValuePut {
				var wi cloud.WorkerInfo
				json.Unmarshal(e.Value(), &wi)
				if wi.Name == "idle" || wi.Runs == 1 {
					seen[wi.Name] = true
				}
			}
		case <-ctx.Done():
			t.Fatal("no heartbeat of both workers within a minute")
		}
	}
	ws, err := cloud.ReadWorkers(ctx, js, ns)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]cloud.WorkerInfo{}
	for _, w := range ws {
		got[w.Name] = w
	}
	if b, i := got["busy"], got["idle"]; len(ws) != 2 || b.Leases != 1 || b.Runs != 1 || b.MaxRuns != 1 || i.Leases != 0 || i.Runs != 0 || i.MaxRuns != 2 ||
		b.At.IsZero() || b.Started.IsZero() || b.At.Before(b.Started) {
		t.Errorf("ReadWorkers = %+v; want busy (1 run of 1, 1 lease) and idle (0 of 2, no lease), each with its heartbeat", ws)
	}
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	defer ccancel()
	if err := idle.Close(cctx); err != nil {
		t.Fatal(err)
	}
	if ws, err := cloud.ReadWorkers(ctx, js, ns); err != nil || len(ws) != 1 || ws[0].Name != busy.Name() {
		t.Errorf("after idle closed, ReadWorkers = %+v, %v; want busy alone", ws, err)
	}
}

// TestRestartNode: as TestKillWorkerMidRun on a cluster of the test's
// own, and the node leading the journal stream is restarted with its
// store (shut down, then started again with its name, ports and store)
// while a worker holds a run in its middle, which then dies: the
// restarted node rejoins its streams, every run succeeds, each call ran
// exactly once, and no journal holds an event twice.
func TestRestartNode(t *testing.T) {
	t.Parallel()
	cl, err := natstest.Start(natstest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const ns, runs = "restart", 4
	sc := newScene(t, cl, ns)
	defer sc.cancel()
	tools, c, js, st, statuses, ctx := sc.tools, sc.c, sc.js, sc.st, sc.statuses, sc.ctx
	goals := submitJobs(t, ctx, js, ns, runs)
	victim := startVictim(t, ctx, ns, tools, c, workerOpts{cl: cl})
	startWorker(t, ns, "w2", tools, c, workerOpts{cl: cl})
	s, err := js.Stream(ctx, ns+"_JOURNAL")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := slices.IndexFunc(cl.Servers, func(s *server.Server) bool { return s.Name() == info.Cluster.Leader })
	if node < 0 {
		t.Fatalf("no node is the journal's leader %q", info.Cluster.Leader)
	}
	if err := cl.Restart(node); err != nil {
		t.Fatal(err)
	}
	victim.Kill()
	waitStatus(t, statuses, keel.RunSucceeded, runs)
	if adopted := checkRuns(t, st, c, goals); len(adopted) != 1 {
		t.Errorf("%d runs were adopted after the kill (%v), want 1", len(adopted), adopted)
	}
	// The restarted node is a current replica of the journal again (or
	// its leader): it caught up from its store and the others.
	name := cl.Servers[node].Name()
	for {
		info, err = s.Info(ctx)
		if err == nil && (info.Cluster.Leader == name || slices.ContainsFunc(info.Cluster.Replicas, func(p *jetstream.PeerInfo) bool {
			return p.Name == name && p.Current && !p.Offline
		})) {
			break
		}
		select {
		case <-time.After(100 * time.Millisecond): // its catching up is not an event a client sees
		case <-ctx.Done():
			t.Fatalf("the restarted node %s is not a current replica of the journal: %+v, %v", name, info.Cluster, err)
		}
	}
}
