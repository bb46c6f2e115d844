package waterfall

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
)

// benchTrace is a plan run of 10,000 spans: a root, 100 plan steps each
// with a sub-agent's trace of 10 model steps (a step, a model call, a
// tool call) grafted under it, some steps still running.
func benchTrace() []keel.Span {
	var spans []keel.Span
	add := func(s keel.Span) { spans = append(spans, s) }
	add(keel.Span{ID: "root", Kind: keel.SpanRun, Name: "plan", RunID: "run_plan", Start: t0, Status: keel.SpanRunning})
	at := t0
	for p := 0; len(spans) < 10_000; p++ {
		step := fmt.Sprintf("p%d", p)
		add(keel.Span{ID: step, ParentID: "root", Kind: keel.SpanStep, Name: step, Start: at, Duration: 10 * time.Second, Status: keel.SpanOK})
		child := "c" + step
		add(keel.Span{ID: child, ParentID: step, Kind: keel.SpanRun, Name: "agent", RunID: keel.RunID("run_plan." + step + ".1"), Start: at, Duration: 10 * time.Second, Status: keel.SpanOK})
		for s := 0; s < 10 && len(spans) < 10_000; s++ {
			id := fmt.Sprintf("%s.s%d", child, s)
			st := at.Add(time.Duration(s) * time.Second)
			add(keel.Span{ID: id, ParentID: child, Kind: keel.SpanStep, Name: "step", Step: s + 1, Start: st, Duration: time.Second, Status: keel.SpanOK})
			add(keel.Span{ID: id + "m", ParentID: id, Kind: keel.SpanModelCall, Name: "keel-tiny", Provider: "ollama", Start: st, Duration: 700 * time.Millisecond,
				Status: keel.SpanOK, PromptTokens: 812, CompletionTokens: 64})
			add(keel.Span{ID: id + "t", ParentID: id, Kind: keel.SpanToolCall, Name: "wordcount", Start: st.Add(700 * time.Millisecond), Duration: 300 * time.Millisecond,
				Status: keel.SpanError, Error: "tool_error: something went wrong in the tool"})
		}
		at = at.Add(5 * time.Second)
	}
	return spans[:10_000]
}

// BenchmarkWaterfall builds and renders a 10,000-span trace, as one
// redraw of `keel trace` does.
func BenchmarkWaterfall(b *testing.B) {
	spans := benchTrace()
	now := t0.Add(time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		if err := Render(io.Discard, Build(spans, now), Options{Width: 160}); err != nil {
			b.Fatal(err)
		}
	}
}
