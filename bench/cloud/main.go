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
//     the last end.
//
// Everything (the three servers, the workers, the model) shares this
// machine's cores: on two cores the workers compete with the servers,
// so scale-out shows the shape, not what separate machines would give.
//
//	go run ./bench/cloud [-n 20] [-reps 15] [-runs 60] [-max-runs 16] [-workers 1,2,3]
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
	"time"

	"github.com/keel-runtime/keel"
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
	workers := flag.String("workers", "1,2,3", "worker counts for the scale-out figure")
	flag.Parse()
	if err := run(*n, *reps, *runs, *maxRuns, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "cloud:", err)
		os.Exit(1)
	}
}

func run(n, reps, runs, maxRuns int, workerList string) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "bench-cloud-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Printf("GOMAXPROCS %d, %d steps a run, median of %d runs\n\n", runtime.GOMAXPROCS(0), n, reps)
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

	fmt.Printf("\nscale-out: %d runs of %d steps on JetStream R3 (default sync), %d runs at once per worker\n", runs, n, maxRuns)
	fmt.Printf("%-8s %12s %10s\n", "workers", "steps/s", "vs 1")
	var one float64
	for _, f := range strings.Split(workerList, ",") {
		w, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || w < 1 {
			return fmt.Errorf("-workers: %q", f)
		}
		cl, err := natstest.Start(natstest.Options{Dir: filepath.Join(dir, fmt.Sprintf("scale-%d", w))})
		if err != nil {
			return err
		}
		rate, err := scaleOut(ctx, cl, w, runs, n, maxRuns)
		cl.Close()
		if err != nil {
			return fmt.Errorf("%d workers: %w", w, err)
		}
		if one == 0 {
			one = rate
		}
		fmt.Printf("%-8d %12.0f %9.2f×\n", w, rate, rate/one)
	}
	return nil
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
func chain(n int) *scripted.Provider {
	return scripted.ByGoal(nil, func(string) []scripted.Step {
		return []scripted.Step{scripted.Repeat(scripted.AnswerFunc(func(req models.ChatRequest) (models.ChatResponse, error) {
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

// scaleOut queues runs and runs them with w workers; it returns steps
// per second from the workers' start to the last run's end.
func scaleOut(ctx context.Context, cl *natstest.Cluster, w, runs, n, maxRuns int) (float64, error) {
	ns := "scale"
	nc, err := cl.Connect()
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := cloud.Setup(ctx, js, ns, 3, 30*time.Second); err != nil {
		return 0, err
	}
	st, err := jsstore.Open(ctx, js, jsstore.Config{Namespace: ns})
	if err != nil {
		return 0, err
	}
	// Ends are counted from the journal stream, as stored.
	s, err := js.Stream(ctx, ns+"_JOURNAL")
	if err != nil {
		return 0, err
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return 0, err
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
		return 0, err
	}
	defer cc.Stop()
	for i := range runs {
		key := fmt.Sprintf("run-%d", i)
		if err := cloud.Submit(ctx, js, ns, keel.StartRequest{Goal: key, IdempotencyKey: key}); err != nil {
			return 0, err
		}
	}
	var ws []*cloud.Worker
	var mu sync.Mutex
	t0 := time.Now()
	for i := range w {
		wc, err := cl.Connect(nats.Name(fmt.Sprintf("w%d", i)))
		if err != nil {
			return 0, err
		}
		worker, err := cloud.Start(ctx, wc, cloud.Config{Namespace: ns, Name: fmt.Sprintf("w%d", i), MaxRuns: maxRuns,
			NewEngine: func(st engine.Store) (*engine.Engine, error) {
				return engine.New(engine.Config{Store: st, Model: chain(n), Tools: tools{}, DefaultMaxSteps: n + 1})
			}})
		if err != nil {
			return 0, err
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
			return 0, fmt.Errorf("runs did not end within 10 minutes")
		}
	}
	elapsed := time.Since(t0)
	done, err := st.RunsWithStatus(ctx, keel.RunSucceeded)
	if err != nil {
		return 0, err
	}
	if len(done) != runs {
		return 0, fmt.Errorf("%d of %d runs succeeded", len(done), runs)
	}
	return float64(runs*n) / elapsed.Seconds(), nil
}
