// Command footprint measures what the keel daemon costs the machine it
// lives on: its resident memory (RSS) when idle, per installed tool, and
// at its peak while compiling tools, and the CPU it uses while nothing
// happens. It builds the keel binary, starts it as a child process on a
// fresh data dir (no Ollama needed: the daemon starts without one) and
// reads the kernel's own accounting of that process (/proc/PID/status
// VmRSS and VmHWM, /proc/PID/stat utime+stime). Linux only.
//
// Six starts, one run each:
//
//  1. cold, 4 tools: a fresh data dir; the daemon installs and compiles
//     its 4 bundled tools. Peak RSS (VmHWM) is over the whole compile.
//  2. warm, 4 tools: a restart of the same data dir (compilation cache
//     warm).
//  3. cold, 10 tools: another fresh data dir with the 4 tools plus 6
//     distinct variants of wordcount (a custom section makes each
//     binary, and so its compiled code, different); peak RSS over the
//     compile of all 10.
//  4. warm, 10 tools: a restart of that data dir. (4 - 2) / 6 is the
//     cost of one more idle installed tool while tools stay loaded.
//  5. and 6. the restarts of 2 and 4 again, with --tools-idle-timeout
//     10s: idle tools unload their compiled code, as they do after the
//     default 5 minutes.
//
// Each start calls every tool once (each granted what it needs), so that
// all are loaded and warm, then idles. The daemon compiles in child
// processes; the daemon's peak (VmHWM), the largest child's (from the
// kernel's rusage, as the daemon logs it) and the largest sum of the
// two sampled every 5 ms are reported apart.
// Every start idles: on a cold start its idle RSS shows whether the
// compile's memory was given back. Idle RSS is read after -idle of no requests (default 50s, long enough
// for idle pooled instances to be released); idle CPU is the CPU time
// the process used in the last -window of that idle time.
//
//	go run ./bench/footprint
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/keel-runtime/keel/bench/internal/tentools"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
)

func main() {
	idle := flag.Duration("idle", 50*time.Second, "how long the daemon idles before its idle RSS is read (past the 30 s after which idle instances are released)")
	window := flag.Duration("window", 10*time.Second, "the last part of the idle time whose CPU use is measured")
	flag.Parse()
	if err := run(*idle, *window); err != nil {
		fmt.Fprintln(os.Stderr, "footprint:", err)
		os.Exit(1)
	}
}

// unloadAfter is the --tools-idle-timeout of the unloading restarts.
const unloadAfter = 10 * time.Second

// targets are issue 13's, in MiB.
const (
	targetIdle4   = 150
	targetPerTool = 8
	targetPeak10  = 600
)

func run(idle, window time.Duration) error {
	if window > idle {
		return errors.New("-window must not be longer than -idle")
	}
	tmp, err := os.MkdirTemp("", "keel-bench-footprint")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "keel")
	fmt.Println("building keel…")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/keel").CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/keel: %v\n%s", err, out)
	}

	four, ten := filepath.Join(tmp, "four"), filepath.Join(tmp, "ten")
	if err := os.MkdirAll(four, 0o700); err != nil {
		return err
	}
	if err := tentools.Seed(ten); err != nil {
		return err
	}

	cold4, err := measure(bin, four, 4, idle, window)
	if err != nil {
		return fmt.Errorf("cold start, 4 tools: %w", err)
	}
	report("cold start, 4 bundled tools (compile), each called once, idle", cold4)
	warm4, err := measure(bin, four, 4, idle, window)
	if err != nil {
		return fmt.Errorf("restart, 4 tools: %w", err)
	}
	report("restart, 4 bundled tools, each called once, idle", warm4)
	cold10, err := measure(bin, ten, 10, idle, window)
	if err != nil {
		return fmt.Errorf("cold start, 10 tools: %w", err)
	}
	report("cold start, 10 tools (compile), each called once, idle", cold10)
	warm10, err := measure(bin, ten, 10, idle, window)
	if err != nil {
		return fmt.Errorf("restart, 10 tools: %w", err)
	}
	report("restart, 10 tools, each called once, idle", warm10)

	// The same restarts with tools unloaded after unloadAfter idle (the
	// default is 5 minutes, longer than this benchmark idles).
	unload := "--tools-idle-timeout=" + unloadAfter.String()
	un4, err := measure(bin, four, 4, idle, window, unload)
	if err != nil {
		return fmt.Errorf("restart, 4 tools, unloading: %w", err)
	}
	report(fmt.Sprintf("restart, 4 bundled tools, each called once, idle, tools unloaded after %s", unloadAfter), un4)
	un10, err := measure(bin, ten, 10, idle, window, unload)
	if err != nil {
		return fmt.Errorf("restart, 10 tools, unloading: %w", err)
	}
	report(fmt.Sprintf("restart, 10 tools, each called once, idle, tools unloaded after %s", unloadAfter), un10)

	per := (warm10.idleRSS - warm4.idleRSS) / 6
	perUn := (un10.idleRSS - un4.idleRSS) / 6
	fmt.Println()
	fmt.Printf("idle RSS, 4 tools warm:       %6.1f MiB (target ≤ %d)\n", mib(warm4.idleRSS), targetIdle4)
	fmt.Printf("idle RSS after a cold start:  %6.1f MiB (4 tools), %.1f MiB (10 tools)\n", mib(cold4.idleRSS), mib(cold10.idleRSS))
	fmt.Printf("idle RSS, 4 tools unloaded:   %6.1f MiB\n", mib(un4.idleRSS))
	fmt.Printf("per additional idle tool:     %6.1f MiB kept loaded, %.1f MiB unloaded (target ≤ %d)\n", mib(per), mib(perUn), targetPerTool)
	fmt.Printf("peak RSS, cold compile of 10: %6.1f MiB the daemon, %.1f MiB the largest compile child (%d children), %.1f MiB daemon+children at the worst moment sampled (target ≤ %d)\n",
		mib(cold10.compilePeak), mib(cold10.childPeak), cold10.children, mib(cold10.sumPeak), targetPeak10)
	fmt.Printf("peak RSS of the daemon, cold start of 10 including the calls that load all 10: %.1f MiB\n", mib(cold10.peakRSS))
	fmt.Printf("idle CPU, 4 tools:            %6.4f of a core over %s\n", warm4.idleCPU, window)
	fmt.Printf("idle CPU, 10 tools:           %6.4f of a core over %s\n", warm10.idleCPU, window)
	return nil
}

