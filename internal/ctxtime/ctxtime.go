// Package ctxtime holds the one wait keel's layers share: a sleep that a
// context ends early.
package ctxtime

import (
	"context"
	"time"
)

// Sleep waits for d, or until ctx ends, whichever comes first. It returns
// nil after d, ctx.Err() when ctx ended first.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
