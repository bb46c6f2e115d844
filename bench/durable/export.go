package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/store"
	"github.com/keel-runtime/keel/telemetry"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
)

// The -export mode: a run's step time with OTLP export off, on with the
// collector up, and on with the collector down (issue 17).

// exportModes are the settings compared, in the order of the results:
// no telemetry at all, the daemon's default (metrics, no export), export
// to a collector that is up, to one that is down, and no telemetry again
// (the noise floor).
var exportModes = []string{"off", "metrics", "up", "down", "off again"}

const numModes = 5

// switchedTracer is the engine's tracer, switched between runs: the
// store's alone (export off), or the store's through an exporter.
type switchedTracer struct {
	cur atomic.Pointer[tracerChoice]
}

type tracerChoice struct {
	tr telemetry.Tracer
	j  telemetry.Journal
	x  *telemetry.Exporter // nil: export off
}

// switchedJournal is the engine's journal, switched with the tracer: the
// store's, or the store's through the exporter (Exporter.Journal), as
// the daemon wires it.
type switchedJournal struct {
	telemetry.Journal // the store, for the methods not switched
	sw                *switchedTracer
}

func (s switchedJournal) CreateRun(ctx context.Context, r keel.Run) error {
	return s.sw.cur.Load().j.CreateRun(ctx, r)
}
func (s switchedJournal) CreateRunWith(ctx context.Context, r keel.Run, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error) {
	return s.sw.cur.Load().j.CreateRunWith(ctx, r, evs, upd)
}
func (s switchedJournal) AppendAll(ctx context.Context, id keel.RunID, evs []keel.Event, upd *keel.RunUpdate) ([]keel.Event, error) {
	return s.sw.cur.Load().j.AppendAll(ctx, id, evs, upd)
}

func (s *switchedTracer) StartSpan(ctx context.Context, sp keel.Span) error {
	return s.cur.Load().tr.StartSpan(ctx, sp)
}
func (s *switchedTracer) FinishSpan(ctx context.Context, sp keel.Span) error {
	return s.cur.Load().tr.FinishSpan(ctx, sp)
}
func (s *switchedTracer) Sync(ctx context.Context) error { return s.cur.Load().tr.Sync(ctx) }
func (s *switchedTracer) Spans(ctx context.Context, id keel.RunID) ([]keel.Span, error) {
	return s.cur.Load().tr.Spans(ctx, id)
}
func (s *switchedTracer) RunsWithOpenSpans(ctx context.Context) ([]keel.RunID, error) {
	return s.cur.Load().tr.RunsWithOpenSpans(ctx)
}

// onEvent hands the engine's events to the exporter in use, as the
// daemon subscribes its exporter.
func (s *switchedTracer) onEvent(ev keel.Event) {
	if x := s.cur.Load().x; x != nil {
		x.OnEvent(ev)
	}
}

// otlpReceiver is an in-process OTLP/gRPC collector that accepts and
// discards: the collector "up" when no real one is given
// (KEEL_TEST_OTLP_GRPC unset).
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	spans atomic.Int64
}

