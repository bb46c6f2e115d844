package engine

import "github.com/keel-runtime/keel"

// StepSpanID is stepSpanID, for tests that write the trace a crash left.
func StepSpanID(id keel.RunID, step int) string { return stepSpanID(id, step) }

// FoldLabels is the labels a run's context holds after evs, by the fold
// resume and replay use.
func FoldLabels(run keel.Run, evs []keel.Event) ([]string, error) {
	c, err := foldLabels(run, evs)
	return labelNames(c.Labels()), err
}
