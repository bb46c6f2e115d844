package cli

import (
	"errors"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
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

// TestLabelDirs: --private and --label give every directory granted its
// labels, checked, "private" as Private; listings show them.
func TestLabelDirs(t *testing.T) {
	g, err := parseGrants([]string{"fs-ro:/workspace=/home/you/notes", "net:https://example.com:443"}, true)
	if err != nil {
		t.Fatal(err)
	}
	got, err := labelDirs(g, false, []string{"secret", "pii", "private", "pii"})
	if err != nil {
		t.Fatal(err)
	}
	want := capabilities.FSGrant{GuestPath: "/workspace", HostPath: "/home/you/notes", ReadOnly: true, Private: true, Labels: []string{"pii", "secret"}}
	if len(got.FS) != 1 || !got.FS[0].Equal(want) {
		t.Errorf("labelDirs = %+v, want %+v", got.FS, want)
	}
	if m, want := fsMode(got.FS[0]), "read-only, private, labels pii, secret"; m != want {
		t.Errorf("fsMode = %q, want %q", m, want)
	}
	if l, want := grantsLine(capabilities.Grants{FS: got.FS}), "fs /workspace=/home/you/notes (ro, private, label:pii, label:secret)"; l != want {
		t.Errorf("grantsLine = %q, want %q", l, want)
	}
	for _, bad := range [][]string{{"PII"}, {"9lives"}, {""}, {"a b"}} {
		if _, err := labelDirs(g, false, bad); !errors.Is(err, keel.ErrLabel) {
			t.Errorf("labelDirs(%q) = %v, want ErrLabel", bad, err)
		}
	}
	if _, err := labelDirs(capabilities.Grants{Network: []string{"https://example.com:443"}}, false, []string{"pii"}); err == nil {
		t.Error("labelDirs without a directory accepted a label")
	}
	if same, err := labelDirs(g, false, nil); err != nil || !same.Equal(g) {
		t.Errorf("labelDirs with no labels = %+v, %v; want the grants unchanged", same, err)
	}
}