func (r *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			r.spans.Add(int64(len(ss.Spans)))
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// exportResult is the step time of one run in each mode.
type exportResult struct {
	sync      string
	collector string
	// collectorCPU is the collector's CPU time (a process named by
	// KEEL_TEST_JAEGER_PID) over the whole measurement, all modes; 0
	// when unknown.
	collectorCPU time.Duration
	step         [numModes]time.Duration // medians per step, by exportModes
	ratio        [numModes]float64       // medians of the reps' mode/off
	cpu          [numModes]time.Duration
	cpuRatio     [numModes]float64
	// exportRatio and cpuExport are the medians of the reps' up/metrics
	// and down/metrics: what export adds to the daemon's default.
	exportRatio, cpuExport [2]float64
	// runsRatio is the same for the wall-clock time of the runs alone
	// (and the store's commit of what they left), without the flush at
	// the end of the block: what a run waits, as the daemon's runs never
	// wait for their export (whose CPU is in the CPU figures).
	runsRatio [2]float64
	up, down  telemetry.Stats
	// split is where each mode's CPU went, summed over its blocks.
	split [numModes]cpuSplit
}

// cpuSplit is the CPU of a mode's blocks, in parts: the runs and the
// store's commit of what they left waiting, then the exporter's flush at
// the end of the block; the GC cycles that ended during the blocks, and
// the heap allocations made.
type cpuSplit struct {
	blocks             int
	runs, flush        time.Duration
	sys                time.Duration // of runs and flush, in the kernel
	gc                 uint64
	allocs, allocBytes uint64
}

// gcStats are the runtime's counts so far: GC cycles completed, heap
// allocations and their bytes.
func gcStats() (cycles, allocs, bytes uint64) {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/allocs:objects"}, {Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64(), s[2].Value.Uint64()
}

// measureExport times reps sets of single runs of n steps on one engine
// and database file, the modes taking turns in a rotating order.
//
// With only set (a mode's name), it times that mode alone, reps blocks
// one after another: res.step and res.cpu hold its medians, at its index.
//
// With noGC, the GC is off during each block (and run between them).
func measureExport(ctx context.Context, dir, synchronous string, n, reps, block int, upEndpoint, only string, noGC bool) (exportResult, error) {
	res := exportResult{sync: synchronous}
	st, err := store.OpenWith(ctx, filepath.Join(dir, "keel-export-"+synchronous+".db"), store.Options{Synchronous: synchronous})
	if err != nil {
		return res, err
	}
	defer st.Close()
	if upEndpoint == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return res, err
		}
		srv := grpc.NewServer()
		collectortrace.RegisterTraceServiceServer(srv, &otlpReceiver{})
		go srv.Serve(ln)
		defer srv.Stop()
		upEndpoint = ln.Addr().String()
		res.collector = "an in-process OTLP/gRPC receiver (no KEEL_TEST_OTLP_GRPC)"
	} else {
		res.collector = "Jaeger at " + upEndpoint + " (KEEL_TEST_OTLP_GRPC)"
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	downEndpoint := closed.Addr().String()
	closed.Close()
	newX := func(endpoint string) (*telemetry.Exporter, error) {
		file := `{}`
		if endpoint != "" {
			file = fmt.Sprintf(`{"endpoint": %q, "insecure": true, "service_name": "keel-bench"}`, endpoint)
		}
		cfg, err := telemetry.ParseConfig("telemetry.json", []byte(file))
		if err != nil {
			return nil, err
		}
		// The exporter's goroutines carry a profiler label naming it
		// (-cpuprofile, then pprof -tagfocus exporter=down).
		name := "metrics"
		switch endpoint {
		case upEndpoint:
			name = "up"
		case downEndpoint:
			name = "down"
		}
		var x *telemetry.Exporter
		pprof.Do(ctx, pprof.Labels("exporter", name), func(context.Context) {
			x, err = telemetry.New(telemetry.Options{Config: cfg, Runs: st})
		})
		return x, err
	}
	metricsOnly, err := newX("")
	if err != nil {
		return res, err
	}
	up, err := newX(upEndpoint)
	if err != nil {
		return res, err
	}
	down, err := newX(downEndpoint)
	if err != nil {
		return res, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		up.Close(cctx)
		down.Close(cctx)
		metricsOnly.Close(cctx)
	}()
	sw := &switchedTracer{}
	choices := []*tracerChoice{{tr: st, j: st}, {tr: metricsOnly.Tracer(st), j: metricsOnly.Journal(st), x: metricsOnly},
		{tr: up.Tracer(st), j: up.Journal(st), x: up}, {tr: down.Tracer(st), j: down.Journal(st), x: down}, {tr: st, j: st}}
	sw.cur.Store(choices[0])
	eng, err := engine.New(engine.Config{Store: struct {
		engine.Journal
		engine.Tracer
	}{switchedJournal{st, sw}, sw}, Model: chain{n}, Tools: tools{}, DefaultMaxSteps: n})
	if err != nil {
		return res, err
	}
	unsub := eng.Subscribe(sw.onEvent)
	defer unsub()
	b := &bed{st: st, eng: eng}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		eng.Close(cctx)
	}()
	onlyMode := slices.Index(exportModes, only)
	for i := 0; st.Commits() < warmCommits; i++ {
		if onlyMode >= 0 {
			sw.cur.Store(choices[onlyMode])
		} else {
			sw.cur.Store(choices[i%4])
		}
		if _, err := runAll(ctx, b, fmt.Sprintf("warm-up-%d", i), 1, n); err != nil {
			return res, fmt.Errorf("warm-up: %w", err)
		}
	}
	var oneIn func(ctx context.Context, mode, i int) (wall, cpu time.Duration, err error)
	var runsWall [numModes]time.Duration // of each mode's last block, before its flush
	// one times block runs of mode back to back, then the flush of what
	// they left in the exporter's queue: each mode's measurement carries
	// the whole of its own export, and none of another's (the export
	// goroutine works beside the runs, so without the flush a batch from
	// one mode's runs would be sent during the next mode's).
	one := func(mode, i int) (wall, cpu time.Duration, err error) {
		// The runs' goroutines carry the mode too (pprof -tagfocus
		// mode=up), so that a profile splits the runs' work by mode.
		pprof.Do(ctx, pprof.Labels("mode", exportModes[mode]), func(ctx context.Context) {
			wall, cpu, err = oneIn(ctx, mode, i)
		})
		return wall, cpu, err
	}
	oneIn = func(ctx context.Context, mode, i int) (wall, cpu time.Duration, err error) {
		ch := choices[mode]
		sw.cur.Store(ch)
		// Each block starts from a collected heap, so that the GC work a
		// block does is that of its own garbage: else the flush's wait
		// for the collector's answer ("up"), when the process is idle,
		// would have the GC's idle workers finish the cycles other
		// modes' blocks started.
		runtime.GC()
		if noGC {
			// The GC off during the block: its CPU is the work of the
			// runs and of the export alone, and what the export adds to
			// the GC's work shows in the allocations a step.
			defer debug.SetGCPercent(debug.SetGCPercent(-1))
		}
		gc0, allocs0, bytes0 := gcStats()
		c0, s0 := cpuTime(), sysTime()
		t0 := time.Now()
		for j := range block {
			bt, err := runAll(ctx, b, fmt.Sprintf("one-%d-%d-%d", i, mode, j), 1, n)
			if err != nil {
				return 0, 0, err
			}
			if bt.steps != int64(n) {
				return 0, 0, fmt.Errorf("the run made %d steps, want %d", bt.steps, n)
			}
		}
		// The store's writes the runs left waiting (their last spans)
		// are committed before the flush, in every mode: else a flush
		// that waits for the collector's answer ("up") has them
		// committed in its window, and the other modes after theirs.
		if err := st.Sync(ctx); err != nil {
			return 0, 0, err
		}
		c1 := cpuTime()
		runsWall[mode] = time.Since(t0)
		if ch.x != nil {
			if err := ch.x.Flush(ctx); err != nil {
				return 0, 0, err
			}
		}
		c2, s2 := cpuTime(), sysTime()
		steps := time.Duration(block * n)
		wall, cpu = time.Since(t0)/steps, (c2-c0)/steps
		sp := &res.split[mode]
		sp.blocks++
		sp.runs += c1 - c0
		sp.flush += c2 - c1
		sp.sys += s2 - s0
		gc1, allocs1, bytes1 := gcStats()
		sp.gc += gc1 - gc0
		sp.allocs += allocs1 - allocs0
		sp.allocBytes += bytes1 - bytes0
		return wall, cpu, nil
	}
	// Each rep takes the modes in an order of its own, drawn from a
	// seeded source: a rotation keeps neighbours together, and whatever
	// one mode leaves behind (GC debt, a batch) would always fall on
	// the same next one.
	collector0 := processCPU(os.Getenv("KEEL_TEST_JAEGER_PID"))
	if onlyMode >= 0 {
		walls, cpus := make([]time.Duration, reps), make([]time.Duration, reps)
		for i := range reps {
			if walls[i], cpus[i], err = one(onlyMode, i); err != nil {
				return res, err
			}
		}
		slices.Sort(walls)
		slices.Sort(cpus)
		res.step[onlyMode], res.cpu[onlyMode] = walls[reps/2], cpus[reps/2]
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err = errors.Join(up.Close(cctx), down.Close(cctx))
		res.up, res.down = up.Stats(), down.Stats()
		if c := processCPU(os.Getenv("KEEL_TEST_JAEGER_PID")); c > 0 && collector0 > 0 {
			res.collectorCPU = c - collector0
		}
		return res, err
	}
	rng := rand.New(rand.NewPCG(17, uint64(reps)))
	var walls, cpus [numModes][]time.Duration
	var ratios, cpuRatios [numModes][]float64
	var exp, cpuExp, runsExp [2][]float64
	for i := range reps {
		var got, cpu [numModes]time.Duration
		for k, m := range rng.Perm(numModes) {
			if got[m], cpu[m], err = one(m, i*numModes+k); err != nil {
				return res, err
			}
		}
		for j := range 2 {
			exp[j] = append(exp[j], float64(got[2+j])/float64(got[1]))
			cpuExp[j] = append(cpuExp[j], float64(cpu[2+j])/float64(max(cpu[1], 1)))
			runsExp[j] = append(runsExp[j], float64(runsWall[2+j])/float64(runsWall[1]))
		}
		for m := range numModes {
			walls[m], cpus[m] = append(walls[m], got[m]), append(cpus[m], cpu[m])
			ratios[m] = append(ratios[m], float64(got[m])/float64(got[0]))
			if cpu[0] > 0 {
				cpuRatios[m] = append(cpuRatios[m], float64(cpu[m])/float64(cpu[0]))
			}
		}
	}
	for j := range 2 {
		slices.Sort(exp[j])
		slices.Sort(cpuExp[j])
		slices.Sort(runsExp[j])
		res.exportRatio[j], res.cpuExport[j], res.runsRatio[j] = exp[j][reps/2], cpuExp[j][reps/2], runsExp[j][reps/2]
	}
	for m := range numModes {
		slices.Sort(walls[m])
		slices.Sort(cpus[m])
		slices.Sort(ratios[m])
		res.step[m], res.cpu[m], res.ratio[m] = walls[m][reps/2], cpus[m][reps/2], ratios[m][reps/2]
		if len(cpuRatios[m]) > 0 {
			slices.Sort(cpuRatios[m])
			res.cpuRatio[m] = cpuRatios[m][reps/2]
		}
	}
	// Let the last batches go (or fail) before the counters are read.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = errors.Join(up.Close(cctx), down.Close(cctx))
	res.up, res.down = up.Stats(), down.Stats()
	if c := processCPU(os.Getenv("KEEL_TEST_JAEGER_PID")); c > 0 && collector0 > 0 {
		res.collectorCPU = c - collector0
	}
	if res.up.Exported == 0 || res.up.Failed+res.up.Dropped > 0 {
		return res, fmt.Errorf("collector up: %+v, want every span exported (%v)", res.up, err)
	}
	if res.down.Exported != 0 || res.down.Failed+res.down.Dropped == 0 {
		return res, fmt.Errorf("collector down: %+v, want every span failed or dropped", res.down)
	}
	return res, nil
}

