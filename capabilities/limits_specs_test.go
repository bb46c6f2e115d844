package capabilities_test

import (
	"slices"
	"testing"

	"github.com/keel-runtime/keel/capabilities"
)

// TestLimitSpecsRoundTrip: what Specs writes, ParseLimit reads back to
// the same limits (the CLI shows granted limits in the form a grant
// takes them).
func TestLimitSpecsRoundTrip(t *testing.T) {
	t.Parallel()
	l := capabilities.Limits{TimeoutMS: 90_000, MemoryMiB: 512, OutputBytes: 3 << 10, WriteQuotaBytes: 1234}
	specs := l.Specs()
	if want := []string{"timeout=1m30s", "memory=512MiB", "output=3KiB", "write_quota=1234"}; !slices.Equal(specs, want) {
		t.Errorf("Specs = %q, want %q", specs, want)
	}
	var back capabilities.Limits
	for _, s := range specs {
		one, err := capabilities.ParseLimit(s, true)
		if err != nil {
			t.Fatalf("ParseLimit(%q): %v", s, err)
		}
		back = back.Add(one)
	}
	if back != l {
		t.Errorf("round trip = %+v, want %+v", back, l)
	}
	if got := (capabilities.Limits{}).Specs(); got != nil {
		t.Errorf("Specs of no limits = %q, want none", got)
	}
}
