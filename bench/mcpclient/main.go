// Command mcpclient measures a call of an external MCP server's tool
// through keel's MCP client (bridges/mcpclient: a Manager's Call, with its
// schema check, result translation and connection bookkeeping; no
// interceptors, so no audit write) against the same call made directly
// with the official Go SDK client, on this machine in one run: the
// reference server @modelcontextprotocol/server-everything's echo, over
// streamable HTTP and over stdio. It prints p50 and p99 of each and the
// ratio keel/direct.
//
//	go run ./bench/mcpclient [-n 1000] [-node bridges/mcpclient/testdata/node]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bench/internal/timing"
	"github.com/keel-runtime/keel/bridges/mcpclient"
	"github.com/keel-runtime/keel/bridges/mcpclient/mcpfile"
	"github.com/keel-runtime/keel/internal/nodetest"
)

func main() {
	n := flag.Int("n", 1000, "calls per measurement")
	nodeDir := flag.String("node", filepath.Join("bridges", "mcpclient", "testdata", "node"), "where server-everything is installed (npm ci on first run)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of this process to this file")
	flag.Parse()
	if *cpuprofile != "" {
		if f, err := os.Create(*cpuprofile); err == nil {
			pprof.StartCPUProfile(f)
			defer pprof.StopCPUProfile()
		}
	}
	if err := run(*n, *nodeDir); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "mcpclient:", err)
		os.Exit(1)
	}
}

func run(n int, nodeDir string) error {
	if err := nodetest.Install(context.Background(), nodeDir, os.Stderr); err != nil {
		return err
	}
	js, err := filepath.Abs(filepath.Join(nodeDir, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js"))
	if err != nil {
		return err
	}
	url, stop, err := startHTTP(js)
	if err != nil {
		return err
	}
	defer stop()
	stdio := mcpfile.ServerConfig{Command: []string{"node", js, "stdio"}}
	stdio.NativeGrant = mcpfile.NativeDigest(stdio)
	args := json.RawMessage(`{"message":"the quick brown fox"}`)

	fmt.Printf("echo of server-everything, %d calls each, one run\n\n%-24s %10s %10s\n", n, "", "p50", "p99")
	for _, tc := range []struct {
		name string
		cfg  mcpfile.ServerConfig
	}{{"streamable HTTP", mcpfile.ServerConfig{URL: url}}, {"stdio", stdio}} {
		direct, err := measureDirect(n, tc.cfg, args)
		if err != nil {
			return fmt.Errorf("%s direct: %w", tc.name, err)
		}
		viaKeel, err := measureKeel(n, tc.cfg, args)
		if err != nil {
			return fmt.Errorf("%s through keel: %w", tc.name, err)
		}
		dp50, dp99 := timing.Pct(direct, 0.5), timing.Pct(direct, 0.99)
		kp50, kp99 := timing.Pct(viaKeel, 0.5), timing.Pct(viaKeel, 0.99)
		fmt.Printf("%-24s %10s %10s\n%-24s %10s %10s\n", tc.name+", Go SDK direct", dp50, dp99, tc.name+", keel's client", kp50, kp99)
		fmt.Printf("%-24s %10.2f %10.2f   (keel - direct p50: %s)\n\n", "ratio keel/direct", float64(kp50)/float64(dp50), float64(kp99)/float64(dp99), kp50-dp50)
	}
	return nil
}

// measureDirect times echo called with the Go SDK's client alone.
func measureDirect(n int, c mcpfile.ServerConfig, args json.RawMessage) ([]time.Duration, error) {
	ctx := context.Background()
	var t sdk.Transport = &sdk.StreamableClientTransport{Endpoint: c.URL}
	if c.URL == "" {
		t = &sdk.CommandTransport{Command: exec.Command(c.Command[0], c.Command[1:]...)}
	}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "bench", Version: "1"}, &sdk.ClientOptions{Capabilities: &sdk.ClientCapabilities{}}).Connect(ctx, t, nil)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	return timing.Measure(n, func() error {
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "echo", Arguments: args})
		if err == nil && res.IsError {
			err = errors.New("error result")
		}
		return err
	})
}

// measureKeel times echo called through a Manager of the one server.
func measureKeel(n int, c mcpfile.ServerConfig, args json.RawMessage) ([]time.Duration, error) {
	dir, err := os.MkdirTemp("", "keel-bench-mcpclient-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, mcpfile.FileName)
	if err := mcpfile.WriteFile(file, mcpfile.File{Servers: map[string]mcpfile.ServerConfig{"everything": c}}); err != nil {
		return nil, err
	}
	m, err := mcpclient.Open(mcpclient.Config{File: file})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	ctx := context.Background()
	if err := m.WaitReady(ctx); err != nil {
		return nil, err
	}
	if !m.Has("mcp-everything-echo") {
		return nil, fmt.Errorf("not connected: %+v", m.Servers())
	}
	return timing.Measure(n, func() error {
		_, err := m.Call(ctx, keel.ToolInvocation{Name: "mcp-everything-echo", Args: args, Touched: &keel.Touched{}})
		return err
	})
}

// startHTTP starts server-everything over streamable HTTP on a free port.
func startHTTP(js string) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command("node", js, "streamableHttp")
	cmd.Env = append(os.Environ(), fmt.Sprintf("PORT=%d", port))
	cmd.Stdout = io.Discard
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait() }
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "listening on port") {
			go io.Copy(io.Discard, stderr)
			return fmt.Sprintf("http://127.0.0.1:%d/mcp", port), stop, nil
		}
	}
	stop()
	return "", nil, errors.New("server-everything ended before it listened")
}
