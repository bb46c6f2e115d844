// Command skeleton measures the walking skeleton end to end on this
// machine, in one run: daemon ready time with a cold and a warm tool
// compilation cache; a tool call through the daemon's WebSocket vs the
// same call on the sandbox in process (the ratio is what the protocol
// layer adds); and a whole scripted run (model → tool → model → answer)
// through the daemon.
//
//	go run ./bench/skeleton [-n 300]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/wasmtools"
	"github.com/keel-runtime/keel/wasmtools/builtin"
)

func main() {
	n := flag.Int("n", 300, "iterations per measurement")
	flag.Parse()
	if err := run(*n); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type daemonHandle struct {
	stop  func()
	ready time.Duration
}

func startDaemon(dir, cache string, p *scripted.Provider) (*daemonHandle, error) {
	ctx, cancel := context.WithCancel(context.Background())
	readyc := make(chan struct{})
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- daemon.Run(ctx, daemon.Config{DataDir: dir, CacheDir: cache, Addr: "127.0.0.1:0", Provider: p,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Ready: func(protocol.DaemonInfo) { close(readyc) }})
	}()
	select {
	case <-readyc:
	case err := <-done:
		cancel()
		return nil, err
	}
	return &daemonHandle{ready: time.Since(start), stop: func() { cancel(); <-done }}, nil
}

func pct(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

func run(n int) error {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "keel-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	cache := filepath.Join(tmp, "cache")

	// Ready time, cold then warm compilation cache (fresh data dirs both times).
	cold, err := startDaemon(filepath.Join(tmp, "d1"), cache, scripted.New(nil))
	if err != nil {
		return err
	}
	cold.stop()
	p := scripted.ByGoal(nil, func(string) []scripted.Step {
		return []scripted.Step{scripted.CallTool("wordcount", `{"text":"a b c"}`), scripted.Answer("3")}
	})
	warm, err := startDaemon(filepath.Join(tmp, "d2"), cache, p)
	if err != nil {
		return err
	}
	defer warm.stop()
	fmt.Printf("daemon accepting connections (bundled tools compile in the background): cold cache %v, warm cache %v\n", cold.ready.Round(time.Millisecond), warm.ready.Round(time.Millisecond))

	// Tool call: in process vs over the WebSocket.
	toolsDir := filepath.Join(tmp, "tools")
	if err := builtin.Install(toolsDir); err != nil {
		return err
	}
	reg, err := wasmtools.Open(ctx, wasmtools.Config{Dir: toolsDir, CacheDir: cache})
	if err != nil {
		return err
	}
	defer reg.Close(ctx)
	in := json.RawMessage(`{"text":"the quick brown fox jumps over the lazy dog"}`)
	direct := make([]time.Duration, n)
	for i := range direct {
		t := time.Now()
		if _, err := reg.Call(ctx, keel.ToolInvocation{Name: "wordcount", Args: in}); err != nil {
			return err
		}
		direct[i] = time.Since(t)
	}
	c, err := client.DialDataDir(ctx, filepath.Join(tmp, "d2"))
	if err != nil {
		return err
	}
	defer c.Close()
	ws := make([]time.Duration, n)
	for i := range ws {
		t := time.Now()
		if _, err := c.CallTool(ctx, "wordcount", in); err != nil {
			return err
		}
		ws[i] = time.Since(t)
	}
	fmt.Printf("tool call wordcount (n=%d): in process p50 %v p99 %v; via WebSocket p50 %v p99 %v; ratio p50 %.2fx\n",
		n, pct(direct, .5), pct(direct, .99), pct(ws, .5), pct(ws, .99), float64(pct(ws, .5))/float64(pct(direct, .5)))

	// Whole runs with the scripted model, started and followed over the WebSocket.
	runs := n / 3
	lat := make([]time.Duration, runs)
	for i := range lat {
		t := time.Now()
		r, err := c.StartRun(ctx, protocol.RunStartParams{Goal: fmt.Sprint("bench ", i)})
		if err != nil {
			return err
		}
		if _, err := c.Subscribe(ctx, r.ID, 0); err != nil {
			return err
		}
	wait:
		for ev := range c.Events() {
			if ev.RunID != r.ID {
				continue
			}
			switch ev.Type {
			case keel.EventRunSucceeded:
				break wait
			case keel.EventRunFailed, keel.EventRunCancelled, keel.EventRunInterrupted:
				return fmt.Errorf("run %s ended %s: %s", r.ID, ev.Type, ev.Data)
			}
		}
		lat[i] = time.Since(t)
		if err := c.Unsubscribe(ctx, r.ID); err != nil {
			return err
		}
	}
	fmt.Printf("scripted run, 6 journaled events + 3 spans, fsync'd (n=%d): p50 %v p99 %v; in-process tool call share of p50 %.0f%%\n",
		runs, pct(lat, .5), pct(lat, .99), 100*float64(pct(direct, .5))/float64(pct(lat, .5)))
	return nil
}
