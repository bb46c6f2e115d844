package store_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/store"
)

// TestListRunsPage: a status filter and cursor paging find every
// matching run once, newest first, across pages, even with runs created
// in the same instant; a cursor no page returned is invalid input.
func TestListRunsPage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "keel.db"))
	t0 := time.Now().Add(-time.Hour)
	var waiting []keel.RunID // newest first
	for i := range 23 {
		id := keel.RunID(fmt.Sprintf("run_%02d", i))
		at := t0.Add(time.Duration(i/3) * time.Second) // three runs per instant
		if err := s.CreateRun(ctx, keel.Run{ID: id, Goal: "g", Status: keel.RunQueued, MaxSteps: 1, CreatedAt: at, UpdatedAt: at}); err != nil {
			t.Fatal(err)
		}
		upd := &keel.RunUpdate{Status: keel.RunRunning}
		if _, err := s.Append(ctx, id, keel.EventRunStarted, at, []byte(`{}`), upd); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, err := s.Append(ctx, id, keel.EventRunWaiting, at, []byte(`{}`), &keel.RunUpdate{Status: keel.RunWaiting}); err != nil {
				t.Fatal(err)
			}
			waiting = append([]keel.RunID{id}, waiting...)
		}
	}
	for _, limit := range []int{1, 5, 12, 50} {
		t.Run(fmt.Sprint("limit ", limit), func(t *testing.T) {
			var got []keel.RunID
			cursor, pages := "", 0
			for {
				runs, next, err := s.ListRunsPage(ctx, store.ListQuery{Limit: limit, Statuses: []keel.RunStatus{keel.RunWaiting}, Cursor: cursor})
				if err != nil {
					t.Fatal(err)
				}
				pages++
				if len(runs) > limit {
					t.Fatalf("page of %d runs, limit %d", len(runs), limit)
				}
				for _, r := range runs {
					if r.Status != keel.RunWaiting {
						t.Errorf("run %s is %s, want only waiting runs", r.ID, r.Status)
					}
					got = append(got, r.ID)
				}
				if next == "" {
					break
				}
				cursor = next
			}
			if !slices.Equal(got, waiting) {
				t.Errorf("pages of %d listed %v, want %v", limit, got, waiting)
			}
			if want := (len(waiting) + limit - 1) / limit; pages != want {
				t.Errorf("%d pages of %d, want %d", pages, limit, want)
			}
		})
	}
	all, next, err := s.ListRunsPage(ctx, store.ListQuery{})
	if err != nil || len(all) != 23 || next != "" || all[0].ID != "run_22" {
		t.Fatalf("ListRunsPage(zero) = %d runs, next %q, %v; want all 23 from run_22", len(all), next, err)
	}
	if _, _, err := s.ListRunsPage(ctx, store.ListQuery{Cursor: "not a cursor"}); !errors.Is(err, keel.ErrInvalid) {
		t.Errorf("ListRunsPage(bad cursor) = %v, want keel.ErrInvalid", err)
	}
}
