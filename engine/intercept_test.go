package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/models/scripted"
)

// modelHooks is an interceptor of model calls that logs what it sees and
// denies every call when deny is set.
type modelHooks struct {
	name string
	deny bool
	mu   *sync.Mutex
	log  *[]string
	outs *[]intercept.ModelOutcome
}

func (m modelHooks) BeforeModel(_ context.Context, inv keel.ModelInvocation) intercept.Decision {
	m.mu.Lock()
	defer m.mu.Unlock()
	*m.log = append(*m.log, fmt.Sprintf("%s before %s step %d model %s", m.name, inv.Run, inv.Step, inv.Model))
	if m.deny {
		return intercept.Decision{Deny: true, By: "policy", Reason: "no model for this goal"}
	}
	return intercept.Decision{}
}

func (m modelHooks) AfterModel(_ context.Context, inv keel.ModelInvocation, d intercept.Decision, o intercept.ModelOutcome) {
	m.mu.Lock()
	defer m.mu.Unlock()
	*m.log = append(*m.log, fmt.Sprintf("%s after %s step %d deny=%v", m.name, inv.Run, inv.Step, d.Deny))
	*m.outs = append(*m.outs, o)
}

// TestModelInterceptors: every model call of a run passes the engine's
// model interceptors in order, saying which run step calls, and they see
// the outcome; a denial fails the run without reaching the model; a
// replay calls no model, so no interceptor.
func TestModelInterceptors(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var log []string
	var outs []intercept.ModelOutcome
	hooks := func(name string, deny bool) modelHooks {
		return modelHooks{name: name, deny: deny, mu: &mu, log: &log, outs: &outs}
	}
	start := func(t *testing.T, p *scripted.Provider, chain intercept.Models) (*engine.Engine, keel.Run) {
		t.Helper()
		st := openStore(t)
		eng, err := engine.New(engine.Config{Store: st, Model: p, Tools: &echoTools{}, ModelInterceptors: chain})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { eng.Close(context.Background()) })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := eng.Start(ctx, engine.StartRequest{Goal: "echo hi"})
		if err != nil {
			t.Fatal(err)
		}
		if err := eng.Wait(ctx, r.ID); err != nil {
			t.Fatal(err)
		}
		if r, err = st.GetRun(ctx, r.ID); err != nil {
			t.Fatal(err)
		}
		return eng, r
	}

	p := scripted.New(nil, scripted.CallTool("echo", `{"text":"hi"}`), scripted.Answer("the tool said hi"))
	eng, r := start(t, p, intercept.Models{hooks("audit", false), hooks("telemetry", false)})
	if r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s (%s), want succeeded", r.Status, r.Error)
	}
	var want []string
	for step := 1; step <= 2; step++ {
		want = append(want,
			fmt.Sprintf("audit before %s step %d model %s", r.ID, step, r.Model),
			fmt.Sprintf("telemetry before %s step %d model %s", r.ID, step, r.Model),
			fmt.Sprintf("telemetry after %s step %d deny=false", r.ID, step),
			fmt.Sprintf("audit after %s step %d deny=false", r.ID, step))
	}
	mu.Lock()
	if diff := cmp.Diff(want, log); diff != "" {
		t.Errorf("hooks (-want +got):\n%s", diff)
	}
	for _, o := range outs {
		if o.Err != nil || o.Model != r.Model || o.PromptTokens == 0 || o.FinishReason != "stop" || o.Start.IsZero() {
			t.Errorf("outcome = %+v, want the model's answer with its usage", o)
		}
	}
	log, outs = nil, nil
	mu.Unlock()

	if _, err := eng.Replay(context.Background(), r.ID); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(log) != 0 {
		t.Errorf("a replay ran the model interceptors: %q", log)
	}
	mu.Unlock()

	p = scripted.New(nil, scripted.Answer("never asked"))
	_, r = start(t, p, intercept.Models{hooks("audit", false), hooks("policy", true), hooks("telemetry", false)})
	if r.Status != keel.RunFailed || !strings.Contains(r.Error, "denied by policy: no model for this goal") {
		t.Errorf("run = %s (%s), want failed, denied by policy", r.Status, r.Error)
	}
	if n := len(p.Requests()); n != 0 {
		t.Errorf("the model got %d requests after a denial, want none", n)
	}
	mu.Lock()
	defer mu.Unlock()
	want = []string{
		fmt.Sprintf("audit before %s step 1 model %s", r.ID, r.Model),
		fmt.Sprintf("policy before %s step 1 model %s", r.ID, r.Model),
		fmt.Sprintf("telemetry after %s step 1 deny=true", r.ID),
		fmt.Sprintf("policy after %s step 1 deny=true", r.ID),
		fmt.Sprintf("audit after %s step 1 deny=true", r.ID),
	}
	if diff := cmp.Diff(want, log); diff != "" {
		t.Errorf("hooks of a denied call (-want +got):\n%s", diff)
	}
	for _, o := range outs {
		if !errors.Is(o.Err, intercept.ErrDenied) {
			t.Errorf("outcome error of a denied call = %v, want ErrDenied", o.Err)
		}
	}
}
