package cli

import (
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
}
