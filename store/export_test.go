package store

import (
	"context"
	"time"

	"github.com/keel-runtime/keel"
)

// SetLazyDelay changes how long lazy writes queued from now on wait.
func (s *Store) SetLazyDelay(d time.Duration) {
	s.wr.mu.Lock()
	defer s.wr.mu.Unlock()
	s.wr.delay = d
}

// QueueToolCall queues an audit record as AuditTrail does for a run's call.
func (s *Store) QueueToolCall(a keel.ToolAudit) error { return s.queueToolCall(a) }

// WriteSynchronous makes a write, unsynced or not (op.unsynced), and
// returns the writer connection's synchronous setting its transaction
// ran under: 2 FULL, 1 NORMAL.
func (s *Store) WriteSynchronous(ctx context.Context, unsynced bool) (int, error) {
	var mode int
	err := s.wr.writeOp(ctx, op{fn: func(ctx context.Context, tx *wtx) error {
		return tx.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&mode)
	}, atomic: true, unsynced: unsynced}, carryNone)
	return mode, err
}
