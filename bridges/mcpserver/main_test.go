package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/internal/wasmtest"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/datadir"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
)

// cliEnv, set to "1", makes the test binary the keel command line: the
// stdio tests and the TypeScript client start it as `keel mcp`.
const cliEnv = "KEEL_MCPSERVER_TEST_CLI"

// The daemon every test of the package shares, started by TestMain:
// wordcount (read-only, no grants) and readfile (requests a directory,
// granted none, so its calls are refused) and stamp (whose calls the
// daemon's policy asks about, policyFile) are installed; writefile is at
// hand to install and remove (toolChange). All three are canned
// reactors (see writeTool).
var (
	shared struct {
		dir   string // data dir
		base  string // http://127.0.0.1:PORT
		token string // the daemon's own token
		c     *client.Client
		// spare holds writefile.wasm, not installed.
		spare string
	}
	// toolChange serializes the tests that install or remove a tool.
	toolChange sync.Mutex
)

func TestMain(m *testing.M) {
	if os.Getenv(cliEnv) == "1" {
		os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	code, err := testMain(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpserver TestMain:", err)
		code = 1
	}
	os.Exit(code)
}

func testMain(m *testing.M) (int, error) {
	tmp, err := os.MkdirTemp("", "keel-mcpserver-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "data")
	tools := filepath.Join(dir, "tools")
	spare := filepath.Join(tmp, "spare")
	for _, d := range []string{tools, spare} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return 0, err
		}
	}
	// No bundled tools: only these two are installed.
	if err := os.WriteFile(filepath.Join(tools, ".examples-installed"), nil, 0o600); err != nil {
		return 0, err
	}
	for _, f := range []struct{ dir, name, output, manifest string }{
		{tools, "wordcount", wordcountOutput, wordcountManifest},
		{tools, "readfile", `{"path":"x","content":"","truncated":false}`, readfileManifest},
		{spare, "writefile", `{"written":0}`, writefileManifest},
		{tools, "stamp", `{"stamped":true}`, stampManifest},
	} {
		if err := writeTool(f.dir, f.name, f.output, f.manifest); err != nil {
			return 0, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "policy.json"), []byte(policyFile), 0o600); err != nil {
		return 0, err
	}
	shared.spare = filepath.Join(spare, "writefile.wasm")
	cache := filepath.Join(tmp, "cache")

	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan protocol.DaemonInfo, 1)
	done := make(chan error, 1)
	cfg := daemon.Config{DataDir: dir, Addr: "127.0.0.1:0", CacheDir: cache,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		// Runs MCP clients start (TestRuns) answer at once.
		Provider: scripted.ByGoal(nil, func(string) []scripted.Step { return []scripted.Step{scripted.Answer("hello")} }),
		Ready:    func(i protocol.DaemonInfo) { ready <- i }}
	go func() { done <- daemon.Run(ctx, cfg) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				fmt.Fprintln(os.Stderr, "daemon.Run:", err)
			}
		case <-time.After(30 * time.Second):
			fmt.Fprintln(os.Stderr, "the daemon did not stop within 30 s")
		}
	}()
	var info protocol.DaemonInfo
	select {
	case info = <-ready:
	case err := <-done:
		return 0, fmt.Errorf("daemon.Run: %w", err)
	case <-time.After(time.Minute):
		return 0, fmt.Errorf("the daemon was not ready within a minute")
	}
	tok, err := datadir.ReadToken(dir, info)
	if err != nil {
		return 0, err
	}
	c, err := client.DialDataDir(ctx, dir)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	// A call waits for its tool to compile: after these, both are ready
	// (or loaded from the cache) for every test.
	for _, name := range []string{"wordcount", "readfile"} {
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Minute)
		_, err := c.CallTool(wctx, name, json.RawMessage(`{"text":"warm up","path":"x"}`))
		wcancel()
		if err != nil && !isToolError(err) {
			return 0, fmt.Errorf("warm up %s: %w", name, err)
		}
	}
	shared.dir, shared.token, shared.c = dir, tok, c
	shared.base = "http://" + strings.TrimSuffix(strings.TrimPrefix(info.URL, "ws://"), protocol.Path)
	return m.Run(), nil
}

// isToolError reports whether err is a tool's failure (the call reached
// the tool).
func isToolError(err error) bool {
	pe, ok := err.(*protocol.Error)
	return ok && (pe.Code == protocol.CodeToolError || pe.Code == protocol.CodeInvalidToolInput)
}

// The installed tools are wasmtest's canned reactors (a Go-built tool
// takes seconds to compile, these milliseconds), each with the manifest
// of the example tool of that name: what keel checks before a call (the
// input schema, the grants) is the real tool's, and a call that runs
// returns the canned output whatever its input.
const (
	// wordcountOutput is what every call of wordcount returns: the count
	// of "one two\nthree".
	wordcountOutput   = `{"words":3,"lines":2,"chars":13}`
	wordcountManifest = `{"name":"wordcount","version":"0.1.0","description":"Count the words, lines and characters of a text.",
"side_effects":"read_only",
"input_schema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false},
"output_schema":{"type":"object","properties":{"words":{"type":"integer","minimum":0},"lines":{"type":"integer","minimum":0},"chars":{"type":"integer","minimum":0}},"required":["words","lines","chars"],"additionalProperties":false}}`
	// readfile requests a directory it is never granted.
	readfileManifest = `{"name":"readfile","version":"0.1.0","description":"Read a text file from the workspace.","side_effects":"read_only",
"input_schema":{"type":"object","properties":{"path":{"type":"string","minLength":1}},"required":["path"]},
"requests":{"fs":[{"guest_path":"/workspace","read_only":true}]}}`
	// stamp is a tool the policy (policyFile) asks about.
	stampManifest = `{"name":"stamp","version":"0.1.0","description":"Stamp a note.","side_effects":"non_idempotent_write",
"input_schema":{"type":"object","properties":{"note":{"type":"string"}},"required":["note"]},
"output_schema":{"type":"object","properties":{"stamped":{"type":"boolean"}},"required":["stamped"]}}`
	// policyFile is the daemon's user policy: a call of stamp waits for
	// a person's approval, and one with the note "forbidden" is denied;
	// MCP clients may start runs whose goal starts "allowed:", and read
	// traces (TestRuns).
	policyFile = `{"version":1,"rules":[
{"action":"tool","tool":"stamp","decision":"ask","reason":"stamps are for keeps"},
{"action":"tool","tool":"stamp","args":{"/note":"forbidden"},"decision":"deny","reason":"not that one"},
{"action":"tool","tool":"keel_run_start","args":{"/goal":"allowed:*"},"decision":"allow"},
{"action":"tool","tool":"keel_run_trace","decision":"allow"}]}`
	writefileManifest = `{"name":"writefile","version":"0.1.0","description":"Write a text file.","side_effects":"idempotent_write",
"input_schema":{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}},"required":["path","content"]}}`
)

// writeTool writes dir/NAME.wasm, a canned reactor answering output, and
// its sidecar manifest.
func writeTool(dir, name, output, manifest string) error {
	if err := os.WriteFile(filepath.Join(dir, name+".wasm"), wasmtest.CannedReactor(`{"output":`+output+`}`), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".manifest.json"), []byte(manifest), 0o600)
}

// bearer is an http.RoundTripper that adds a token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// httpClient is an HTTP client that presents token.
func httpClient(token string) *http.Client {
	return &http.Client{Transport: bearer{token: token, next: http.DefaultTransport}}
}
