package keel_test

import (
	"errors"
	"testing"

	"github.com/keel-runtime/keel"
)

func TestCheckLabel(t *testing.T) {
	for _, ok := range []string{"private", "pii", "a", "team-7_x", "z0"} {
		if err := keel.CheckLabel(ok); err != nil {
			t.Errorf("CheckLabel(%q) = %v, want nil", ok, err)
		}
	}
	long := "a"
	for len(long) <= 64 {
		long += "b"
	}
	for _, bad := range []string{"", "PII", "Pii", "9a", "-a", "_a", "a b", "a.b", "ä", "a/b", long} {
		if err := keel.CheckLabel(bad); !errors.Is(err, keel.ErrLabel) {
			t.Errorf("CheckLabel(%q) = %v, want keel.ErrLabel", bad, err)
		}
	}
}
