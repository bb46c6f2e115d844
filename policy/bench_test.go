package policy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
)

// benchPolicy builds a policy of n rules spread over the four layers,
// like a large organization's: most rules name one of many tools (or
// providers, or scopes), a few apply to every tool (paths no tool may
// touch, tool-name wildcards), and the managed layer sets defaults,
// clearances and locks.
func benchPolicy(tb testing.TB, n int) *Policy {
	tb.Helper()
	var layers [numLayers][]string
	outcomes := []string{"allow", "ask", "deny"}
	add := func(l Layer, rule string) { layers[l] = append(layers[l], rule) }
	// Every tool: 24 rules with no tool name, in the "any" bucket.
	for i := range 8 {
		add(LayerManaged, fmt.Sprintf(`{"action": "tool", "path": "~/.secret%d/**", "decision": "deny"}`, i))
		add(LayerWorkspace, fmt.Sprintf(`{"action": "tool", "tool": "db%d_*", "decision": "ask"}`, i))
		add(LayerUser, fmt.Sprintf(`{"action": "tool", "url": "https://*.internal%d.test", "decision": "deny"}`, i))
	}
	// The tools of the benchmarked calls.
	add(LayerWorkspace, `{"action": "tool", "tool": "fetch", "url": "https://api.myproject.dev/v1/**", "decision": "allow"}`)
	add(LayerWorkspace, `{"action": "egress", "tool": "fetch", "url": "https://api.myproject.dev/**", "decision": "allow"}`)
	add(LayerUser, `{"action": "tool", "tool": "write_file", "path": "~/project/**", "decision": "allow"}`)
	add(LayerUser, `{"action": "tool", "tool": "write_file", "path": "~/project/.git/**", "decision": "deny"}`)
	add(LayerRun, `{"action": "model", "provider": "ollama", "decision": "allow"}`)
	for i := 0; len(layers[0])+len(layers[1])+len(layers[2])+len(layers[3]) < n; i++ {
		l := Layer(i % numLayers)
		o := outcomes[i%3]
		switch i % 5 {
		case 0:
			add(l, fmt.Sprintf(`{"action": "tool", "tool": "tool%d", "decision": %q}`, i, o))
		case 1:
			add(l, fmt.Sprintf(`{"action": "tool", "tool": "tool%d", "path": "/srv/data%d/**", "decision": %q}`, i, i, o))
		case 2:
			add(l, fmt.Sprintf(`{"action": "egress", "tool": "tool%d", "url": "https://host%d.example.com", "decision": %q}`, i, i, o))
		case 3:
			add(l, fmt.Sprintf(`{"action": "model", "provider": "provider%d", "model": "m%d-*", "decision": %q}`, i, i, o))
		case 4:
			add(l, fmt.Sprintf(`{"action": "knowledge", "scope": "scope%d/**", "decision": %q}`, i, o))
		}
	}
	var files []LayerFile
	for l, rules := range layers {
		settings := ""
		if Layer(l) == LayerManaged {
			settings = `"clear": {"pii": ["openai"]}, "lock": ["clear.pii"], `
		}
		files = append(files, LayerFile{Layer: Layer(l), Name: Layer(l).String() + ".json",
			Data: []byte("{" + settings + `"rules": [` + "\n" + strings.Join(rules, ",\n") + "\n]}")})
	}
	p, err := Compile(Options{Home: home}, files...)
	if err != nil {
		tb.Fatal(err)
	}
	if got := len(p.Rules()); got != n {
		tb.Fatalf("built %d rules, want %d", got, n)
	}
	return p
}

// allowPath are the benchmarked decisions that allow.
var allowPath = []struct {
	name string
	a    Action
}{
	{"tool-url", Action{Kind: KindTool, Tool: "fetch", SideEffect: keel.SideEffectExternal, URLs: []string{"https://api.myproject.dev/v1/items"},
		Args: []byte(`{"url": "https://api.myproject.dev/v1/items"}`)}},
	{"tool-path", Action{Kind: KindTool, Tool: "write_file", SideEffect: keel.SideEffectIdempotentWrite, Paths: []string{"/home/ada/project/src/main.go"}}},
	{"egress", Action{Kind: KindEgress, Tool: "fetch", Destination: "https://api.myproject.dev/v1/items"}},
	{"model-local", Action{Kind: KindModel, Provider: "ollama", Model: "qwen3:8b", Labels: Labels(Private, PII)}},
	{"model-cloud", Action{Kind: KindModel, Provider: "openai", Model: "gpt-5", Cloud: true, Labels: Labels(PII)}},
}

// TestDecideDoesNotAllocate: the allow path of a decision, on a policy
// of 1,000 rules, allocates nothing.
func TestDecideDoesNotAllocate(t *testing.T) { // not parallel: AllocsPerRun
	p := benchPolicy(t, 1000)
	for _, c := range allowPath {
		a := c.a
		if d := p.Decide(&a); d.Outcome != Allow {
			t.Fatalf("%s: Decide = %s, want allow", c.name, d)
		}
		if n := testing.AllocsPerRun(200, func() { p.Decide(&a) }); n != 0 {
			t.Errorf("%s: Decide allocates %v times per call, want 0", c.name, n)
		}
	}
	deny := Action{Kind: KindTool, Tool: "write_file", Paths: []string{"/home/ada/project/.git/config"}}
	if d := p.Decide(&deny); d.Outcome != Deny {
		t.Fatalf("deny path: Decide = %s, want deny", d)
	}
}

// BenchmarkDecide measures decisions on a policy of 1,000 rules (and
// 10,000, to show the index keeps the cost flat). Besides ns/op (the
// mean) it reports the median and 99th percentile of batches of 64
// decisions, per decision.
func BenchmarkDecide(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		p := benchPolicy(b, n)
		for _, c := range allowPath {
			b.Run(fmt.Sprintf("rules=%d/%s", n, c.name), func(b *testing.B) {
				a := c.a
				b.ReportAllocs()
				const batch = 64
				samples := make([]time.Duration, 0, b.N/batch+1)
				b.ResetTimer()
				for i := 0; i < b.N; {
					start := time.Now()
					for j := 0; j < batch && i < b.N; j, i = j+1, i+1 {
						if p.Decide(&a).Outcome != Allow {
							b.Fatal("not allowed")
						}
					}
					samples = append(samples, time.Since(start)/batch)
				}
				b.StopTimer()
				slices.Sort(samples)
				if len(samples) > 0 {
					b.ReportMetric(float64(samples[len(samples)/2].Nanoseconds()), "p50-ns")
					b.ReportMetric(float64(samples[len(samples)*99/100].Nanoseconds()), "p99-ns")
				}
			})
		}
	}
}
