// Command cloud measures keel's engine on JetStream (cloud/jsstore,
// cloud workers) against the local SQLite journal, on this machine in
// one run:
//
//   - a step's cost: one run of -n steps at a time (a deterministic model
//     that asks an in-memory read-only tool n-1 times and then answers,
//     so each step is one journal append), the median of -reps runs'
//     time per step, on the SQLite store (synchronous=FULL, keel's
//     default) and on JetStream clusters embedded in this process: one
//     node (R1) and three nodes on loopback (R3, quorum acks), each with
//     the servers' default sync (every 2 minutes) and with
//     sync_interval: always. Beside it, the floor: one JetStream publish
//     with its expected-last-sequence guard, and one SQLite commit;
//   - scale-out: -runs runs of -n steps queued on the R3 cluster and run
//     by 1, 2 and 3 workers (each its own connection, engine and store,
//     -max-runs runs at once), steps per second from the first start to
//     the last end: the steps cost CPU alone (a model that answers at
//     once), so the workers compete for the cores with the servers;
//   - the same, simulated I/O-bound (-latency, 0 to leave it out): the
//     model answers after a fixed wait, as a remote model does, and each
//     worker runs -sim-max-runs runs at once, so a worker's steps/s is
//     bounded by its slots and the wait, not by the cores, and workers
//     overlap their waits. Side by side with the CPU-bound figure, for
//     each worker count in -workers, measured in turns (-scale-reps
//     rounds, the median), with the process's CPU (the servers and the
//     workers are all in it) as cores busy.
//
// Everything (the three servers, the workers, the model) shares this
// machine's cores: on two cores the workers compete with the servers,
// so scale-out shows the shape, not what separate machines would give.
//
//	go run ./bench/cloud [-n 20] [-reps 15] [-runs 60] [-max-runs 16] [-workers 1,2,3,4,6]
//	    [-latency 50ms] [-sim-runs 48] [-sim-n 10] [-sim-max-runs 2] [-scale-reps 3]
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bench/internal/timing"
	"github.com/keel-runtime/keel/cloud"
	"github.com/keel-runtime/keel/cloud/jsstore"
	"github.com/keel-runtime/keel/cloud/natstest"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/store"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite"
)

func main() {
	n := flag.Int("n", 20, "steps per run")
	reps := flag.Int("reps", 15, "runs per step-cost figure (the median is reported)")
	runs := flag.Int("runs", 60, "runs queued for the scale-out figure")
	maxRuns := flag.Int("max-runs", 16, "runs a worker runs at once")
	workers := flag.String("workers", "1,2,3,4,6", "worker counts for the scale-out figure")
	var sim simConfig
	flag.DurationVar(&sim.latency, "latency", 50*time.Millisecond, "the simulated model's wait a call, for the I/O-bound scale-out (0: CPU-bound only)")
	flag.IntVar(&sim.runs, "sim-runs", 48, "runs queued for the I/O-bound scale-out")
	flag.IntVar(&sim.n, "sim-n", 10, "steps per run of the I/O-bound scale-out")
	flag.IntVar(&sim.maxRuns, "sim-max-runs", 2, "runs a worker runs at once in the I/O-bound scale-out")
	scaleReps := flag.Int("scale-reps", 3, "rounds of the scale-out, in turns (the median is reported)")
	skipCost := flag.Bool("skip-cost", false, "leave out the step-cost figures")
	flag.Parse()
	if err := run(*n, *reps, *runs, *maxRuns, *workers, sim, *scaleReps, *skipCost); err != nil {
		fmt.Fprintln(os.Stderr, "cloud:", err)
		os.Exit(1)
	}
}

// simConfig is the I/O-bound scale-out's setting.
type simConfig struct {
	latency          time.Duration
	runs, n, maxRuns int
}

func run(n, reps, runs, maxRuns int, workerList string, sim simConfig, scaleReps int, skipCost bool) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "bench-cloud-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Printf("GOMAXPROCS %d, %d steps a run, median of %d runs\n\n", runtime.GOMAXPROCS(0), n, reps)
	if !skipCost {
		if err := costs(ctx, dir, n, reps); err != nil {
			return err
		}
	}
	return scaleOuts(ctx, dir, workerList, runs, n, maxRuns, sim, scaleReps)
}

