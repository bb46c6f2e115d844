// Command ready measures how fast the keel daemon serves with 10 tools
// installed: the time until it accepts connections (daemon.json written),
// until tools.list lists all 10, until a first call of one tool is
// answered, and until every tool is compiled and callable. Three starts,
// one run each: a first start with a cold compilation cache, a restart
// of the same data dir (warm cache, tools indexed), and a start of
// another data dir with the same tools (warm cache, nothing indexed).
//
// The 10 tools are the 4 bundled examples plus 6 distinct variants of
// wordcount (a custom section makes each binary, and so its cache entry,
// different; a sidecar manifest names it). Tools compile in child
// processes of this binary, as keel daemon's do; -inprocess compiles
// them in the daemon's process, as before.
//
//	go run ./bench/ready [-inprocess]
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
	"time"

	"github.com/keel-runtime/keel/bench/internal/tentools"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/wasmtools"
)

func main() {
	// The daemon's tools compile in children of this binary, as `keel
	// daemon`'s do in children of keel.
	if code, ok := daemon.CompileChild(context.Background()); ok {
		os.Exit(code)
	}
	inProcess := flag.Bool("inprocess", false, "compile tools in the daemon's process, as before compile children (default: in child processes, as keel daemon does)")
	flag.Parse()
	if !*inProcess {
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		compiler = &wasmtools.Compiler{Path: exe}
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// compiler is the daemon's ToolsCompiler; nil compiles in process.
var compiler *wasmtools.Compiler

type timing struct{ serving, listed, called, loaded time.Duration }

func measure(dir, cache string) (timing, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	readyc := make(chan struct{})
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- daemon.Run(ctx, daemon.Config{DataDir: dir, CacheDir: cache, Addr: "127.0.0.1:0", Provider: scripted.New(nil), ToolsCompiler: compiler,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Ready: func(protocol.DaemonInfo) { close(readyc) }})
	}()
	select {
	case <-readyc:
	case err := <-done:
		return timing{}, err
	}
	var t timing
	t.serving = time.Since(start)
	c, err := client.DialDataDir(ctx, dir)
	if err != nil {
		return t, err
	}
	defer c.Close()
	// While one request polls tools.list until it lists all 10, another
	// calls a tool late in loading order: its first call need not wait
	// for the others (the registry loads a called tool at once).
	listed := make(chan error, 1)
	go func() {
		for {
			res, err := c.ToolsList(ctx)
			if err != nil {
				listed <- err
				return
			}
			if len(res.Tools) == 10 {
				t.listed = time.Since(start)
				listed <- nil
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	if _, err := c.CallTool(ctx, "wordcount6", json.RawMessage(`{"text":"a b"}`)); err != nil {
		return t, err
	}
	t.called = time.Since(start)
	if err := <-listed; err != nil {
		return t, err
	}
	for {
		res, err := c.ToolsList(ctx)
		if err != nil {
			return t, err
		}
		if res.Compiling == nil {
			if len(res.Tools) != 10 {
				return t, fmt.Errorf("%d tools loaded, want 10", len(res.Tools))
			}
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.loaded = time.Since(start)
	cancel()
	return t, <-done
}

func run() error {
	tmp, err := os.MkdirTemp("", "keel-bench-ready")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	cache := filepath.Join(tmp, "cache")
	first, other := filepath.Join(tmp, "data"), filepath.Join(tmp, "other")
	for _, dir := range []string{first, other} {
		if err := tentools.Seed(dir); err != nil {
			return err
		}
	}
	var results []timing
	for _, r := range []struct{ label, dir string }{
		{"cold cache (first start)", first},
		{"restart (warm cache, tools indexed)", first},
		{"warm cache, tools not indexed (another data dir)", other},
	} {
		t, err := measure(r.dir, cache)
		if err != nil {
			return fmt.Errorf("%s: %w", r.label, err)
		}
		results = append(results, t)
		fmt.Printf("10 tools, %s:\n  accepting connections %v, all 10 listed %v, first call of a tool answered %v, all 10 callable %v\n",
			r.label, t.serving.Round(time.Millisecond), t.listed.Round(time.Millisecond), t.called.Round(time.Millisecond), t.loaded.Round(time.Millisecond))
	}
	fmt.Printf("all tools callable: cold/restart %.1fx\n", float64(results[0].loaded)/float64(results[1].loaded))
	return nil
}
