// Package waterfall lays out a run's trace (its keel.Span tree, with the
// traces of its sub-agent runs grafted under the plan steps they carry
// out) as a waterfall: each span's depth, its start as an offset from the
// trace's start, its duration (a running span's up to now) and whether it
// is on the critical path, the chain of spans that decides when the trace
// ends. Render draws the layout as plain text, one line per span, for a
// terminal or a pipe.
//
// It is pure: spans and a clock reading in, a layout or text out. It does
// no I/O of its own (Render writes to the io.Writer it is given), so the
// CLI (`keel trace`) and anything else that holds a run's spans (a web
// console) compute the same layout. Fetching a run's spans, and those of
// its sub-agents (SubRun names them), is the caller's.
//
// Damaged or odd traces lose no span: a span whose parent is not in the
// trace, or whose parents form a cycle, is shown as a root; a child that
// starts before its parent (clocks that disagree) keeps its own times;
// offsets count from the earliest start in the trace, so none is
// negative.
package waterfall
