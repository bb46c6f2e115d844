package cli

import (
	"strings"
	"testing"

	"github.com/keel-runtime/keel/capabilities"
)

func TestGrantsLine(t *testing.T) {
	for _, c := range []struct {
		g    capabilities.Grants
		want string
	}{
		{capabilities.Grants{}, "none"},
		{capabilities.Grants{Env: []string{"API_TOKEN"}}, "env API_TOKEN"},
		// Granted limits show (they were left out of every listing).
		{capabilities.Grants{Limits: capabilities.Limits{MemoryMiB: 512, TimeoutMS: 30_000}}, "limit timeout=30s, limit memory=512MiB"},
		{capabilities.Grants{
			FS:      []capabilities.FSGrant{{GuestPath: "/workspace", HostPath: "/home/you/notes", ReadOnly: true}, {GuestPath: "/out", HostPath: "/tmp/out"}},
			Network: []string{"https://example.com:443"},
			Env:     []string{"A", "B"},
		}, "fs /workspace=/home/you/notes (ro), fs /out=/tmp/out (rw), net https://example.com:443, env A, env B"},
	} {
		if got := grantsLine(c.g); got != c.want {
			t.Errorf("grantsLine(%+v) = %q, want %q", c.g, got, c.want)
		}
	}
	var b strings.Builder
	describeGrants(&b, "  ", capabilities.Grants{Network: []string{"https://example.com:443"}, Limits: capabilities.Limits{OutputBytes: 4 << 20}})
	if want := "  net https://example.com:443\n  limit output=4MiB\n"; b.String() != want {
		t.Errorf("describeGrants = %q, want %q", b.String(), want)
	}
}
