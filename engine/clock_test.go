package engine_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/models/scripted"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// tickTools has one tool, which takes 2 s of clock.
type tickTools struct{ clock *fakeClock }

func (t tickTools) Specs(context.Context) []keel.ToolSpec {
	return []keel.ToolSpec{{Name: "tick", InputSchema: json.RawMessage(`{"type":"object"}`), SideEffects: keel.SideEffectReadOnly}}
}

func (t tickTools) Call(context.Context, keel.ToolInvocation) (json.RawMessage, error) {
	t.clock.advance(2 * time.Second)
	return json.RawMessage(`{}`), nil
}

// TestInjectedClockAndSleep: the engine reads time only from Config.Now
// and waits only through Config.Sleep. A model call that takes 3 s of the
// injected clock lasts 3 s in its span and its model.result, a tool call
// that takes 2 s lasts 2 s in its span and its tool.result, a retry's
// wait is asked of Sleep and lasts what it asked, and span IDs carry the
// injected clock's time.
func TestInjectedClockAndSleep(t *testing.T) {
	// Not parallel: the times in span IDs only increase, process-wide
	// (keel.NewSpanID), so once another test's engine has made one at the
	// real time, this run's IDs would carry times after it, not the
	// injected clock's.
	t0 := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	clock := &fakeClock{now: t0}
	var calls int
	p := scripted.New(nil, scripted.Repeat(scripted.AnswerFunc(func(models.ChatRequest) (models.ChatResponse, error) {
		clock.advance(3 * time.Second)
		switch calls++; calls {
		case 1:
			return models.ChatResponse{}, &models.Error{Kind: models.KindOverloaded, Msg: "busy"}
		case 2:
			return models.ChatResponse{Message: models.Message{ToolCalls: []keel.ToolCall{{Name: "tick", Arguments: json.RawMessage(`{}`)}}}}, nil
		}
		return models.ChatResponse{Message: models.Message{Content: "fine"}}, nil
	})))
	var sleeps []time.Duration
	st := openStore(t)
	eng, err := engine.New(engine.Config{Store: st, Model: p, Tools: tickTools{clock}, Now: clock.Now,
		Sleep: func(_ context.Context, d time.Duration) error {
			sleeps = append(sleeps, d) // the run's goroutine only
			clock.advance(d)
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(context.Background()) })
	ctx := context.Background()
	run, err := eng.Start(ctx, engine.StartRequest{Goal: "g", Policy: keel.RunPolicy{ModelRetries: 1, RetryBackoff: 30 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if r := waitRun(t, eng, st, run.ID); r.Status != keel.RunSucceeded {
		t.Fatalf("run = %s %q, want succeeded", r.Status, r.Error)
	}
	if fmt.Sprint(sleeps) != "[30s]" {
		t.Errorf("Sleep was asked for %v, want [30s]", sleeps)
	}
	spans, err := st.Spans(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := map[keel.SpanKind]time.Duration{keel.SpanModelCall: 3 * time.Second, keel.SpanToolCall: 2 * time.Second, keel.SpanRetry: 30 * time.Second}
	seen := map[keel.SpanKind]int{}
	for _, sp := range spans {
		d, ok := want[sp.Kind]
		if !ok {
			continue
		}
		seen[sp.Kind]++
		if sp.Duration != d {
			t.Errorf("%s span %s lasted %s, want %s", sp.Kind, sp.ID, sp.Duration, d)
		}
		if at := spanIDTime(t, sp.ID); at.Before(t0) || at.After(clock.Now()) {
			t.Errorf("%s span ID %s carries the time %s, want one of the injected clock (%s to %s)", sp.Kind, sp.ID, at, t0, clock.Now())
		}
	}
	if seen[keel.SpanModelCall] != 3 || seen[keel.SpanToolCall] != 1 || seen[keel.SpanRetry] != 1 {
		t.Errorf("spans by kind = %v, want 3 model calls, 1 tool call and 1 retry", seen)
	}
	for _, ev := range eventsOf(t, st, run.ID, keel.EventModelResult) {
		var d keel.ModelResultData
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatal(err)
		}
		if d.DurationMS != 3000 {
			t.Errorf("model.result of step %d lasted %d ms, want 3000", d.Step, d.DurationMS)
		}
	}
	results := eventsOf(t, st, run.ID, keel.EventToolResult)
	if len(results) != 1 {
		t.Fatalf("%d tool.result events, want 1", len(results))
	}
	var d keel.ToolResultData
	if err := json.Unmarshal(results[0].Data, &d); err != nil {
		t.Fatal(err)
	}
	if d.DurationMS != 2000 {
		t.Errorf("tool.result lasted %d ms, want 2000", d.DurationMS)
	}
}

// spanIDTime is the time a span ID made by the engine carries: "span_",
// then the time in nanoseconds as 16 hex digits.
func spanIDTime(t *testing.T, id string) time.Time {
	t.Helper()
	b, err := hex.DecodeString(id[len("span_"):][:16])
	if err != nil {
		t.Fatalf("span ID %q: %v", id, err)
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(b))).UTC()
}