func report(label string, m sample) {
	fmt.Printf("%s:\n  ready %v, RSS after calls %.1f MiB, daemon peak %.1f MiB", label, m.ready.Round(time.Millisecond), mib(m.busyRSS), mib(m.peakRSS))
	if m.children > 0 {
		fmt.Printf(", %d compile children, largest child peak %.1f MiB", m.children, mib(m.childPeak))
	}
	fmt.Printf(", while compiling: daemon peak %.1f MiB, daemon+children peak sampled %.1f MiB", mib(m.compilePeak), mib(m.sumPeak))
	if m.idleRSS > 0 {
		fmt.Printf(", idle %.1f MiB, idle CPU %.4f of a core", mib(m.idleRSS), m.idleCPU)
	}
	fmt.Println()
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

type sample struct {
	ready            time.Duration // until every tool is compiled and callable
	busyRSS, peakRSS int64         // right after the calls; the process's high-water mark
	// childPeak is the largest peak RSS of a compile child, as the
	// daemon logged it from the kernel's rusage; children counts them.
	childPeak int64
	children  int
	// compilePeak is the daemon's peak (VmHWM) when every tool is
	// compiled and callable, before the calls load any.
	compilePeak int64
	// sumPeak is the largest daemon + children RSS seen by sampling every
	// few milliseconds until every tool was compiled: a lower bound of
	// the machine-wide peak while compiling.
	sumPeak int64
	idleRSS int64   // after the idle time; 0 when not idled
	idleCPU float64 // cores used over the window
}

// measure starts the daemon on dir, waits until its want tools are all
// loaded, calls each runnable tool once, idles, and stops it.
func measure(bin, dir string, want int, idle, window time.Duration, flags ...string) (sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello from loopback")
	}))
	defer srv.Close()
	args := append([]string{"daemon", "--data-dir", dir, "--addr", "127.0.0.1:0", "--ollama-host", "127.0.0.1:1", "--tools-allow-private-network"}, flags...)
	cmd := exec.CommandContext(ctx, bin, args...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 15 * time.Second
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return sample{}, err
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
	}()
	pid := cmd.Process.Pid
	sampler := sampleTree(pid)

	c, err := dial(ctx, dir, cmd)
	if err != nil {
		return sample{}, fmt.Errorf("%w\n%s", err, logs.String())
	}
	defer c.Close()
	var s sample
	if err := waitLoaded(ctx, c, want); err != nil {
		return s, err
	}
	s.ready = time.Since(start)
	s.sumPeak = sampler()
	if _, s.compilePeak, err = rss(pid); err != nil {
		return s, err
	}
	if err := callAll(ctx, c, dir, srv.URL+"/"); err != nil {
		return s, fmt.Errorf("%w\nthe daemon's log:\n%s", err, logs.String())
	}
	if s.busyRSS, s.peakRSS, err = rss(pid); err != nil {
		return s, err
	}
	s.childPeak, s.children = childPeaks(logs.String())
	if idle == 0 {
		return s, nil
	}
	wait(ctx, idle-window)
	before, err := cpuTicks(pid)
	if err != nil {
		return s, err
	}
	t0 := time.Now()
	wait(ctx, window)
	after, err := cpuTicks(pid)
	if err != nil {
		return s, err
	}
	s.idleCPU = float64(after-before) / clockTicks / time.Since(t0).Seconds()
	if s.idleRSS, _, err = rss(pid); err != nil {
		return s, err
	}
	return s, nil
}

