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

// TestInjectedClockAndSleep: the engine reads time only from Config.Now
// and waits only through Config.Sleep. A model call that takes 3 s of the
// injected clock lasts 3 s in its span and its model.result, a retry's
// wait is asked of Sleep and lasts what it asked, and span IDs carry the
// injected clock's time.
func TestInjectedClockAndSleep(t *testing.T) {
	t0 := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	clock := &fakeClock{now: t0}
	var calls int
	p := scripted.New(nil, scripted.Repeat(scripted.AnswerFunc(func(models.ChatRequest) (models.ChatResponse, error) {
		clock.advance(3 * time.Second)
		if calls++; calls == 1 {
			return models.ChatResponse{}, &models.Error{Kind: models.KindOverloaded, Msg: "busy"}
		}
		return models.ChatResponse{Message: models.Message{Content: "fine"}}, nil
	})))
	var sleeps []time.Duration
	st := openStore(t)
	eng, err := engine.New(engine.Config{Store: st, Model: p, Tools: &echoTools{}, Now: clock.Now,
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
	want := map[keel.SpanKind]time.Duration{keel.SpanModelCall: 3 * time.Second, keel.SpanRetry: 30 * time.Second}
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
	if seen[keel.SpanModelCall] != 2 || seen[keel.SpanRetry] != 1 {
		t.Errorf("spans by kind = %v, want 2 model calls and 1 retry", seen)
	}
	results := eventsOf(t, st, run.ID, keel.EventModelResult)
	if len(results) != 1 {
		t.Fatalf("%d model.result events, want 1", len(results))
	}
	var d keel.ModelResultData
	if err := json.Unmarshal(results[0].Data, &d); err != nil {
		t.Fatal(err)
	}
	if d.DurationMS != 3000 {
		t.Errorf("model.result duration = %d ms, want 3000", d.DurationMS)
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
