package waterfall

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/keel-runtime/keel"
)

var t0 = time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)

// sp is a span id under parent, from t0+start (ms) for dur (ms), ok.
func sp(id, parent string, start, dur int) keel.Span {
	return keel.Span{ID: id, ParentID: parent, Kind: keel.SpanStep, Start: t0.Add(ms(start)), Duration: ms(dur), Status: keel.SpanOK}
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func running(s keel.Span) keel.Span { s.Status, s.Duration = keel.SpanRunning, 0; return s }

// shape renders a tree as "id:depth@offset+dur" per node, depth first,
// with * for the critical path and > for an open span.
func shape(t *Tree) string {
	var parts []string
	for _, n := range t.Nodes() {
		s := fmt.Sprintf("%s:%d@%d+%d", n.Span.ID, n.Depth, n.Offset/time.Millisecond, n.Duration/time.Millisecond)
		if n.Critical {
			s += "*"
		}
		if n.Open {
			s += ">"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// TestBuild: the tree's shape, offsets, durations and critical path,
// for traces as the engine writes them and for odd ones.
func TestBuild(t *testing.T) {
	t.Parallel()
	now := t0.Add(ms(1000))
	for _, tt := range []struct {
		name  string
		spans []keel.Span
		want  string
		total time.Duration
	}{
		{"empty", nil, "", 0},
		{"agent run, children in start order whatever the input order",
			[]keel.Span{sp("s2", "root", 60, 40), sp("root", "", 0, 100), sp("m1", "s1", 0, 30), sp("s1", "root", 0, 50), sp("t1", "s1", 30, 20), sp("m2", "s2", 60, 40)},
			"root:0@0+100* s1:1@0+50 m1:2@0+30 t1:2@30+20 s2:1@60+40* m2:2@60+40*", ms(100)},
		{"critical path: the child that ends last, not the longest nor the last started",
			[]keel.Span{sp("root", "", 0, 100), sp("long", "root", 0, 90), sp("late", "root", 50, 20)},
			"root:0@0+100* long:1@0+90* late:1@50+20", ms(100)},
		{"critical path: of equal ends, the later started",
			[]keel.Span{sp("root", "", 0, 100), sp("a", "root", 0, 80), sp("b", "root", 40, 40)},
			"root:0@0+100* a:1@0+80 b:1@40+40*", ms(100)},
		{"sub-agent's trace grafted under its plan step",
			[]keel.Span{sp("root", "", 0, 100), sp("step-a", "root", 10, 80), sp("child-root", "step-a", 12, 70), sp("child-s1", "child-root", 15, 60), sp("compose", "root", 90, 10)},
			"root:0@0+100* step-a:1@10+80 child-root:2@12+70 child-s1:3@15+60 compose:1@90+10*", ms(100)},
		{"running spans end now",
			[]keel.Span{running(sp("root", "", 0, 0)), sp("s1", "root", 0, 200), running(sp("s2", "root", 400, 0))},
			"root:0@0+1000*> s1:1@0+200 s2:1@400+600*>", ms(1000)},
		{"a running span with a recorded duration past now keeps it",
			[]keel.Span{func() keel.Span {
				s := sp("root", "", 0, 0)
				s.Status, s.Duration = keel.SpanRunning, ms(1500)
				return s
			}()},
			"root:0@0+1500*>", ms(1500)},
		{"clock skew: a child starting before its parent",
			[]keel.Span{sp("root", "", 100, 100), sp("early", "root", 40, 50), sp("s", "root", 150, 50)},
			"root:0@60+100* early:1@0+50 s:1@110+50*", ms(160)},
		{"zero-duration spans",
			[]keel.Span{sp("root", "", 0, 0), sp("a", "root", 0, 0), sp("b", "root", 0, 0)},
			"root:0@0+0* a:1@0+0 b:1@0+0*", 0},
		{"negative durations count as none",
			[]keel.Span{sp("root", "", 0, -5)},
			"root:0@0+0*", 0},
		{"parent not in the trace, self-parented: roots",
			[]keel.Span{sp("a", "elsewhere", 0, 10), sp("b", "b", 5, 30), sp("c", "a", 1, 2)},
			"a:0@0+10 c:1@1+2 b:0@5+30*", ms(35)},
		{"a cycle of parents loses no span",
			[]keel.Span{sp("root", "", 0, 10), sp("x", "y", 1, 2), sp("y", "x", 2, 2)},
			"root:0@0+10* x:0@1+2 y:1@2+2", ms(10)},
		{"duplicate IDs: children under the first, both shown",
			[]keel.Span{sp("root", "", 0, 10), sp("root", "", 0, 5), sp("k", "root", 1, 1)},
			"root:0@0+10* k:1@1+1* root:0@0+5", ms(10)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tree := Build(tt.spans, now)
			if got := shape(tree); got != tt.want {
				t.Errorf("Build = %s\n            want %s", got, tt.want)
			}
			if tree.Duration != tt.total {
				t.Errorf("Build: duration %v, want %v", tree.Duration, tt.total)
			}
			if len(tree.Nodes()) != len(tt.spans) {
				t.Errorf("Build: %d nodes of %d spans", len(tree.Nodes()), len(tt.spans))
			}
			// The JSON tree holds every node once, under its parent.
			var count func(ns []*Node) int
			count = func(ns []*Node) int {
				c := len(ns)
				for _, n := range ns {
					c += count(n.Children)
				}
				return c
			}
			if c := count(tree.Roots); c != len(tt.spans) {
				t.Errorf("Build: roots and children hold %d nodes, want %d", c, len(tt.spans))
			}
		})
	}
}

// TestBuildDeep: a trace as deep as it is long is laid out without
// recursion (no stack growth per level), indented to a bound, and its
// critical path runs to the leaf.
func TestBuildDeep(t *testing.T) {
	t.Parallel()
	const depth = 20_000
	spans := make([]keel.Span, depth)
	for i := range spans {
		parent := ""
		if i > 0 {
			parent = fmt.Sprint(i - 1)
		}
		spans[i] = sp(fmt.Sprint(i), parent, i, depth-i)
	}
	tree := Build(spans, t0)
	nodes := tree.Nodes()
	if len(nodes) != depth || nodes[depth-1].Depth != depth-1 || len(tree.Critical()) != depth {
		t.Fatalf("Build(chain of %d): %d nodes, last at depth %d, critical path %d long", depth, len(nodes), nodes[len(nodes)-1].Depth, len(tree.Critical()))
	}
	var b bytes.Buffer
	if err := Render(&b, tree, Options{Width: 120}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.Contains(last, fmt.Sprintf("[%d] step", depth-1)) {
		t.Errorf("deepest line = %q, want its depth shown as [%d]", last, depth-1)
	}
	if w := utf8.RuneCountInString(last); w > 120 {
		t.Errorf("deepest line is %d columns wide, want at most 120: %q", w, last)
	}
}

// TestRender: marks, bars, and the columns of each line.
func TestRender(t *testing.T) {
	t.Parallel()
	now := t0.Add(ms(1000))
	model := keel.Span{ID: "m", ParentID: "s1", Kind: keel.SpanModelCall, Name: "keel-tiny", Provider: "ollama", Start: t0, Duration: ms(250),
		Status: keel.SpanOK, PromptTokens: 120, CompletionTokens: 34, CostUSD: 0.0025}
	failed := keel.Span{ID: "t", ParentID: "s1", Kind: keel.SpanToolCall, Name: "fetch", Start: t0.Add(ms(250)), Duration: ms(250),
		Status: keel.SpanError, Error: "permission_denied: host example.com is not granted to this tool, ask for a grant\nsecond line"}
	root := keel.Span{ID: "r", RunID: "run_1", Kind: keel.SpanRun, Name: "agent", Start: t0, Status: keel.SpanRunning}
	step := keel.Span{ID: "s1", ParentID: "r", Kind: keel.SpanStep, Name: "step", Step: 1, Start: t0, Duration: ms(500), Status: keel.SpanOK}
	zero := keel.Span{ID: "z", ParentID: "r", Kind: keel.SpanHuman, Name: "fetch", Start: t0.Add(ms(500)), Status: keel.SpanOK}
	tree := Build([]keel.Span{root, step, model, failed, zero}, now)
	const width = 140
	var b bytes.Buffer
	if err := Render(&b, tree, Options{Width: width}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("Render: %d lines, want a header and 5 spans:\n%s", len(lines), b.String())
	}
	for _, tt := range []struct {
		line  int
		parts []string
	}{
		{0, []string{"START", "DURATION", "SPAN", "[0 ", " 1.00s]", "TOKENS", "COST", "STATUS"}},
		{1, []string{"*  ", " 1.00s ", "run agent run_1", ">] ", " running"}},
		{2, []string{"   ", "500ms", "  step 1", "[=====", " ok"}},
		{3, []string{"     0s ", "250ms", "    model.call ollama/keel-tiny", "120/34", "$0.002500", " ok"}},
		{4, []string{" ! ", "250ms", "    tool.call fetch", "error: permission_denied: host example.…"}},
		{5, []string{"*  ", "500ms", "0s", "  human.wait fetch", "|", " ok"}},
	} {
		for _, p := range tt.parts {
			if !strings.Contains(lines[tt.line], p) {
				t.Errorf("line %d = %q, want it to contain %q", tt.line, lines[tt.line], p)
			}
		}
	}
	for i, l := range lines {
		if w := utf8.RuneCountInString(l); w > width {
			t.Errorf("line %d is %d columns, want at most %d: %q", i, w, width, l)
		}
	}
	// The bars line up on one scale: the step's ends where the tool's
	// does, half way; the zero-length wait is a mark there too.
	barOf := func(l string) string { return l[strings.Index(l, "[")+1 : strings.Index(l, "]")] }
	stepBar, toolBar, waitBar := barOf(lines[2]), barOf(lines[4]), barOf(lines[5])
	if strings.LastIndexByte(stepBar, '=') != strings.LastIndexByte(toolBar, '=') {
		t.Errorf("step bar %q and tool bar %q end in different columns", stepBar, toolBar)
	}
	if strings.IndexByte(waitBar, '|') != strings.LastIndexByte(stepBar, '=')+1 {
		t.Errorf("wait mark %q is not right after the step's end %q", waitBar, stepBar)
	}
	if rootBar := barOf(lines[1]); strings.TrimRight(rootBar, "=>") != "" || !strings.HasSuffix(rootBar, ">") {
		t.Errorf("running root's bar = %q, want the whole width, open at the end", rootBar)
	}
}

// TestRenderNarrow: a width too small for the columns still draws a bar
// of MinBar, and shortens long span names first.
func TestRenderNarrow(t *testing.T) {
	t.Parallel()
	long := sp("a", "", 0, 10)
	long.Name = strings.Repeat("x", 80)
	var b bytes.Buffer
	if err := Render(&b, Build([]keel.Span{long}, t0), Options{Width: 20}); err != nil {
		t.Fatal(err)
	}
	line := strings.Split(b.String(), "\n")[1]
	if got := strings.Count(line, "="); got != MinBar {
		t.Errorf("narrow line %q has a bar of %d, want %d", line, got, MinBar)
	}
	if !strings.Contains(line, "…") || strings.Contains(line, strings.Repeat("x", minName)) {
		t.Errorf("narrow line %q: want the name shortened to fit %d columns", line, minName)
	}
}

// TestSubRun: a plan step's span names its sub-agent; other spans none.
func TestSubRun(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		span keel.Span
		want keel.RunID
	}{
		{keel.Span{Kind: keel.SpanStep, Attrs: json.RawMessage(`{"run":"run_1.count.1","attempt":1}`)}, "run_1.count.1"},
		{keel.Span{Kind: keel.SpanStep, Name: "step", Step: 2}, ""},
		{keel.Span{Kind: keel.SpanStep, Attrs: json.RawMessage(`{"run":5}`)}, ""},
		{keel.Span{Kind: keel.SpanStep, Attrs: json.RawMessage(`not json`)}, ""},
		{keel.Span{Kind: keel.SpanModelCall, Attrs: json.RawMessage(`{"run":"run_x"}`)}, ""},
	} {
		got, ok := SubRun(tt.span)
		if got != tt.want || ok != (tt.want != "") {
			t.Errorf("SubRun(%s %s) = %q, %v; want %q", tt.span.Kind, tt.span.Attrs, got, ok, tt.want)
		}
	}
}

// TestFormatDuration: compact, about three significant digits.
func TestFormatDuration(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"}, {0, "0s"}, {850 * time.Microsecond, "850µs"}, {12 * time.Millisecond, "12ms"},
		{1250 * time.Millisecond, "1.25s"}, {42*time.Second + 300*time.Millisecond, "42.3s"}, {125 * time.Second, "2m05s"}, {3*time.Hour + 7*time.Minute, "3h07m"},
	} {
		if got := formatDuration(tt.d); got != tt.want {
			t.Errorf("formatDuration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}