// runExport is the -export mode: the export comparison alone, at each
// synchronous setting.
func runExport(ctx context.Context, cfg config, dir string) error {
	fmt.Printf("OTLP export off vs on (collector up, collector down): %d runs of %d steps (echo tool calls) back to back and the exporter's flush, median of %d reps of 5 such blocks (off: no telemetry; metrics: the daemon's default, no export; up; down; off again), each rep in an order of its own\n",
		cfg.exportBlock, cfg.n, cfg.reps)
	for _, s := range cfg.syncs {
		progress("%s: keel, telemetry off / metrics / up / down, %d reps of 5 blocks of %d runs of %d steps", s, cfg.reps, cfg.exportBlock, cfg.n)
		r, err := measureExport(ctx, dir, s, cfg.n, cfg.reps, cfg.exportBlock, os.Getenv("KEEL_TEST_OTLP_GRPC"), cfg.exportOnly, cfg.exportNoGC)
		if err != nil {
			return fmt.Errorf("synchronous=%s: %w", s, err)
		}
		if m := slices.Index(exportModes, cfg.exportOnly); m >= 0 {
			fmt.Printf("collector up: %s; down: a closed port\n", r.collector)
			fmt.Printf("synchronous=%-6s %s alone, per step: %s wall, %s CPU (median of %d blocks)\n", r.sync, cfg.exportOnly, dur(r.step[m]), dur(r.cpu[m]), cfg.reps)
			if r.collectorCPU > 0 && r.up.Exported > 0 {
				fmt.Printf("synchronous=%-6s the collector's own CPU (same machine): %s a span exported\n", r.sync, dur(r.collectorCPU/time.Duration(r.up.Exported)))
			}
			fmt.Printf("synchronous=%-6s spans: up %d exported, %d dropped, %d failed; down %d exported, %d dropped, %d failed\n",
				r.sync, r.up.Exported, r.up.Dropped, r.up.Failed, r.down.Exported, r.down.Dropped, r.down.Failed)
			printSplit(r, cfg.n*cfg.exportBlock)
			continue
		}
		fmt.Printf("collector up: %s; down: a closed port\n", r.collector)
		fmt.Printf("synchronous=%-6s per step: off %s, metrics %s, up %s, down %s; metrics/off %+.1f%%, up/off %+.1f%%, down/off %+.1f%%; noise floor off/off %+.1f%%\n",
			r.sync, dur(r.step[0]), dur(r.step[1]), dur(r.step[2]), dur(r.step[3]), (r.ratio[1]-1)*100, (r.ratio[2]-1)*100, (r.ratio[3]-1)*100, (r.ratio[4]-1)*100)
		fmt.Printf("synchronous=%-6s export's own cost per step: up/metrics %+.1f%%, down/metrics %+.1f%%; the runs' wall alone (no flush): up/metrics %+.1f%%, down/metrics %+.1f%%\n",
			r.sync, (r.exportRatio[0]-1)*100, (r.exportRatio[1]-1)*100, (r.runsRatio[0]-1)*100, (r.runsRatio[1]-1)*100)
		if r.cpu[0] > 0 {
			fmt.Printf("synchronous=%-6s CPU per step: off %s, metrics %s, up %s, down %s; metrics/off %+.1f%%, up/off %+.1f%%, down/off %+.1f%%; noise floor %+.1f%%; up/metrics %+.1f%%, down/metrics %+.1f%%\n",
				r.sync, dur(r.cpu[0]), dur(r.cpu[1]), dur(r.cpu[2]), dur(r.cpu[3]), (r.cpuRatio[1]-1)*100, (r.cpuRatio[2]-1)*100, (r.cpuRatio[3]-1)*100, (r.cpuRatio[4]-1)*100,
				(r.cpuExport[0]-1)*100, (r.cpuExport[1]-1)*100)
		}
		if r.collectorCPU > 0 && r.up.Exported > 0 {
			fmt.Printf("synchronous=%-6s the collector's own CPU (same machine): %s a span exported, %s a step of up\n",
				r.sync, dur(r.collectorCPU/time.Duration(r.up.Exported)), dur(r.collectorCPU*time.Duration(3)/time.Duration(r.up.Exported)))
		}
		fmt.Printf("synchronous=%-6s spans: up %d exported, %d dropped, %d failed; down %d exported, %d dropped, %d failed\n",
			r.sync, r.up.Exported, r.up.Dropped, r.up.Failed, r.down.Exported, r.down.Dropped, r.down.Failed)
		printSplit(r, cfg.n*cfg.exportBlock)
	}
	return nil
}

