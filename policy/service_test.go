package policy

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestDirectEgress: the check of a direct tool call's network requests
// allows what the policy in force allows and refuses the rest, ask
// included (a direct call cannot wait), saying what decided and where;
// with no policy file every request is allowed.
func TestDirectEgress(t *testing.T) {
	user := filepath.Join(t.TempDir(), "policy.json")
	writeAtomic(t, user, `{"default": {"egress": "deny"}, "rules": [
  {"action": "egress", "tool": "fetch", "url": "https://api.example.com/**", "decision": "allow"},
  {"action": "egress", "tool": "fetch", "host": "ask.example.com", "decision": "ask"}
]}`)
	w, err := NewWatcher(WatcherConfig{Paths: Paths{User: user}, Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	s := &Service{Watcher: w, Effective: func(string) (*Policy, uint64) { return nil, 0 }}
	ctx := context.Background()
	for _, tt := range []struct {
		tool, dest string
		want       string // "" allowed, else in the error
	}{
		{"fetch", "https://api.example.com/v1/items", ""},
		{"fetch", "https://API.example.com:443/v1/items", ""},
		{"fetch", "https://api.example.com@evil.test/", "deny: "},
		{"fetch", "https://ask.example.com/", "cannot wait"},
		{"other", "https://api.example.com/v1/items", "deny: "},
	} {
		err := s.DirectEgress(tt.tool)(ctx, tt.dest)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("DirectEgress(%s)(%s) = %v, want allowed", tt.tool, tt.dest, err)
		case tt.want != "" && (!errors.Is(err, ErrEgressRefused) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), user)):
			t.Errorf("DirectEgress(%s)(%s) = %v, want ErrEgressRefused naming %q and %s", tt.tool, tt.dest, err, tt.want, user)
		}
	}
	// With no policy file, every request its grants allow is allowed.
	none, err := NewWatcher(WatcherConfig{Paths: Paths{User: filepath.Join(t.TempDir(), "policy.json")}, Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	defer none.Close()
	if err := (&Service{Watcher: none, Effective: s.Effective}).DirectEgress("fetch")(ctx, "https://anywhere.example/"); err != nil {
		t.Errorf("DirectEgress with no policy file = %v, want allowed", err)
	}
}
