// Command edges measures a cloud with many edges connected, on this
// machine in one run:
//
//   - memory per connected edge, on the cloud's side: -edges simulated
//     edges run in a child process (this program run again), each a
//     NATS connection of its own to one node of an embedded 3-node
//     JetStream cluster (in turn), which publishes its declaration into
//     the edges bucket as a real edge does (and again every heartbeat)
//     and answers the steps handed to it. The cloud's process (the three
//     servers and the router's table of declarations) is measured
//     before the child starts and once every declaration is in the
//     table: Go heap and stacks, and the process's resident set;
//   - capability-routing latency with every edge connected: a step that
//     needs the local-only tool of one edge, picked at random. Measured
//     in turns: the decision alone (route.Table.Decide over 1,001
//     declarations), and the decision and the hand-off to the edge
//     chosen (request/reply on its step subject through the cluster,
//     until the edge's answer is back). p50 and p99 of each, against the
//     target p99 ≤ 10 ms.
//
// Simulated edges are not daemons: they run no engine and no leaf
// server, they stand for the connections and messages a cloud meets.
//
//	go run ./bench/edges [-edges 1000] [-n 2000] [-heartbeat 5s]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keel-runtime/keel/bench/internal/timing"
	"github.com/keel-runtime/keel/cloud/edge"
	"github.com/keel-runtime/keel/cloud/natstest"
	"github.com/keel-runtime/keel/cloud/route"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const ns = "keel"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "simulate" {
		if err := simulate(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "edges: simulate:", err)
			os.Exit(1)
		}
		return
	}
	edges := flag.Int("edges", 1000, "simulated edges")
	n := flag.Int("n", 2000, "routed steps per measurement")
	heartbeat := flag.Duration("heartbeat", 5*time.Second, "how often each edge publishes its declaration again")
	flag.Parse()
	if err := run(*edges, *n, *heartbeat); err != nil {
		fmt.Fprintln(os.Stderr, "edges:", err)
		os.Exit(1)
	}
}

func run(edges, n int, heartbeat time.Duration) error {
	ctx := context.Background()
	cl, err := natstest.Start(natstest.Options{Domain: edge.DefaultDomain})
	if err != nil {
		return err
	}
	defer cl.Close()
	nc, err := cl.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := edge.Setup(ctx, js, ns, 3, 3*heartbeat); err != nil {
		return err
	}
	reg, err := edge.Watch(ctx, js, ns, nil, route.Env{Name: edge.CloudName, Kind: route.KindCloud, Models: []route.Model{{Name: "big-70b", ContextLength: 131072}}})
	if err != nil {
		return err
	}
	defer reg.Close()
	before := mem()

	exe, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.Command(exe, "simulate", strconv.Itoa(edges), cl.URL(), heartbeat.String())
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		return err
	}
	start := time.Now()
	if err := child.Start(); err != nil {
		return err
	}
	defer func() {
		child.Process.Kill()
		child.Wait()
	}()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
		return fmt.Errorf("the simulated edges did not start: %q %v", line, err)
	}
	for reg.Table.Len() < edges+1 {
		if time.Since(start) > 5*time.Minute {
			return fmt.Errorf("%d of %d declarations in the table after 5 minutes", reg.Table.Len()-1, edges)
		}
		time.Sleep(50 * time.Millisecond)
	}
	joined := time.Since(start)
	after := mem()

	rng := rand.New(rand.NewPCG(1, 2))
	need := func() route.Need {
		return route.Need{Tools: []string{fmt.Sprintf("local-%d", rng.IntN(edges))}, Origin: edge.CloudName}
	}
	var step int
	d, err := timing.MeasureTurns(n,
		func() error {
			_, err := reg.Table.Decide(need())
			return err
		},
		func() error {
			dec, err := reg.Table.Decide(need())
			if err != nil {
				return err
			}
			step++
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err = edge.Offer(ctx, nc, ns, dec.Env, edge.Step{ID: fmt.Sprintf("s%d", step), Goal: "g"})
			return err
		})
	if err != nil {
		return err
	}
	per := func(a, b uint64) float64 { return float64(int64(b)-int64(a)) / float64(edges) / 1024 }
	fmt.Printf("edges %d connected to a 3-node cluster, declared and in the router's table in %s\n", edges, joined.Round(time.Millisecond))
	fmt.Printf("cloud memory per connected edge: %.1f KiB of Go heap and stacks, %.1f KiB of resident set (heap %d → %d MiB, RSS %d → %d MiB)\n",
		per(before.heap, after.heap), per(before.rss, after.rss), before.heap>>20, after.heap>>20, before.rss>>20, after.rss>>20)
	for i, name := range []string{"decision (route.Table.Decide)", "decision + hand-off to the edge"} {
		p99 := pct(d[i], 0.99)
		verdict := "met"
		if p99 > 10*time.Millisecond {
			verdict = "NOT met"
		}
		fmt.Printf("%-34s p50 %9s  p99 %9s  (target p99 ≤ 10ms: %s)\n", name, pct(d[i], 0.50), p99, verdict)
	}
	return nil
}

// pct is the p-th quantile (0..1) of d, to the 100 ns (a decision takes
// less than a microsecond).
func pct(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)].Round(100 * time.Nanosecond)
}

type usage struct{ heap, rss uint64 }

// mem is this process's Go heap and stacks in use after a collection,
// and its resident set.
func mem() usage {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	u := usage{heap: ms.HeapInuse + ms.StackInuse}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseUint(f[1], 10, 64)
				u.rss = kb << 10
			}
		}
	}
	return u
}

// simulate runs the simulated edges: args are how many, the cluster's
// URLs and the heartbeat. It prints "ready" once every one has declared
// itself, and runs until killed.
func simulate(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("want N URLS HEARTBEAT, got %q", args)
	}
	count, err := strconv.Atoi(args[0])
	if err != nil {
		return err
	}
	urls := strings.Split(args[1], ",")
	every, err := time.ParseDuration(args[2])
	if err != nil {
		return err
	}
	type sim struct {
		nc   *nats.Conn
		name string
		decl []byte
	}
	sims := make([]sim, count)
	for i := range sims {
		name := fmt.Sprintf("sim-%04d", i)
		nc, err := nats.Connect(urls[i%len(urls)], nats.Name("keel-edge-"+name))
		if err != nil {
			return err
		}
		decl, _ := json.Marshal(route.Env{Name: name, Kind: route.KindEdge, Version: "bench",
			Tools:  []route.Tool{{Name: "readfile", Labels: []string{"private"}}, {Name: fmt.Sprintf("local-%d", i)}},
			Models: []route.Model{{Name: "small-3b", ContextLength: 8192}}, Labels: []string{"private"}})
		answer, _ := json.Marshal(edge.Accepted{Edge: name, RunID: "run_sim"})
		if _, err := nc.Subscribe(edge.StepSubject(ns, name), func(m *nats.Msg) { m.Respond(answer) }); err != nil {
			return err
		}
		if err := nc.Flush(); err != nil {
			return err
		}
		sims[i] = sim{nc: nc, name: name, decl: decl}
	}
	put := func(s sim) error {
		_, err := s.nc.Request("$KV."+edge.BucketName(ns)+"."+s.name, s.decl, 10*time.Second)
		return err
	}
	for _, s := range sims {
		if err := put(s); err != nil {
			return err
		}
	}
	fmt.Println("ready")
	// Heartbeats, spread over the interval.
	t := time.NewTicker(every / time.Duration(count))
	for i := 0; ; i = (i + 1) % count {
		<-t.C
		put(sims[i])
	}
}
