package cli

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFormatVersion(t *testing.T) {
	stamped := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}}}
	release := &debug.BuildInfo{Main: debug.Module{Version: "v0.2.0"}}
	for _, tt := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"from a checkout", stamped, "(module devel, commit 0123456789ab+modified)"},
		{"go install of a release", release, "(module v0.2.0, commit unknown)"},
		{"no build info", nil, "(module devel, commit unknown)"},
	} {
		if got := formatVersion(tt.bi); !strings.Contains(got, tt.want) || !strings.HasPrefix(got, "keel ") || !strings.Contains(got, "protocol ") {
			t.Errorf("%s: formatVersion = %q, want it to contain %q", tt.name, got, tt.want)
		}
	}
}
