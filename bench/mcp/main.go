// Command mcp measures an MCP tools/call of one small tool, wordcount,
// on this machine in one run, four ways, with the same Go MCP client
// (the official Go SDK) for every MCP measurement:
//
//   - keel: keel's own tools.call over its WebSocket (the baseline);
//   - keel MCP HTTP: tools/call at the daemon's /mcp (streamable HTTP);
//   - keel MCP stdio: tools/call through keel mcp, which relays each
//     message unchanged to the daemon's /mcp;
//   - Node MCP HTTP and stdio: a native Node MCP server on the official
//     TypeScript SDK (node/server.mjs) whose wordcount does the same work
//     in JavaScript (installed with npm ci on first run).
//
// The paths are measured in turns, one call of each per round, so that
// all of them meet the same load on a shared machine. It prints p50 and
// p99 of each, keel's MCP overhead over its own call (p50 difference)
// and the ratios keel/Node.
//
//	go run ./bench/mcp [-n 2000] [-node bench/mcp/node] [-skip-node] [-skip-stdio] [-cpuprofile FILE]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/keel-runtime/keel/bench/internal/timing"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/internal/nodetest"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/datadir"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/wasmtools/builtin"
)

const input = `{"text":"the quick brown fox\njumps over the lazy dog\n"}`

