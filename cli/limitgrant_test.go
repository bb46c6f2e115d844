package cli

import (
	"testing"

	"github.com/keel-runtime/keel/capabilities"
)

// TestParseLimitGrants: limit:KIND=VALUE grants a higher limit; revoke
// names the limit without a value.
func TestParseLimitGrants(t *testing.T) {
	t.Parallel()
	g, err := parseGrants([]string{"limit:memory=512MiB", "limit:timeout=30s"}, true)
	if want := (capabilities.Limits{MemoryMiB: 512, TimeoutMS: 30000}); err != nil || g.Limits != want {
		t.Fatalf("parseGrants(limit:…) = %+v, %v; want %+v", g.Limits, err, want)
	}
	if g, err := parseGrants([]string{"limit:memory"}, false); err != nil || g.Limits.MemoryMiB == 0 {
		t.Fatalf("parseGrants(limit:memory) for revoke = %+v, %v; want the memory limit named", g.Limits, err)
	}
	for _, bad := range []string{"limit:memory", "limit:cpu=2", "limit:memory=lots"} {
		if _, err := parseGrants([]string{bad}, true); err == nil {
			t.Errorf("parseGrants(%s) = nil error, want it refused", bad)
		}
	}
}