// processCPU is the CPU time (user and system) process pid has used, from
// /proc (Linux); 0 when pid is "" or it cannot be read.
func processCPU(pid string) time.Duration {
	if pid == "" {
		return 0
	}
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command (which may hold spaces), from the
	// state on: utime and stime are the 12th and 13th, in clock ticks
	// (100 a second on Linux).
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(u+st) * 10 * time.Millisecond
}

// serveSink is -otlp-sink: an OTLP/gRPC trace receiver on addr that
// reads each request's bytes and answers at once, without decoding
// them (rawCodec), until the process is stopped.
func serveSink(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr().String())
	srv := grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}))
	collectortrace.RegisterTraceServiceServer(srv, sinkServer{})
	return srv.Serve(ln)
}

type sinkServer struct {
	collectortrace.UnimplementedTraceServiceServer
}

func (sinkServer) Export(context.Context, *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// rawCodec leaves requests undecoded and answers with an empty message.
type rawCodec struct{}

func (rawCodec) Marshal(any) (mem.BufferSlice, error) { return mem.BufferSlice{}, nil }
func (rawCodec) Unmarshal(mem.BufferSlice, any) error { return nil }
func (rawCodec) Name() string                         { return "proto" }

// printSplit prints where each mode's CPU went, as means per step.
func printSplit(r exportResult, steps int) {
	fmt.Printf("synchronous=%-6s CPU per step, means: the runs (their commits included) + the exporter's flush, allocations and bytes a step; GC cycles per block; of the CPU, in the kernel:", r.sync)
	for m, sp := range r.split {
		if sp.blocks == 0 {
			continue
		}
		k := time.Duration(sp.blocks * steps)
		fmt.Printf(" %s %s + %s, %d, %d B, %.2f, %s;", exportModes[m], dur(sp.runs/k), dur(sp.flush/k), sp.allocs/uint64(k), sp.allocBytes/uint64(k), float64(sp.gc)/float64(sp.blocks), dur(sp.sys/k))
	}
	fmt.Println()
}
