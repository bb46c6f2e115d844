package engine

import (
	"context"
	"fmt"

	"github.com/keel-runtime/keel"
)

// flow drives a plan or DAG run. (Being built: planner-executor, DAG
// execution and sub-agents.)
func (e *Engine) flow(ctx context.Context, run keel.Run) {
	e.end(ctx, run.ID, fmt.Errorf("runs of kind %q are not supported by this engine yet", run.KindOrAgent()))
}
