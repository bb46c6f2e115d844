// Command durable measures what a durable step costs in keel and in
// LangGraph.js with its SQLite checkpointer, on this machine in one run, at
// equal durability settings: both sides keep SQLite in WAL mode, and every
// figure is taken twice, with synchronous=FULL (each commit is fsync'd:
// keel's setting) and with synchronous=NORMAL (a commit reaches the OS; the
// WAL is synced at checkpoints; better-sqlite3's setting on a reopened
// file), set explicitly on both sides.
//
// It measures, each on a fresh database file in one directory (and each
// after one untimed run on it):
//
//   - the floor: one SQLite commit on this disk (modernc.org/sqlite, a
//     single-row INSERT per transaction), p50 and mean;
//   - keel: a real store.Store and engine.Engine over a deterministic
//     model (chain) that asks for an in-memory read-only tool n-1 times
//     and then answers, so a run makes n steps (model calls), each
//     journaled with its tool call and result before the run goes on. One
//     run: time per step and per journaled event, each run paired with
//     floor commits taken just before it (the median of -reps). C runs
//     started together, for each C in -c: steps and events per second.
//     Then the time to resume -resume interrupted
//     runs (engine.New and Resume until every one has succeeded), and, at
//     FULL only, the Go heap and goroutines per run waiting for an
//     approval (-waiting runs);
//   - LangGraph.js (langgraph/bench.mjs, installed with npm ci on first
//     use): a StateGraph of n nodes in a chain, each adding one to a
//     counter, checkpointed by SqliteSaver with durability "sync" (each
//     step committed before the next starts): one run's time per step (the
//     median of 5) and SQLite commits per step, and steps per second with C
//     concurrent runs.
//
// A concurrent measurement after the first is skipped when the previous
// one's rate projects it to take longer than -budget; the projection is
// printed instead. It prints a table with the ratios: keel step / floor,
// LangGraph.js step / floor, and keel ÷ LangGraph.js steps per second with
// C concurrent runs.
//
//	go run ./bench/durable [-n 50] [-c 100,1000] [-reps 15] [-sync FULL,NORMAL] [-dir DIR] [-skip-langgraph]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/keel-runtime/keel/engine"
)

// config is what the flags set.
type config struct {
	n           int           // steps per run
	conc        []int         // concurrent runs, one measurement each
	dir         string        // where database files go; "" is a new temporary directory
	floor       int           // commits timed for the floor
	reps        int           // single runs timed, each paired with floor commits
	waiting     int           // runs waiting for approval
	resume      int           // interrupted runs resumed
	budget      time.Duration // longest projected concurrent measurement
	lgDir       string        // the LangGraph.js benchmark
	skipLang    bool
	policy      bool     // measure the policy's cost only (policy.go)
	policyIn    string   // "": on and off in turns; "on" or "off": that side alone (policy.go)
	export      bool     // measure the OTLP export's cost only (export.go)
	exportBlock int      // -export: runs per timed block
	exportOnly  string   // -export: "" all modes in turns, else that mode alone (export.go)
	exportNoGC  bool     // -export: the GC off during each timed block
	syncs       []string // synchronous settings, one column each
}

