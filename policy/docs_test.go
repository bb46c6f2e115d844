package policy

import (
	"os"
	"regexp"
	"testing"
)

// TestDocExamples compiles the JSON examples of docs/policy.md and
// checks that the two named examples do what the page says.
func TestDocExamples(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```json\n(.*?)```").FindAllSubmatch(page, -1) {
		blocks = append(blocks, string(m[1]))
	}
	if len(blocks) != 4 {
		t.Fatalf("docs/policy.md has %d JSON examples, want 4 (format, no data leaves, project fetch, require-approval)", len(blocks))
	}
	for i, b := range blocks {
		p, err := Compile(opts, LayerFile{Layer: LayerManaged, Name: "example", Data: []byte(b)})
		if err != nil {
			t.Errorf("example %d: %v", i, err)
			continue
		}
		if w := p.Warnings(); len(w) > 0 {
			t.Errorf("example %d warns: %v", i, w)
		}
	}
	noData := LayerFile{Layer: LayerManaged, Name: "managed", Data: []byte(blocks[1])}
	project := LayerFile{Layer: LayerWorkspace, Name: "project", Data: []byte(blocks[2])}
	egress := func(p *Policy, dest string) Outcome {
		return p.Decide(&Action{Kind: KindEgress, Tool: "fetch", Destination: dest}).Outcome
	}

	p := compile(t, noData)
	if d := p.Decide(&Action{Kind: KindModel, Provider: "openai", Cloud: true}); d.Outcome != Deny {
		t.Errorf("no data leaves: cloud model = %s, want deny", d)
	}
	if d := p.Decide(&Action{Kind: KindModel, Provider: "ollama", Labels: Labels(Secret)}); d.Outcome != Allow {
		t.Errorf("no data leaves: local model = %s, want allow", d)
	}
	if d := p.Decide(&Action{Kind: KindTelemetry, Destination: "https://otel.example.com/"}); d.Outcome != Deny {
		t.Errorf("no data leaves: telemetry = %s, want deny", d)
	}
	for _, lower := range []string{`{"cloud": true}`, `{"default": {"egress": "allow"}}`, `{"egress_after_labels": "allow"}`} {
		if _, err := Compile(opts, noData, file(LayerUser, lower)); err == nil {
			t.Errorf("no data leaves: a user file %s was accepted; the managed file locks it", lower)
		}
	}
	if d := p.Decide(&Action{Kind: KindModel, Provider: "openai", Cloud: true, Labels: Labels(Private)}); d.Outcome != Deny {
		t.Errorf("no data leaves: cloud model with private data = %s, want deny", d)
	}
	for _, a := range []*Action{
		{Kind: KindEgress, Tool: "fetch", Destination: "https://example.com/"},
		{Kind: KindEgress, Tool: "fetch", Destination: "https://example.com/", Labels: Labels(Private)},
	} {
		if d := p.Decide(a); d.Outcome != Deny {
			t.Errorf("no data leaves: egress to %s with labels %v = %s, want deny", a.Destination, a.Labels, d)
		}
	}
	// A lower layer's allow cannot pass the managed default.
	userAllows := file(LayerUser, `{"rules": [{"action": "egress", "host": "example.com", "decision": "allow"},
		{"action": "telemetry", "host": "otel.example.com", "decision": "allow"}]}`)
	p2 := compile(t, noData, userAllows)
	if d := egress(p2, "https://example.com/"); d != Deny {
		t.Errorf("no data leaves: egress a user rule allows = %s, want deny", d)
	}
	if d := p2.Decide(&Action{Kind: KindTelemetry, Destination: "https://otel.example.com/"}); d.Outcome != Deny {
		t.Errorf("no data leaves: telemetry a user rule allows = %s, want deny", d)
	}

	p = compile(t, project)
	for dest, want := range map[string]Outcome{
		"https://api.myproject.dev/v1/items":     Allow,
		"https://API.myproject.dev:443/v1/items": Allow,
		"https://api.myproject.dev.evil.test/":   Deny,
		"https://api.myproject.dev@evil.test/":   Deny,
		"http://api.myproject.dev/":              Deny,
		"https://example.com/":                   Deny,
	} {
		if got := egress(p, dest); got != want {
			t.Errorf("project: fetch %s = %s, want %s", dest, got, want)
		}
	}
	// Every other tool's egress is denied, even to the project's API.
	if d := p.Decide(&Action{Kind: KindEgress, Tool: "curl", Destination: "https://api.myproject.dev/v1/items"}); d.Outcome != Deny {
		t.Errorf("project: another tool's egress to its API = %s, want deny", d)
	}
	if got := egress(compile(t, noData, project), "https://api.myproject.dev/v1/items"); got != Deny {
		t.Errorf("project under no data leaves: fetch to its API = %s, want deny", got)
	}
}
