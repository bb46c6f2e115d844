package store

import "time"

// SetLazyDelay changes how long lazy writes queued from now on wait.
func (s *Store) SetLazyDelay(d time.Duration) {
	s.wr.mu.Lock()
	defer s.wr.mu.Unlock()
	s.wr.delay = d
}