// costs prints a step's cost on each journal, and its floor.
func costs(ctx context.Context, dir string, n, reps int) error {
	fmt.Printf("%-28s %12s %12s\n", "journal", "step", "floor")

	// SQLite, synchronous=FULL.
	st, err := store.Open(ctx, filepath.Join(dir, "keel.db"))
	if err != nil {
		return err
	}
	step, err := stepCost(ctx, st, n, reps)
	st.Close()
	if err != nil {
		return err
	}
	floor, err := sqliteFloor(filepath.Join(dir, "floor.db"), 200)
	if err != nil {
		return err
	}
	fmt.Printf("%-28s %12s %12s\n", "SQLite FULL", round(step), round(floor))
	base := step

	for _, c := range []struct {
		name  string
		nodes int
		sync  bool
	}{{"JetStream R1", 1, false}, {"JetStream R1 sync always", 1, true}, {"JetStream R3", 3, false}, {"JetStream R3 sync always", 3, true}} {
		cl, err := natstest.Start(natstest.Options{Nodes: c.nodes, SyncAlways: c.sync, Dir: filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))})
		if err != nil {
			return err
		}
		step, floor, err := jetStreamCost(ctx, cl, c.nodes, n, reps)
		cl.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		fmt.Printf("%-28s %12s %12s   step %.1f× SQLite's, %.1f messages a step\n", c.name, round(step), round(floor), float64(step)/float64(base), msgsPerStep)
	}

	return nil
}

// scaleOuts prints steps/s with each worker count in workerList, CPU-bound
// and (sim.latency > 0) I/O-bound, each on a fresh R3 cluster, the
// settings measured in turns over scaleReps rounds.
func scaleOuts(ctx context.Context, dir, workerList string, runs, n, maxRuns int, sim simConfig, scaleReps int) error {
	var counts []int
	for _, f := range strings.Split(workerList, ",") {
		w, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || w < 1 {
			return fmt.Errorf("-workers: %q", f)
		}
		counts = append(counts, w)
	}
	type setting struct {
		workers, runs, n, maxRuns int
		latency                   time.Duration
		rates, cores              []float64
	}
	var sets []*setting
	for _, w := range counts {
		sets = append(sets, &setting{workers: w, runs: runs, n: n, maxRuns: maxRuns})
		if sim.latency > 0 {
			sets = append(sets, &setting{workers: w, runs: sim.runs, n: sim.n, maxRuns: sim.maxRuns, latency: sim.latency})
		}
	}
	k := 0
	var fs []func() error
	for _, st := range sets {
		fs = append(fs, func() error {
			k++
			cl, err := natstest.Start(natstest.Options{Dir: filepath.Join(dir, fmt.Sprintf("scale-%d", k))})
			if err != nil {
				return err
			}
			defer os.RemoveAll(filepath.Join(dir, fmt.Sprintf("scale-%d", k)))
			defer cl.Close()
			rate, cores, err := scaleOut(ctx, cl, st.workers, st.runs, st.n, st.maxRuns, st.latency)
			if err != nil {
				return fmt.Errorf("%d workers (latency %s): %w", st.workers, st.latency, err)
			}
			st.rates, st.cores = append(st.rates, rate), append(st.cores, cores)
			return nil
		})
	}
	fmt.Printf("\nscale-out on JetStream R3 (default sync), each setting on a fresh cluster, in turns, median of %d rounds (after one untimed)\n", scaleReps)
	fmt.Printf("  CPU-bound: %d runs of %d steps, a model that answers at once, %d runs at once per worker\n", runs, n, maxRuns)
	if sim.latency > 0 {
		fmt.Printf("  I/O-bound (simulated): %d runs of %d steps, the model answers after %s, %d runs at once per worker: at most %.0f steps/s a worker\n",
			sim.runs, sim.n, sim.latency, sim.maxRuns, float64(sim.maxRuns)/sim.latency.Seconds())
	}
	if _, err := timing.MeasureTurns(scaleReps, fs...); err != nil {
		return err
	}
	med := func(v []float64) float64 {
		v = slices.Clone(v[1:]) // the first is the untimed round's
		slices.Sort(v)
		return v[len(v)/2]
	}
	fmt.Printf("%-8s %12s %8s %8s", "workers", "CPU steps/s", "vs 1", "cores")
	if sim.latency > 0 {
		fmt.Printf(" %12s %8s %8s %8s", "I/O steps/s", "vs 1", "ideal", "cores")
	}
	fmt.Println()
	var one, simOne float64
	for i := 0; i < len(sets); {
		st := sets[i]
		rate := med(st.rates)
		if one == 0 {
			one = rate
		}
		fmt.Printf("%-8d %12.0f %7.2f× %8.2f", st.workers, rate, rate/one, med(st.cores))
		i++
		if sim.latency > 0 {
			st := sets[i]
			rate := med(st.rates)
			if simOne == 0 {
				simOne = rate
			}
			fmt.Printf(" %12.0f %7.2f× %7.2f× %8.2f", rate, rate/simOne, float64(st.workers)/float64(sets[1].workers), med(st.cores))
			i++
		}
		fmt.Println()
	}
	return nil
}

