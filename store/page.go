package store

import (
	"context"

	"github.com/keel-runtime/keel"
)

// RunPage is ListRunsPage for a query as the protocol sends it (run.list).
func (s *Store) RunPage(ctx context.Context, q keel.RunQuery) (keel.RunPage, error) {
	runs, next, err := s.ListRunsPage(ctx, ListQuery{Limit: q.Limit, Statuses: q.Status, Cursor: q.Cursor})
	return keel.RunPage{Runs: runs, NextCursor: next}, err
}
