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
// different; a sidecar manifest names it).
//
//	go run ./bench/ready
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/wasmtools/builtin"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// customSection returns a wasm custom section named "keel.bench" holding payload.
func customSection(payload string) []byte {
	name := "keel.bench"
	body := append(uleb(len(name)), name...)
	body = append(body, payload...)
	return append(append([]byte{0}, uleb(len(body))...), body...)
}

func uleb(n int) []byte {
	var out []byte
	for {
		b := byte(n & 0x7f)
		n >>= 7
		if n != 0 {
			out = append(out, b|0x80)
			continue
		}
		return append(out, b)
	}
}

// seed prepares a data dir whose tools directory holds the 10 tools.
func seed(dir string) error {
	tools := filepath.Join(dir, "tools")
	if err := builtin.Install(tools); err != nil {
		return err
	}
	// Mark the examples as installed so the daemon does not touch the dir.
	if err := os.WriteFile(filepath.Join(tools, ".examples-installed"), nil, 0o600); err != nil {
		return err
	}
	wc, err := os.ReadFile(filepath.Join(tools, "wordcount.wasm"))
	if err != nil {
		return err
	}
	for i := 1; i <= 6; i++ {
		name := fmt.Sprintf("wordcount%d", i)
		bin := append(append([]byte{}, wc...), customSection(name)...)
		if err := os.WriteFile(filepath.Join(tools, name+".wasm"), bin, 0o644); err != nil {
			return err
		}
		m, _ := json.Marshal(map[string]any{
			"name": name, "version": "0.1.0", "description": "wordcount variant " + name,
			"input_schema": json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`),
			"side_effects": "read_only",
		})
		if err := os.WriteFile(filepath.Join(tools, name+".manifest.json"), m, 0o644); err != nil {
			return err
		}
	}
	return nil
}

type timing struct{ serving, listed, called, loaded time.Duration }

func measure(dir, cache string) (timing, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	readyc := make(chan struct{})
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- daemon.Run(ctx, daemon.Config{DataDir: dir, CacheDir: cache, Addr: "127.0.0.1:0", Provider: scripted.New(nil),
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
		if err := seed(dir); err != nil {
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