func main() {
	var cfg config
	var conc, syncs string
	flag.IntVar(&cfg.n, "n", 50, "steps per run (keel: model calls, at most engine.MaxStepsLimit; LangGraph.js: nodes)")
	flag.StringVar(&conc, "c", "100,1000", "comma-separated counts of concurrent runs")
	flag.StringVar(&syncs, "sync", "FULL,NORMAL", "comma-separated synchronous settings to measure at")
	flag.StringVar(&cfg.dir, "dir", "", "directory for the database files (default: a new directory in the system's temporary directory)")
	flag.IntVar(&cfg.floor, "floor", 2000, "commits timed for the floor")
	flag.IntVar(&cfg.reps, "reps", 15, "single runs timed, each right after its own floor commits (the median is reported)")
	flag.IntVar(&cfg.waiting, "waiting", 1000, "runs waiting for approval, for the memory per waiting run")
	flag.IntVar(&cfg.resume, "resume", 100, "interrupted runs to resume")
	flag.DurationVar(&cfg.budget, "budget", 3*time.Minute, "skip a concurrent measurement projected to take longer")
	flag.StringVar(&cfg.lgDir, "langgraph", filepath.Join("bench", "durable", "langgraph"), "directory of the LangGraph.js benchmark")
	flag.BoolVar(&cfg.skipLang, "skip-langgraph", false, "measure keel and the floor only (no node needed)")
	flag.BoolVar(&cfg.policy, "policy", false, "measure only a run's step time with a 1,000-rule policy in force vs none (issue 16)")
	flag.StringVar(&cfg.policyIn, "policy-only", "", "with -policy: time only runs with the policy \"on\" or \"off\", so that each side can be profiled (-cpuprofile) in its own process")
	flag.BoolVar(&cfg.export, "export", false, "measure only a run's step time with OTLP export off vs on, collector up and down (issue 17); KEEL_TEST_OTLP_GRPC names the collector, else an in-process receiver")
	flag.IntVar(&cfg.exportBlock, "export-block", 4, "with -export: runs of one mode timed back to back, with the flush of their spans (one export request a block: 13 runs of 50 steps make 1,950 spans, about the batch the exporter sends when busy, 2,048; 4 make 600, and a request has a fixed cost)")
	flag.StringVar(&cfg.exportOnly, "export-only", "", "with -export: time only this mode (metrics, up or down), each block as in the comparison, so that each mode's whole cost can be profiled (-cpuprofile) in its own process and the profiles compared (pprof -diff_base)")
	flag.BoolVar(&cfg.exportNoGC, "export-nogc", false, "with -export: turn the GC off during each timed block (and collect between blocks), so that the CPU figures are the runs' and the export's own work, with no GC cycle finishing in one mode's window that another's garbage started; the export's garbage shows in the allocations a step")
	sink := flag.String("otlp-sink", "", "serve only an OTLP/gRPC receiver that takes export requests without decoding them, on this address (e.g. 127.0.0.1:0), and print its address: a collector in a process of its own that costs next to nothing, to tell the export's own cost from a collector's (KEEL_TEST_OTLP_GRPC=ADDR KEEL_TEST_JAEGER_PID=PID go run ./bench/durable -export)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole program to this file")
	memProfile := flag.String("memprofile", "", "write an allocation profile of the whole program to this file at its end (go tool pprof -sample_index=alloc_space; -tagfocus does not apply: allocations carry no labels)")
	flag.Parse()
	if *sink != "" {
		if err := serveSink(*sink); err != nil {
			fmt.Fprintln(os.Stderr, "durable: -otlp-sink:", err)
			os.Exit(1)
		}
		return
	}
	if *memProfile != "" {
		defer writeMemProfile(*memProfile)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "durable: -cpuprofile:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	for _, f := range strings.Split(conc, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 || (len(cfg.conc) > 0 && c <= cfg.conc[len(cfg.conc)-1]) {
			fmt.Fprintf(os.Stderr, "durable: -c %q: want increasing positive counts separated by commas\n", conc)
			os.Exit(2)
		}
		cfg.conc = append(cfg.conc, c)
	}
	for _, s := range strings.Split(syncs, ",") {
		s = strings.ToUpper(strings.TrimSpace(s))
		if s != "FULL" && s != "NORMAL" {
			fmt.Fprintf(os.Stderr, "durable: -sync %q: want FULL, NORMAL or both\n", syncs)
			os.Exit(2)
		}
		cfg.syncs = append(cfg.syncs, s)
	}
	if cfg.policyIn != "" && cfg.policyIn != "on" && cfg.policyIn != "off" {
		fmt.Fprintf(os.Stderr, "durable: -policy-only %q: want on or off\n", cfg.policyIn)
		os.Exit(2)
	}
	if o := cfg.exportOnly; o != "" && o != "metrics" && o != "up" && o != "down" {
		fmt.Fprintf(os.Stderr, "durable: -export-only %q: want metrics, up or down\n", o)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		pprof.StopCPUProfile()
		if *memProfile != "" {
			writeMemProfile(*memProfile)
		}
		fmt.Fprintln(os.Stderr, "durable:", err)
		os.Exit(1)
	}
}

// column holds the figures taken at one synchronous setting.
type column struct {
	sync      string
	floor     floorResult
	keel      keelOne
	keelC     map[int]keelMany
	lg        lgResult                 // one run, and the versions
	lgC       map[int]float64          // steps/s
	projected map[string]time.Duration // measurements skipped: "keel 1000", "langgraph 1000"
	resume    keelResume
}