func main() {
	// keel mcp, for the stdio measurement, is this program run again.
	if len(os.Args) > 1 && os.Args[1] == "mcp" {
		os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	if code, ok := daemon.CompileChild(context.Background()); ok {
		os.Exit(code)
	}
	n := flag.Int("n", 2000, "calls per measurement")
	nodeDir := flag.String("node", filepath.Join("bench", "mcp", "node"), "the Node peer's directory")
	skipNode := flag.Bool("skip-node", false, "do not measure the Node peer")
	skipStdio := flag.Bool("skip-stdio", false, "do not measure keel mcp (stdio): a CPU profile then holds the HTTP path only")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of this process (the daemon and the clients) to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil {
			pprof.StartCPUProfile(f)
			defer pprof.StopCPUProfile()
		}
	}
	if err := run(*n, *nodeDir, *skipNode, *skipStdio); err != nil {
		fmt.Fprintln(os.Stderr, "mcp:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

type result struct {
	name     string
	p50, p99 time.Duration
}

func run(n int, nodeDir string, skipNode, skipStdio bool) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tmp, err := os.MkdirTemp("", "keel-bench-mcp")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "data")
	bundled := filepath.Join(tmp, "bundled")
	if err := builtin.Install(bundled); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "tools"), 0o700); err != nil {
		return err
	}
	os.WriteFile(filepath.Join(dir, "tools", ".examples-installed"), nil, 0o600)
	wasm, err := os.ReadFile(filepath.Join(bundled, "wordcount.wasm"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "tools", "wordcount.wasm"), wasm, 0o600); err != nil {
		return err
	}
	cache := filepath.Join(tmp, "cache")
	if d, err := os.UserCacheDir(); err == nil {
		cache = filepath.Join(d, "keel", "bench-mcp")
	}

	ready := make(chan protocol.DaemonInfo, 1)
	done := make(chan error, 1)
	dctx, stop := context.WithCancel(ctx)
	go func() {
		done <- daemon.Run(dctx, daemon.Config{DataDir: dir, CacheDir: cache, Addr: "127.0.0.1:0", Provider: scripted.New(nil),
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Ready: func(i protocol.DaemonInfo) { ready <- i }})
	}()
	defer func() { stop(); <-done }()
	var info protocol.DaemonInfo
	select {
	case info = <-ready:
	case err := <-done:
		return err
	}
	token, err := datadir.ReadToken(dir, info)
	if err != nil {
		return err
	}
	c, err := client.DialDataDir(ctx, dir)
	if err != nil {
		return err
	}
	defer c.Close()

	// The paths are measured in turns (timing.MeasureTurns: one call of
	// each per round), so that all meet the same load on a busy machine.
	var names []string
	var calls []func() error
	add := func(name string, f func() error) {
		names = append(names, name)
		calls = append(calls, f)
	}

	add("keel tools.call (WebSocket)", func() error {
		_, err := c.CallTool(ctx, "wordcount", json.RawMessage(input))
		return err
	})
	mcpURL := "http://" + strings.TrimSuffix(strings.TrimPrefix(info.URL, "ws://"), protocol.Path) + "/mcp"
	httpc := &http.Client{Transport: bearer{token, http.DefaultTransport}}
	keelHTTP, err := connect(ctx, &sdk.StreamableClientTransport{Endpoint: mcpURL, HTTPClient: httpc})
	if err != nil {
		return err
	}
	defer keelHTTP.Close()
	add("keel MCP, streamable HTTP", call(ctx, keelHTTP))
	if !skipStdio {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		keelStdio, err := connect(ctx, &sdk.CommandTransport{Command: exec.Command(self, "mcp", "--data-dir", dir)})
		if err != nil {
			return err
		}
		defer keelStdio.Close()
		add("keel MCP, stdio (keel mcp)", call(ctx, keelStdio))
	}

	if !skipNode {
		if err := installNode(nodeDir); err != nil {
			return err
		}
		srv := exec.CommandContext(ctx, "node", "server.mjs", "http")
		srv.Dir, srv.Stderr = nodeDir, os.Stderr
		out, err := srv.StdoutPipe()
		if err != nil {
			return err
		}
		if err := srv.Start(); err != nil {
			return err
		}
		defer func() { srv.Process.Kill(); srv.Wait() }()
		line := make([]byte, 256)
		k, err := out.Read(line)
		if err != nil {
			return fmt.Errorf("node server.mjs http: %w", err)
		}
		nodeHTTP, err := connect(ctx, &sdk.StreamableClientTransport{Endpoint: strings.TrimSpace(string(line[:k]))})
		if err != nil {
			return err
		}
		defer nodeHTTP.Close()
		add("Node MCP, streamable HTTP", call(ctx, nodeHTTP))
		cmd := exec.Command("node", "server.mjs", "stdio")
		cmd.Dir = nodeDir
		nodeStdio, err := connect(ctx, &sdk.CommandTransport{Command: cmd})
		if err != nil {
			return err
		}
		defer nodeStdio.Close()
		add("Node MCP, stdio", call(ctx, nodeStdio))
	}

	d, err := timing.MeasureTurns(n, calls...)
	if te := (*timing.TurnError)(nil); errors.As(err, &te) {
		return fmt.Errorf("%s: %w", names[te.Index], te.Err)
	}
	if err != nil {
		return err
	}
	var results []result
	for i, name := range names {
		results = append(results, result{name, timing.Pct(d[i], 0.5), timing.Pct(d[i], 0.99)})
	}

	fmt.Printf("wordcount %s, %d calls each, one client at a time, the paths in turns, %s/%s, %d CPUs\n\n", input, n, runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	fmt.Printf("%-30s %10s %10s\n", "", "p50", "p99")
	for _, r := range results {
		fmt.Printf("%-30s %10s %10s\n", r.name, r.p50, r.p99)
	}
	base := results[0]
	if skipStdio {
		fmt.Printf("\nkeel MCP overhead over its own call (p50): HTTP %s\n", results[1].p50-base.p50)
		return nil
	}
	fmt.Printf("\nkeel MCP overhead over its own call (p50): HTTP %s, stdio %s\n", results[1].p50-base.p50, results[2].p50-base.p50)
	if len(results) == 5 {
		fmt.Printf("keel / Node (p50): HTTP %.2f×, stdio %.2f×; (p99): HTTP %.2f×, stdio %.2f×\n",
			ratio(results[1].p50, results[3].p50), ratio(results[2].p50, results[4].p50),
			ratio(results[1].p99, results[3].p99), ratio(results[2].p99, results[4].p99))
	}
	return nil
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func connect(ctx context.Context, t sdk.Transport) (*sdk.ClientSession, error) {
	return sdk.NewClient(&sdk.Implementation{Name: "keel-bench", Version: "1"}, nil).Connect(ctx, t, nil)
}

// call returns one tools/call of wordcount on cs, checked.
func call(ctx context.Context, cs *sdk.ClientSession) func() error {
	return func() error {
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "wordcount", Arguments: json.RawMessage(input)})
		if err != nil {
			return err
		}
		if res.IsError {
			return fmt.Errorf("wordcount failed: %v", res.Content)
		}
		got, _ := json.Marshal(res.StructuredContent)
		if string(got) != `{"chars":44,"lines":2,"words":9}` && string(got) != `{"words":9,"lines":2,"chars":44}` {
			return fmt.Errorf("wordcount = %s", got)
		}
		return nil
	}
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// installNode runs npm ci in dir unless a complete install is there.
func installNode(dir string) error {
	if _, err := exec.LookPath("node"); err != nil {
		return fmt.Errorf("node is needed for the Node peer (or pass -skip-node): %w", err)
	}
	return nodetest.Install(context.Background(), dir, os.Stderr)
}