// cpuTime is the process's CPU time so far, user and system: the
// servers', the workers' and the bench's.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func round(d time.Duration) string { return d.Round(time.Microsecond).String() }

// tools is one in-memory read-only tool: a step is one journal append.
type tools struct{}

func (tools) Specs(context.Context) []keel.ToolSpec {
	return []keel.ToolSpec{{Name: "look", Description: "Look.", SideEffects: keel.SideEffectReadOnly, InputSchema: json.RawMessage(`{"type":"object"}`)}}
}

func (tools) Call(context.Context, keel.ToolInvocation) (json.RawMessage, error) {
	return json.RawMessage(`{"seen":true}`), nil
}

// chain is the model: n-1 tool calls, then an answer.
func chain(n int) *scripted.Provider { return slowChain(n, 0) }

// slowChain is chain answering each call after latency, as a remote
// model would: the call's goroutine waits, taking no CPU.
func slowChain(n int, latency time.Duration) *scripted.Provider {
	return scripted.ByGoal(nil, func(string) []scripted.Step {
		return []scripted.Step{scripted.Repeat(scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
			if latency > 0 {
				time.Sleep(latency)
			}
			k := 0
			for _, m := range req.Messages {
				if m.Role == models.RoleTool {
					k++
				}
			}
			if k >= n-1 {
				return models.ChatResponse{Message: models.Message{Content: "done"}}, nil
			}
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{ID: fmt.Sprintf("c%d", k+1), Name: "look", Arguments: json.RawMessage(`{}`)}}}}, nil
		}))}
	})
}

// stepCost runs reps runs of n steps one after the other (after one
// untimed) and returns the median time per step.
func stepCost(ctx context.Context, st engine.Store, n, reps int) (time.Duration, error) {
	e, err := engine.New(engine.Config{Store: st, Model: chain(n), Tools: tools{}, DefaultMaxSteps: n + 1})
	if err != nil {
		return 0, err
	}
	defer e.Close(ctx)
	var per []time.Duration
	for i := range reps + 1 {
		t0 := time.Now()
		r, err := e.Start(ctx, keel.StartRequest{Goal: fmt.Sprintf("run %d", i)})
		if err != nil {
			return 0, err
		}
		if err := e.Wait(ctx, r.ID); err != nil {
			return 0, err
		}
		d := time.Since(t0)
		if got, err := st.GetRun(ctx, r.ID); err != nil || got.Status != keel.RunSucceeded {
			return 0, fmt.Errorf("run %s ended %s: %v", r.ID, got.Status, err)
		}
		if i > 0 {
			per = append(per, d/time.Duration(n))
		}
	}
	slices.Sort(per)
	return per[len(per)/2], nil
}

// msgsPerStep is what the last jetStreamCost sent per step: journal
// appends, span writes and reads.
var msgsPerStep float64

// jetStreamCost is stepCost on a jsstore over cl, and the median of 200
// guarded publishes (the floor).
func jetStreamCost(ctx context.Context, cl *natstest.Cluster, replicas, n, reps int) (step, floor time.Duration, err error) {
	nc, err := cl.Connect()
	if err != nil {
		return 0, 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, 0, err
	}
	st, err := jsstore.Open(ctx, js, jsstore.Config{Namespace: "bench", Replicas: replicas})
	if err != nil {
		return 0, 0, err
	}
	before := nc.Stats()
	if step, err = stepCost(ctx, st, n, reps); err != nil {
		return 0, 0, err
	}
	after := nc.Stats()
	msgsPerStep = float64(after.OutMsgs-before.OutMsgs) / float64((reps+1)*n)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FLOOR", Subjects: []string{"floor"}, Replicas: replicas}); err != nil {
		return 0, 0, err
	}
	var ds []time.Duration
	last := uint64(0)
	for range 200 {
		t0 := time.Now()
		ack, err := js.Publish(ctx, "floor", []byte(`{"events":[{"seq":1}]}`), jetstream.WithExpectLastSequencePerSubject(last))
		if err != nil {
			return 0, 0, err
		}
		ds = append(ds, time.Since(t0))
		last = ack.Sequence
	}
	slices.Sort(ds)
	return step, ds[len(ds)/2], nil
}

