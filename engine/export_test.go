package engine

import "github.com/keel-runtime/keel"

// StepSpanID is stepSpanID, for tests that write the trace a crash left.
func StepSpanID(id keel.RunID, step int) string { return stepSpanID(id, step) }
