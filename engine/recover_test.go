package engine_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/engine"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestRecoverClosesSpansOfEndedRuns: a crash right after runs ended (a
// run's last spans commit just after its end) leaves spans running in
// runs that are succeeded, failed or waiting. Recover closes every one:
// from the journal when it holds the call's outcome, else as cut off by
// the crash (issue 13, item 12).
func TestRecoverClosesSpansOfEndedRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keel.db")
	st, err := openDB(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-time.Minute)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type ev struct {
		at   int // ms after t0
		typ  keel.EventType
		data any
		upd  *keel.RunUpdate
	}
	crash := func(id keel.RunID, spans []keel.Span, evs []ev) {
		t.Helper()
		if err := st.CreateRun(ctx, keel.Run{ID: id, Goal: "g", Model: "scripted", Status: keel.RunQueued, MaxSteps: 4, CreatedAt: t0, UpdatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		for _, sp := range spans {
			sp.RunID = id
			if err := st.StartSpan(ctx, sp); err != nil {
				t.Fatal(err)
			}
		}
		for _, e := range evs {
			raw, _ := json.Marshal(e.data)
			if _, err := st.Append(ctx, id, e.typ, at(e.at), raw, e.upd); err != nil {
				t.Fatal(err)
			}
		}
	}
	call := keel.ToolCall{ID: "c1", Name: "echo", Arguments: json.RawMessage(`{"text":"x"}`)}
	started := ev{0, keel.EventRunStarted, keel.RunStartedData{Goal: "g"}, &keel.RunUpdate{Status: keel.RunRunning}}

	// A run that succeeded; the finishes of its root span, its model
	// call, its tool call and its last model call were lost.
	crash("run_ok", []keel.Span{
		{ID: "span_0_root", Kind: keel.SpanRun, Name: "agent", Start: at(0)},
		{ID: "span_a_model1", Kind: keel.SpanModelCall, Name: "scripted", Step: 1, Start: at(10)},
		{ID: "span_b_tool1", Kind: keel.SpanToolCall, Name: "echo", Step: 1, Start: at(1600)},
		{ID: "span_c_model2", Kind: keel.SpanModelCall, Name: "scripted", Step: 2, Start: at(1700)},
	}, []ev{
		started,
		{1510, keel.EventModelResult, keel.ModelResultData{Step: 1, ToolCalls: []keel.ToolCall{call}, PromptTokens: 10, CompletionTokens: 5, CostUSD: 0.25, DurationMS: 1500}, nil},
		{1650, keel.EventToolResult, keel.ToolResultData{Step: 1, CallID: "c1", Name: "echo", Error: &keel.ToolError{Code: keel.ToolCrashed, Message: "boom"}, DurationMS: 40}, nil},
		{1800, keel.EventModelResult, keel.ModelResultData{Step: 2, Content: "done", PromptTokens: 20, CompletionTokens: 2, DurationMS: 90}, nil},
		{1801, keel.EventRunSucceeded, keel.RunEndData{Status: keel.RunSucceeded, Result: "done"}, &keel.RunUpdate{Status: keel.RunSucceeded, Result: "done"}},
	})
	// A run that failed during a tool call whose result never came, and
	// whose first attempt's span was superseded by a retry's.
	crash("run_failed", []keel.Span{
		{ID: "span_d_try1", Kind: keel.SpanToolCall, Name: "echo", Step: 1, Start: at(100)},
		{ID: "span_e_try2", Kind: keel.SpanToolCall, Name: "echo", Step: 1, Start: at(200)},
		{ID: "span_f_cut", Kind: keel.SpanToolCall, Name: "write", Step: 2, Start: at(400)},
	}, []ev{
		started,
		{50, keel.EventModelResult, keel.ModelResultData{Step: 1, ToolCalls: []keel.ToolCall{call}}, nil},
		{300, keel.EventToolResult, keel.ToolResultData{Step: 1, CallID: "c1", Name: "echo", Output: json.RawMessage(`{}`), DurationMS: 100}, nil},
		{500, keel.EventRunFailed, keel.RunEndData{Status: keel.RunFailed, Reason: "deadline"}, &keel.RunUpdate{Status: keel.RunFailed, Error: "deadline"}},
	})
	// A waiting run whose approval was journaled but the wait's span
	// finish was lost.
	crash("run_approved", []keel.Span{
		{ID: "span_g_wait", Kind: keel.SpanHuman, Name: "approve echo", Step: 1, Start: at(60)},
	}, []ev{
		started,
		{50, keel.EventModelResult, keel.ModelResultData{Step: 1, ToolCalls: []keel.ToolCall{call}}, nil},
		{60, keel.EventApprovalAsked, keel.ApprovalRequestData{Call: call, SpanID: "span_g_wait"}, &keel.RunUpdate{Status: keel.RunWaiting}},
		{2060, keel.EventApproval, keel.ApprovalData{CallID: "c1", Approved: false, Reason: "not today"}, nil},
	})
	// A run that waits for an approval: its trace stays open, the wait
	// above all.
	crash("run_waits", []keel.Span{
		{ID: "span_h_root", Kind: keel.SpanRun, Name: "agent", Start: at(0)},
		{ID: "span_i_wait", Kind: keel.SpanHuman, Name: "approve echo", Step: 1, Start: at(60)},
	}, []ev{
		started,
		{50, keel.EventModelResult, keel.ModelResultData{Step: 1, ToolCalls: []keel.ToolCall{call}}, nil},
		{60, keel.EventApprovalAsked, keel.ApprovalRequestData{Call: call, SpanID: "span_i_wait"}, &keel.RunUpdate{Status: keel.RunWaiting}},
	})
	if err := st.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st, err = openDB(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	eng, err := engine.New(engine.Config{Store: st, Model: scripted.New(nil), Tools: &echoTools{}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	if n, err := eng.Recover(ctx); err != nil || n != 0 {
		t.Fatalf("Recover = %d, %v; want 0 runs marked (none was left running)", n, err)
	}
	type want struct {
		status keel.SpanStatus
		err    string
		dur    time.Duration // 0: not checked
		tokens int
	}
	cut := "the daemon stopped before this ended"
	for id, wants := range map[keel.RunID]map[string]want{
		"run_ok": {
			"span_0_root":   {keel.SpanOK, "", 1801 * time.Millisecond, 0},
			"span_a_model1": {keel.SpanOK, "", 1500 * time.Millisecond, 15},
			"span_b_tool1":  {keel.SpanError, (&keel.ToolError{Code: keel.ToolCrashed, Message: "boom"}).Error(), 40 * time.Millisecond, 0},
			"span_c_model2": {keel.SpanOK, "", 90 * time.Millisecond, 22},
		},
		"run_failed": {
			"span_d_try1": {keel.SpanError, cut, 0, 0},
			"span_e_try2": {keel.SpanOK, "", 100 * time.Millisecond, 0},
			"span_f_cut":  {keel.SpanError, cut, 0, 0},
		},
		"run_approved": {
			"span_g_wait": {keel.SpanError, "not today", 2 * time.Second, 0},
		},
		"run_waits": {
			"span_h_root": {keel.SpanRunning, "", 0, 0},
			"span_i_wait": {keel.SpanRunning, "", 0, 0},
		},
	} {
		spans, err := st.Spans(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(spans) != len(wants) {
			t.Fatalf("%s has %d spans, want %d", id, len(spans), len(wants))
		}
		for _, sp := range spans {
			w := wants[sp.ID]
			if sp.Status != w.status || sp.Error != w.err || (w.dur != 0 && sp.Duration != w.dur) || sp.PromptTokens+sp.CompletionTokens != w.tokens {
				t.Errorf("%s %s = %s %q %s %d tokens; want %s %q %s %d tokens", id, sp.ID, sp.Status, sp.Error, sp.Duration,
					sp.PromptTokens+sp.CompletionTokens, w.status, w.err, w.dur, w.tokens)
			}
		}
	}
}
