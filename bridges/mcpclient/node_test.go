package mcpclient_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/bridges/mcpclient"
	"github.com/keel-runtime/keel/bridges/mcpclient/mcpfile"
	"github.com/keel-runtime/keel/internal/nodetest"
)

// nodeDir holds the peer nobody at keel wrote: the official reference
// server, @modelcontextprotocol/server-everything (package.json,
// package-lock.json; node_modules is installed by npm ci on first use
// and kept).
const nodeDir = "testdata/node"

var (
	// everything is the one streamable HTTP server-everything of the
	// test binary, started by the first test that needs it and stopped
	// by TestMain.
	everything struct {
		once sync.Once
		url  string
		cmd  *exec.Cmd
		err  error
	}
)

func TestMain(m *testing.M) {
	code := m.Run()
	if c := everything.cmd; c != nil {
		c.Process.Kill()
		c.Wait()
	}
	os.Exit(code)
}

// needNode skips t when node is not installed, unless CI is set (then the
// test fails: CI must run it), and installs the packages once.
func needNode(t *testing.T) {
	t.Helper()
	nodetest.Need(t, nodeDir)
}

// everythingJS is the server's entry point.
func everythingJS(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join(nodeDir, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// everythingHTTP returns the URL of the binary's streamable HTTP
// server-everything, starting it once.
func everythingHTTP(t *testing.T) string {
	t.Helper()
	needNode(t)
	js := everythingJS(t)
	everything.once.Do(func() {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			everything.err = err
			return
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		cmd := exec.Command("node", js, "streamableHttp")
		cmd.Env = append(os.Environ(), fmt.Sprintf("PORT=%d", port))
		cmd.Stdout = io.Discard
		stderr, err := cmd.StderrPipe()
		if err != nil {
			everything.err = err
			return
		}
		if err := cmd.Start(); err != nil {
			everything.err = err
			return
		}
		everything.cmd = cmd
		// It says on stderr when it listens.
		listening := make(chan error, 1)
		go func() {
			sc := bufio.NewScanner(stderr)
			var said []string
			for sc.Scan() {
				said = append(said, sc.Text())
				if strings.Contains(sc.Text(), "listening on port") {
					listening <- nil
					io.Copy(io.Discard, stderr)
					return
				}
			}
			listening <- fmt.Errorf("server-everything ended before it listened: %s", strings.Join(said, "\n"))
		}()
		select {
		case everything.err = <-listening:
		case <-time.After(time.Minute):
			everything.err = errors.New("server-everything did not listen within a minute")
		}
		everything.url = fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	})
	if everything.err != nil {
		t.Fatal(everything.err)
	}
	return everything.url
}

// stdioEverything is server-everything over stdio, granted.
func stdioEverything(t *testing.T) mcpfile.ServerConfig {
	t.Helper()
	needNode(t)
	c := mcpfile.ServerConfig{Command: []string{"node", everythingJS(t), "stdio"}, TimeoutSeconds: 120}
	c.NativeGrant = mcpfile.NativeDigest(c)
	return c
}

// checkEverything lists the reference server's tools, checks the classes
// of a few, calls echo and get-sum, and checks a schema error is caught
// before the call.
func checkEverything(t *testing.T, m *mcpclient.Manager) {
	t.Helper()
	for name, want := range map[string]keel.SideEffect{
		"mcp-everything-echo":                           keel.SideEffectReadOnly,
		"mcp-everything-get-sum":                        keel.SideEffectReadOnly,
		"mcp-everything-gzip-file-as-resource":          keel.SideEffectIdempotentWrite,
		"mcp-everything-toggle-simulated-logging":       keel.SideEffectNonIdempotentWrite,
		"mcp-everything-trigger-long-running-operation": keel.SideEffectReadOnly,
	} {
		if got, ok := m.SideEffects(name); !ok || got != want {
			t.Errorf("SideEffects(%s) = %q, %v, want %q", name, got, ok, want)
		}
	}
	var echo *keel.ToolSpec
	for _, s := range m.Specs() {
		if s.Name == "mcp-everything-echo" {
			echo = &s
		}
	}
	if echo == nil || !strings.Contains(string(echo.InputSchema), `"message"`) {
		t.Fatalf("echo's spec = %+v, want its input schema with message", echo)
	}
	out, te := call(t, m, keel.ToolInvocation{Name: "mcp-everything-echo", Args: json.RawMessage(`{"message":"hi"}`)})
	if te != nil || string(out) != `{"text":"Echo: hi"}` {
		t.Errorf("echo hi = %s, %v, want {\"text\":\"Echo: hi\"}", out, te)
	}
	out, te = call(t, m, keel.ToolInvocation{Name: "mcp-everything-get-sum", Args: json.RawMessage(`{"a":2,"b":3}`)})
	if te != nil || !strings.Contains(string(out), "is 5") {
		t.Errorf("get-sum 2 3 = %s, %v, want the sum 5", out, te)
	}
	// keel's check, not the server's (which would be a tool_error result
	// without the pointer).
	_, te = call(t, m, keel.ToolInvocation{Name: "mcp-everything-get-sum", Args: json.RawMessage(`{"a":"two","b":3}`)})
	if te == nil || te.Code != keel.ToolInvalidInput || te.Path != "/a" {
		t.Errorf("get-sum with a string = %v, want invalid_input at /a", te)
	}
}

func TestEverythingHTTP(t *testing.T) {
	t.Parallel()
	url := everythingHTTP(t)
	o := open(t, map[string]mcpfile.ServerConfig{"everything": {URL: url}}, false)
	o.waitFor(t, "server-everything ready", func() bool { return o.state("everything") == mcpclient.StateReady })
	checkEverything(t, o.m)
	if d := o.m.Servers()[0]; !strings.Contains(d.Server, "everything") {
		t.Errorf("declared server = %+v, want the name server-everything gives", d)
	}
}

// TestEverythingStdio runs server-everything as a granted stdio server,
// follows its tools/list_changed, then kills it during a call: the call fails at once as crashed, and
// the Manager starts it again.
func TestEverythingStdio(t *testing.T) {
	t.Parallel()
	o := open(t, map[string]mcpfile.ServerConfig{"everything": stdioEverything(t)}, false)
	o.waitFor(t, "server-everything ready", func() bool { return o.state("everything") == mcpclient.StateReady })
	checkEverything(t, o.m)
	// server-everything registers more tools once initialized, and says so
	// (tools/list_changed): the connection's change, then the refresh's.
	o.waitFor(t, "the refresh after server-everything's tools/list_changed", func() bool { return o.n.Load() >= 2 })
	pid := o.m.Servers()[0].PID
	if pid == 0 {
		t.Fatalf("declared server = %+v, want its PID", o.m.Servers()[0])
	}
	done := make(chan *keel.ToolError, 1)
	go func() {
		// 60 s unless it is killed.
		_, te := call(t, o.m, keel.ToolInvocation{Name: "mcp-everything-trigger-long-running-operation", Args: json.RawMessage(`{"duration":60,"steps":60}`)})
		done <- te
	}()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case te := <-done:
		if te == nil || te.Code != keel.ToolCrashed {
			t.Fatalf("call of a killed server = %v, want crashed", te)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the call of a killed server still waits after 30 s")
	}
	o.waitFor(t, "server-everything started again", func() bool {
		d := o.m.Servers()[0]
		return d.State == mcpclient.StateReady && d.PID != pid
	})
	if out, te := call(t, o.m, keel.ToolInvocation{Name: "mcp-everything-echo", Args: json.RawMessage(`{"message":"again"}`)}); te != nil {
		t.Errorf("echo after the restart = %s, %v", out, te)
	}
}
