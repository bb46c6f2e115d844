package cli

import (
	"errors"
	"slices"
	"testing"
)

func TestOpener(t *testing.T) {
	found := func(string) (string, error) { return "/usr/bin/x", nil }
	missing := func(string) (string, error) { return "", errors.New("not found") }
	for _, tt := range []struct {
		goos     string
		look     func(string) (string, error)
		wantName string
		wantArgs []string
		wantOK   bool
	}{
		{"linux", found, "xdg-open", nil, true},
		{"freebsd", found, "xdg-open", nil, true},
		{"darwin", found, "open", nil, true},
		{"windows", found, "rundll32", []string{"url.dll,FileProtocolHandler"}, true},
		{"linux", missing, "", nil, false},
	} {
		name, args, ok := opener(tt.goos, tt.look)
		if name != tt.wantName || !slices.Equal(args, tt.wantArgs) || ok != tt.wantOK {
			t.Errorf("opener(%s) = %q %q %v, want %q %q %v", tt.goos, name, args, ok, tt.wantName, tt.wantArgs, tt.wantOK)
		}
	}
}
