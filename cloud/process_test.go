package cloud_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/wasmtools"
	"github.com/nats-io/nats.go"
)

// The environment of a worker process: the test binary started again
// by TestKillWorkerProcess runs a worker instead of the tests.
const (
	envWorkerURL   = "KEEL_TEST_WORKER_URL"
	envWorkerNS    = "KEEL_TEST_WORKER_NS"
	envWorkerTools = "KEEL_TEST_WORKER_TOOLS"
	envWorkerCalls = "KEEL_TEST_WORKER_CALLS"
)

// workerProcess runs one worker of the namespace in the environment
// (victim, one run at a time, holding its runs' second model step) until
// it is killed. Each call of bump is written to the calls file (a line
// "run/call", appended) before it runs; "reached" is printed when a run
// reaches its held step.
func workerProcess() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "worker process:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	f, err := os.OpenFile(os.Getenv(envWorkerCalls), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		fail(err)
	}
	var mu sync.Mutex
	log := appendCalls{f: f, mu: &mu}
	reg, err := wasmtools.Open(ctx, wasmtools.Config{Dir: os.Getenv(envWorkerTools), Interceptors: intercept.Tools{log}})
	if err != nil {
		fail(err)
	}
	nc, err := nats.Connect(os.Getenv(envWorkerURL), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		fail(err)
	}
	hold, reached := holdAfterTool()
	model := gated{Provider: scripted.ByGoal(nil, func(string) []scripted.Step {
		return []scripted.Step{scripted.Repeat(scripted.AnswerFunc(script))}
	}), hold: hold}
	_, err = cloud.Start(ctx, nc, cloud.Config{Namespace: os.Getenv(envWorkerNS), Name: "victim-process", MaxRuns: 1, LeaseTTL: leaseTTL,
		NewEngine: func(st engine.Store) (*engine.Engine, error) {
			return engine.New(engine.Config{Store: st, Model: model, Tools: reg.RunTools(), DefaultMaxSteps: 10})
		}})
	if err != nil {
		fail(err)
	}
	<-reached
	fmt.Println("reached")
	select {} // until killed
}

// appendCalls writes each call of a tool, as it starts, to a file.
type appendCalls struct {
	f  *os.File
	mu *sync.Mutex
}

func (a appendCalls) BeforeTool(_ context.Context, inv keel.ToolInvocation) intercept.Decision {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.f.WriteString(string(inv.Run) + "/" + inv.CallID + "\n")
	a.f.Sync()
	return intercept.Decision{}
}

func (appendCalls) AfterTool(context.Context, keel.ToolInvocation, intercept.Decision, intercept.ToolOutcome) {
}

// TestKillWorkerProcess: a worker in a process of its own (this test
// binary, started again) holds a run in its middle, after one call of
// the non-idempotent bump, and is killed with SIGKILL: no Close, no
// last word. A worker of this process adopts the run once the lease
// lapses; every run succeeds, each call ran exactly once in all (the
// killed process's calls are read from the file it wrote them to before
// each ran), and no journal holds an event twice.
func TestKillWorkerProcess(t *testing.T) {
	t.Parallel()
	ns, runs := namespace("process"), 3
	sc := newScene(t, cluster, ns)
	defer sc.cancel()
	tools, c, js, st, statuses, ctx := sc.tools, sc.c, sc.js, sc.st, sc.statuses, sc.ctx
	goals := submitJobs(t, ctx, js, ns, runs)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	callsFile := t.TempDir() + "/calls"
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envWorkerURL+"="+cluster.URL(), envWorkerNS+"="+ns, envWorkerTools+"="+tools, envWorkerCalls+"="+callsFile)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "reached\n" {
		t.Fatalf("the worker process said %q, %v; want reached", line, err)
	}
	startWorker(t, ns, "w2", tools, c, workerOpts{})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	waitStatus(t, statuses, keel.RunSucceeded, runs)
	data, err := os.ReadFile(callsFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, call := range strings.Fields(string(data)) {
		c.add(call) // the killed process's calls, beside w2's
	}
	if adopted := checkRuns(t, st, c, goals); len(adopted) != 1 {
		t.Errorf("%d runs were adopted after the kill (%v), want 1", len(adopted), adopted)
	}
}
