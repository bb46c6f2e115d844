package store

import (
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
