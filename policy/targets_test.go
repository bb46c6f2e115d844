package policy

import (
	"encoding/json"
	"testing"
)

// TestNeedsTargets: NeedsTargets is true for a tool exactly when some
// tool rule that could apply to it (by name, by glob, or for any tool)
// has a path, url or host condition; and wherever it is false, a
// decision with the call's paths and URLs (an unresolvable call
// included) is the one without them.
func TestNeedsTargets(t *testing.T) {
	t.Parallel()
	policies := []struct {
		name, file string
		needs      map[string]bool // by tool
	}{
		{"none", `{"rules": []}`, map[string]bool{"read": false, "write": false}},
		{"no path rules", `{"rules": [
			{"action": "tool", "tool": "write", "decision": "deny"},
			{"action": "tool", "side_effects": ["external"], "decision": "ask"},
			{"action": "tool", "args": {"/mode": "rw"}, "decision": "ask"},
			{"action": "egress", "host": "x.test", "decision": "deny"}]}`, map[string]bool{"read": false, "write": false}},
		{"path rule by name", `{"rules": [{"action": "tool", "tool": "read", "path": "/secret/**", "decision": "deny"}]}`,
			map[string]bool{"read": true, "write": false, "reader": false}},
		{"url rule by glob", `{"rules": [{"action": "tool", "tool": "fe*", "url": "https://x.test/**", "decision": "ask"}]}`,
			map[string]bool{"fetch": true, "read": false}},
		{"host rule for any tool", `{"rules": [{"action": "tool", "host": "x.test", "decision": "allow"}]}`,
			map[string]bool{"fetch": true, "read": true}},
		{"path rule for every tool by star", `{"rules": [{"action": "tool", "tool": "*", "path": "/ok/**", "decision": "allow"}]}`,
			map[string]bool{"read": true}},
	}
	calls := []Action{
		{Tool: "read", Paths: []string{"/secret/a"}},
		{Tool: "read", Paths: []string{"/ok/a"}},
		{Tool: "write", Paths: []string{"/secret/a"}, URLs: []string{"https://x.test/a"}},
		{Tool: "fetch", URLs: []string{"https://x.test/a"}},
		{Tool: "fetch", Unresolvable: true},
		{Tool: "reader", Unresolvable: true},
	}
	for _, pc := range policies {
		p, err := Compile(Options{}, LayerFile{Layer: LayerUser, Name: "policy.json", Data: []byte(pc.file)})
		if err != nil {
			t.Fatalf("%s: %v", pc.name, err)
		}
		for tool, want := range pc.needs {
			if got := p.NeedsTargets(tool); got != want {
				t.Errorf("%s: NeedsTargets(%s) = %v, want %v", pc.name, tool, got, want)
			}
		}
		for _, c := range calls {
			c.Kind, c.Args = KindTool, json.RawMessage(`{"mode":"rw"}`)
			if p.NeedsTargets(c.Tool) {
				continue
			}
			bare := Action{Kind: KindTool, Tool: c.Tool, Args: c.Args}
			if with, without := p.Decide(&c), p.Decide(&bare); with.Outcome != without.Outcome || with.Rule() != without.Rule() {
				t.Errorf("%s: %s with targets %+v = %s, without = %s; NeedsTargets said they do not matter", pc.name, c.Tool, c, with, without)
			}
		}
	}
	if (*Policy)(nil).NeedsTargets("read") {
		t.Error("nil policy NeedsTargets = true, want false")
	}
}
