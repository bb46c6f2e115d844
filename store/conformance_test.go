package store_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/keel-runtime/keel/internal/storetest"
	"github.com/keel-runtime/keel/store"
)

// TestConformance runs the store seam's conformance suite, which the
// JetStream store (cloud/jsstore) passes too.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Store {
		s, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "keel.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}