// sqliteFloor is the median of k single-row commits at synchronous=FULL.
func sqliteFloor(path string, k int) (time.Duration, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)")
	if err != nil {
		return 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(`CREATE TABLE t (v INTEGER)`); err != nil {
		return 0, err
	}
	var ds []time.Duration
	for i := range k {
		t0 := time.Now()
		if _, err := db.Exec(`INSERT INTO t (v) VALUES (?)`, i); err != nil {
			return 0, err
		}
		ds = append(ds, time.Since(t0))
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

// scaleOut queues runs and runs them with w workers, whose model answers
// after latency; it returns steps per second from the workers' start to
// the last run's end, and the process's CPU over that time as cores busy.
func scaleOut(ctx context.Context, cl *natstest.Cluster, w, runs, n, maxRuns int, latency time.Duration) (rate, cores float64, err error) {
	ns := "scale"
	nc, err := cl.Connect()
	if err != nil {
		return 0, 0, err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := cloud.Setup(ctx, js, ns, 3, 30*time.Second); err != nil {
		return 0, 0, err
	}
	st, err := jsstore.Open(ctx, js, jsstore.Config{Namespace: ns})
	if err != nil {
		return 0, 0, err
	}
	// Ends are counted from the journal stream, as stored.
	s, err := js.Stream(ctx, ns+"_JOURNAL")
	if err != nil {
		return 0, 0, err
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return 0, 0, err
	}
	ended := make(chan struct{}, runs)
	cc, err := oc.Consume(func(m jetstream.Msg) {
		var b struct {
			Update *keel.RunUpdate `json:"update"`
		}
		if json.Unmarshal(m.Data(), &b) == nil && b.Update != nil && b.Update.Status.Terminal() {
			ended <- struct{}{}
		}
	})
	if err != nil {
		return 0, 0, err
	}
	defer cc.Stop()
	for i := range runs {
		key := fmt.Sprintf("run-%d", i)
		if err := cloud.Submit(ctx, js, ns, keel.StartRequest{Goal: key, IdempotencyKey: key}); err != nil {
			return 0, 0, err
		}
	}
	var ws []*cloud.Worker
	var mu sync.Mutex
	t0, c0 := time.Now(), cpuTime()
	for i := range w {
		wc, err := cl.Connect(nats.Name(fmt.Sprintf("w%d", i)))
		if err != nil {
			return 0, 0, err
		}
		worker, err := cloud.Start(ctx, wc, cloud.Config{Namespace: ns, Name: fmt.Sprintf("w%d", i), MaxRuns: maxRuns,
			NewEngine: func(st engine.Store) (*engine.Engine, error) {
				return engine.New(engine.Config{Store: st, Model: slowChain(n, latency), Tools: tools{}, DefaultMaxSteps: n + 1})
			}})
		if err != nil {
			return 0, 0, err
		}
		mu.Lock()
		ws = append(ws, worker)
		mu.Unlock()
	}
	defer func() {
		for _, worker := range ws {
			worker.Close(context.Background())
		}
	}()
	timeout := time.After(10 * time.Minute)
	for range runs {
		select {
		case <-ended:
		case <-timeout:
			return 0, 0, fmt.Errorf("runs did not end within 10 minutes")
		}
	}
	elapsed, cpu := time.Since(t0), cpuTime()-c0
	done, err := st.RunsWithStatus(ctx, keel.RunSucceeded)
	if err != nil {
		return 0, 0, err
	}
	if len(done) != runs {
		return 0, 0, fmt.Errorf("%d of %d runs succeeded", len(done), runs)
	}
	return float64(runs*n) / elapsed.Seconds(), cpu.Seconds() / elapsed.Seconds(), nil
}