func run(cfg config) error {
	if cfg.n < 1 || cfg.n > engine.MaxStepsLimit {
		return fmt.Errorf("-n %d: want 1..%d (a keel run makes at most %d model calls)", cfg.n, engine.MaxStepsLimit, engine.MaxStepsLimit)
	}
	ctx := context.Background()
	dir, where := cfg.dir, "-dir"
	if dir == "" {
		tmp, err := os.MkdirTemp("", "keel-bench-durable")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir, where = tmp, "os.MkdirTemp"
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	lgDir, err := filepath.Abs(cfg.lgDir)
	if err != nil {
		return err
	}
	if cfg.policy {
		return runPolicy(ctx, cfg, dir)
	}
	if cfg.export {
		return runExport(ctx, cfg, dir)
	}
	if !cfg.skipLang {
		if err := installLangGraph(lgDir); err != nil {
			return err
		}
	}

	var cols []*column
	for _, sync := range cfg.syncs {
		col, err := measureColumn(ctx, cfg, dir, lgDir, sync)
		if err != nil {
			return fmt.Errorf("synchronous=%s: %w", sync, err)
		}
		cols = append(cols, col)
	}
	progress("keel: %d runs waiting for approval", cfg.waiting)
	wait, err := measureKeelWaiting(ctx, dir, cfg.waiting)
	if err != nil {
		return fmt.Errorf("waiting runs: %w", err)
	}
	report(cfg, dir, where, cols, wait)
	return nil
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "durable: "+format+"\n", args...)
}

// measureColumn takes every figure at one synchronous setting.
func measureColumn(ctx context.Context, cfg config, dir, lgDir, sync string) (*column, error) {
	col := &column{sync: sync, keelC: map[int]keelMany{}, lgC: map[int]float64{}, projected: map[string]time.Duration{}}
	var err error
	progress("%s: floor, %d commits", sync, cfg.floor)
	f, err := openFloor(ctx, dir, sync)
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	defer f.Close()
	if col.floor, err = f.measure(ctx, cfg.floor); err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	progress("%s: keel, one run of %d steps", sync, cfg.n)
	if col.keel, err = measureKeelOne(ctx, dir, sync, cfg.n, cfg.reps, f); err != nil {
		return nil, fmt.Errorf("keel, one run: %w", err)
	}
	// Each side's rate at the previous concurrency projects the next.
	var keelRate, lgRate float64
	for i, c := range cfg.conc {
		over := func(rate float64) (time.Duration, bool) {
			if i == 0 {
				return 0, false
			}
			d := time.Duration(float64(c*cfg.n) / rate * float64(time.Second))
			return d, d > cfg.budget
		}
		if d, skip := over(keelRate); skip {
			col.projected[fmt.Sprintf("keel %d", c)] = d
		} else {
			progress("%s: keel, %d runs of %d steps", sync, c, cfg.n)
			m, err := measureKeelMany(ctx, dir, sync, cfg.n, c)
			if err != nil {
				return nil, fmt.Errorf("keel, %d runs: %w", c, err)
			}
			col.keelC[c], keelRate = m, m.stepsPerS
		}
		if cfg.skipLang {
			continue
		}
		if d, skip := over(lgRate); skip {
			col.projected[fmt.Sprintf("langgraph %d", c)] = d
			continue
		}
		// The first invocation measures one run too.
		what := fmt.Sprintf("%d runs of %d steps", c, cfg.n)
		if i == 0 {
			what = "one run, then " + what
		}
		progress("%s: LangGraph.js, %s", sync, what)
		res, err := runLangGraph(lgDir, dir, sync, cfg.n, []int{c}, i == 0)
		if err != nil {
			return nil, fmt.Errorf("LangGraph.js: %w", err)
		}
		if i == 0 {
			col.lg = res
		}
		col.lgC[c], lgRate = res.Concurrent[0].StepsPerS, res.Concurrent[0].StepsPerS
	}
	progress("%s: keel, resume %d interrupted runs", sync, cfg.resume)
	if col.resume, err = measureKeelResume(ctx, dir, sync, cfg.resume); err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	return col, nil
}

// writeMemProfile writes the allocation profile to path.
func writeMemProfile(path string) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "durable: -memprofile:", err)
	}
}
