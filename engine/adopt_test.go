package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestAdopt: an engine adopts a run another engine left running (it
// died: no run.interrupted, a span open) and finishes it from the
// journal, without asking the model again for the step the journal
// holds; it leaves an ended run alone.
func TestAdopt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := openDB(ctx, filepath.Join(t.TempDir(), "keel.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Now().Add(-time.Minute)
	run := keel.Run{ID: "run_left", Goal: "g", Model: "scripted", Status: keel.RunQueued, MaxSteps: 4, CreatedAt: t0, UpdatedAt: t0}
	started, _ := json.Marshal(keel.RunStartedData{Goal: "g", Model: "scripted"})
	if _, err := st.CreateRunWith(ctx, run, []keel.Event{{Type: keel.EventRunStarted, Time: t0, Data: started}}, &keel.RunUpdate{Status: keel.RunRunning}); err != nil {
		t.Fatal(err)
	}
	if err := st.StartSpan(ctx, keel.Span{ID: "span_0", RunID: run.ID, Kind: keel.SpanModelCall, Name: "scripted", Step: 1, Start: t0}); err != nil {
		t.Fatal(err)
	}
	p := scripted.New(nil, scripted.Answer("done"))
	e, err := engine.New(engine.Config{Store: st, Model: p, Tools: &echoTools{}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	r, err := e.Adopt(ctx, run.ID)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if r.Status != keel.RunInterrupted {
		t.Errorf("Adopt returned the run %s, want interrupted (then launched)", r.Status)
	}
	if err := e.Wait(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	got, err := st.GetRun(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != keel.RunSucceeded || got.Result != "done" {
		t.Fatalf("adopted run ended %s %q, want succeeded \"done\"", got.Status, got.Result)
	}
	evs, _ := st.Events(ctx, run.ID, 0)
	var types []keel.EventType
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	want := []keel.EventType{keel.EventRunStarted, keel.EventRunInterrupted, keel.EventRunResumed, keel.EventModelResult, keel.EventRunSucceeded}
	if !slices.Equal(types, want) {
		t.Errorf("journal = %v, want %v", types, want)
	}
	spans, _ := st.Spans(ctx, run.ID)
	for _, sp := range spans {
		if sp.ID == "span_0" && sp.Status == keel.SpanRunning {
			t.Errorf("the dead engine's span is still running after Adopt")
		}
	}
	// An ended run is returned as it is, nothing journaled.
	again, err := e.Adopt(ctx, run.ID)
	if err != nil || again.Status != keel.RunSucceeded || again.LastSeq != got.LastSeq {
		t.Errorf("Adopt(ended run) = %s seq %d, %v; want it untouched", again.Status, again.LastSeq, err)
	}
	if _, err := e.Adopt(ctx, "run_none"); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("Adopt(unknown) = %v, want keel.ErrNotFound", err)
	}
}