// sampleTree samples the RSS of pid and of its children every 5 ms until
// the function it returns is called, which returns the largest sum seen.
// A child that lives less than 5 ms may be missed; compile children live
// seconds.
func sampleTree(pid int) func() int64 {
	quit, done := make(chan struct{}), make(chan int64)
	go func() {
		var peak int64
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				done <- peak
				return
			case <-tick.C:
			}
			sum, _, _ := rss(pid)
			for _, c := range childPIDs(pid) {
				r, _, _ := rss(c)
				sum += r
			}
			peak = max(peak, sum)
		}
	}()
	return func() int64 { close(quit); return <-done }
}

// childPIDs lists the children of pid (/proc/PID/task/*/children).
func childPIDs(pid int) []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// childPeaks reads from the daemon's log the peak RSS of each compile
// child (wasmtools logs it from the kernel's rusage when a child ends)
// and returns the largest, and how many children there were.
func childPeaks(log string) (peak int64, n int) {
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "compile process ended") {
			continue
		}
		_, v, ok := strings.Cut(line, "peak_rss_kib=")
		if !ok {
			continue
		}
		v, _, _ = strings.Cut(v, " ")
		if kib, err := strconv.ParseInt(v, 10, 64); err == nil {
			peak = max(peak, kib<<10)
			n++
		}
	}
	return peak, n
}

func wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// dial waits for the daemon's daemon.json and connects.
func dial(ctx context.Context, dir string, cmd *exec.Cmd) (*client.Client, error) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(filepath.Join(dir, "daemon.json")); err == nil {
			if c, err := client.DialDataDir(ctx, dir); err == nil {
				return c, nil
			}
		}
		if cmd.ProcessState != nil {
			return nil, errors.New("the daemon exited")
		}
		select {
		case <-ctx.Done():
			return nil, errors.New("the daemon did not start")
		case <-tick.C:
		}
	}
}

// waitLoaded polls tools.list until want tools are listed and nothing is
// compiling any more.
func waitLoaded(ctx context.Context, c *client.Client, want int) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		res, err := c.ToolsList(ctx)
		if err != nil {
			return err
		}
		if res.Compiling == nil && len(res.Tools) >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d tools loaded when time ran out", len(res.Tools), want)
		case <-tick.C:
		}
	}
}

// callAll calls every tool once, so that each is loaded and warm: the
// wordcounts and readfile on text, writefile writing a file, fetch
// fetching from a server on loopback (the daemon runs with
// --tools-allow-private-network for it). A data dir seeded by hand has
// no grants; each is granted what it needs (granting an equal set again
// is a no-op).
func callAll(ctx context.Context, c *client.Client, dir, fetchURL string) error {
	ws := filepath.Join(dir, "workspace")
	if err := os.WriteFile(filepath.Join(ws, "story.txt"), []byte("Once upon a time there was a tiny model.\n"), 0o644); err != nil {
		return err
	}
	tools, err := c.ListTools(ctx)
	if err != nil {
		return err
	}
	grants := map[string]capabilities.Grants{
		"readfile":  {FS: []capabilities.FSGrant{{HostPath: ws, GuestPath: "/workspace", ReadOnly: true}}},
		"writefile": {FS: []capabilities.FSGrant{{HostPath: ws, GuestPath: "/workspace"}}},
		"fetch":     {Network: []string{strings.TrimSuffix(fetchURL, "/")}},
	}
	for name, g := range grants {
		if _, err := c.GrantTool(ctx, protocol.ToolsGrantParams{Name: name, Grants: g}); err != nil {
			return fmt.Errorf("grant %s: %w", name, err)
		}
	}
	for _, t := range tools {
		var in string
		switch {
		case strings.HasPrefix(t.Name, "wordcount"):
			in = `{"text":"one two three"}`
		case t.Name == "readfile":
			in = `{"path":"story.txt"}`
		case t.Name == "writefile":
			in = `{"path":"out.txt","content":"hello"}`
		case t.Name == "fetch":
			in = `{"url":"` + fetchURL + `"}`
		default:
			continue
		}
		if _, err := c.CallTool(ctx, t.Name, json.RawMessage(in)); err != nil {
			return fmt.Errorf("call %s: %w", t.Name, err)
		}
	}
	return nil
}

// rss reads VmRSS and VmHWM of pid, in bytes.
func rss(pid int) (now, peak int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", k, err)
		}
		if k == "VmRSS" {
			now = kb << 10
		} else {
			peak = kb << 10
		}
	}
	return now, peak, sc.Err()
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times; 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// cpuTicks reads utime+stime of pid.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc/PID/stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// After the name: state is field 3, utime field 14, stime field 15.
	if len(f) < 13 {
		return 0, errors.New("short /proc/PID/stat")
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return u + s, nil
}
