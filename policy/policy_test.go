package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
)

var opts = Options{Home: home}

func compile(t *testing.T, files ...LayerFile) *Policy {
	t.Helper()
	p, err := Compile(opts, files...)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return p
}

func file(l Layer, data string) LayerFile {
	return LayerFile{Layer: l, Name: l.String() + ".json", Data: []byte(data)}
}

func ruleFile(l Layer, o Outcome) LayerFile {
	return file(l, fmt.Sprintf(`{"rules": [{"action": "tool", "tool": "fetch", "decision": %q}]}`, o))
}

var fetch = &Action{Kind: KindTool, Tool: "fetch", SideEffect: keel.SideEffectExternal}

// TestPrecedence decides one action under every combination of verdicts
// (none, allow, ask, deny) the four layers can give it: the decision is
// the strictest, explained by the highest layer that gave it, so a deny
// anywhere wins and no lower layer loosens a higher one.
func TestPrecedence(t *testing.T) {
	t.Parallel()
	outcomes := []Outcome{0, Allow, Ask, Deny}
	for combo := range 1 << (2 * numLayers) {
		var files []LayerFile
		var set [numLayers]Outcome
		want, wantLayer := Allow, Layer(255)
		for l := range Layer(numLayers) {
			o := outcomes[combo>>(2*l)&3]
			set[l] = o
			if o == 0 {
				continue
			}
			files = append(files, ruleFile(l, o))
			if o > want || wantLayer == 255 {
				want, wantLayer = o, l
			}
		}
		name := fmt.Sprintf("managed=%s,workspace=%s,user=%s,run=%s", set[0], set[1], set[2], set[3])
		p := compile(t, files...)
		d := p.Decide(fetch)
		if d.Outcome != want {
			t.Errorf("%s: Decide = %s, want %s", name, d, want)
			continue
		}
		for l, o := range set {
			if o > d.Outcome {
				t.Errorf("%s: Decide = %s loosens the %s layer's %s", name, d.Outcome, Layer(l), o)
			}
		}
		if wantLayer == 255 {
			if d.Rule() != nil {
				t.Errorf("%s: decided by %s, want the built-in default", name, d.Rule())
			}
			continue
		}
		if d.Rule() == nil || d.Rule().Layer != wantLayer {
			t.Errorf("%s: Decide = %s, want it explained by the %s layer", name, d, wantLayer)
		}
	}
}

// TestLayerDefaults: a layer's default for a kind is its verdict when
// none of its rules match, so a project can allow one destination and
// deny the rest, and a lower layer's allow rule cannot pass a higher
// layer's default deny.
func TestLayerDefaults(t *testing.T) {
	t.Parallel()
	project := file(LayerWorkspace, `{
  "default": {"egress": "deny"},
  "rules": [
    {"action": "egress", "tool": "fetch", "url": "https://api.myproject.dev/**", "decision": "allow"}
  ]
}`)
	p := compile(t, project)
	tests := []struct {
		tool, dest string
		want       Outcome
	}{
		{"fetch", "https://api.myproject.dev/v1/items", Allow},
		{"fetch", "https://user:pw@API.myproject.dev:443/v1/../v2", Allow},
		{"fetch", "https://api.myproject.dev.evil.test/", Deny},
		{"fetch", "https://api.myproject.dev@evil.test/", Deny},
		{"fetch", "http://api.myproject.dev/", Deny},
		{"fetch", "https://example.com/", Deny},
		{"fetch", "not a url", Deny},
		{"other", "https://api.myproject.dev/", Deny},
	}
	for _, tt := range tests {
		d := p.Decide(&Action{Kind: KindEgress, Tool: tt.tool, Destination: tt.dest})
		if d.Outcome != tt.want {
			t.Errorf("egress %s %s = %s, want %s", tt.tool, tt.dest, d, tt.want)
		}
	}
	// Two files of one layer: the stricter default, whichever comes last.
	for _, order := range [][2]string{{"deny", "allow"}, {"allow", "deny"}} {
		p = compile(t, file(LayerRun, `{"default": {"tool": "`+order[0]+`"}}`), file(LayerRun, `{"default": {"tool": "`+order[1]+`"}}`))
		if d := p.Decide(fetch); d.Outcome != Deny {
			t.Errorf("run-layer defaults %s then %s: Decide = %s, want deny", order[0], order[1], d)
		}
	}
	// A user's allow rule cannot pass the managed default.
	p = compile(t, file(LayerManaged, `{"default": {"egress": "deny"}}`),
		file(LayerUser, `{"rules": [{"action": "egress", "decision": "allow"}]}`))
	if d := p.Decide(&Action{Kind: KindEgress, Tool: "fetch", Destination: "https://x.test/"}); d.Outcome != Deny || d.Setting() == nil || d.Setting().Layer != LayerManaged {
		t.Errorf("egress under a managed default deny = %s, want deny by the managed default", d)
	}
}

func TestBadFiles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		files     []LayerFile
		err       error
		file      string
		line, col int
		field     string
	}{
		{"syntax error", []LayerFile{file(LayerUser, "{\n  \"rules\": [\n    {\"action\": \"tool\",}\n  ]\n}")}, ErrSyntax, "user.json", 3, 22, ""},
		{"unterminated", []LayerFile{file(LayerUser, "{\n  \"rules\": [\n")}, ErrSyntax, "user.json", 3, 1, ""},
		{"empty", []LayerFile{file(LayerManaged, "  \n")}, ErrSyntax, "managed.json", 1, 1, ""},
		{"trailing data", []LayerFile{file(LayerUser, "{}\n{}")}, ErrSyntax, "user.json", 2, 1, ""},
		{"not an object", []LayerFile{file(LayerUser, "\n[]")}, ErrInvalid, "user.json", 2, 1, ""},
		{"unknown top field", []LayerFile{file(LayerUser, "{\n  \"clouds\": false\n}")}, ErrUnknownField, "user.json", 2, 3, "clouds"},
		{"unknown rule field", []LayerFile{file(LayerWorkspace, "{\"rules\": [\n  {\"action\": \"tool\", \"decision\": \"deny\",\n   \"paths\": [\"/x\"]}\n]}")}, ErrUnknownField, "workspace.json", 3, 4, "rules[0].paths"},
		{"field of another action", []LayerFile{file(LayerUser, "{\"rules\": [\n  {\"action\": \"model\", \"decision\": \"deny\", \"path\": \"/x\"}\n]}")}, ErrUnknownField, "user.json", 2, 43, "rules[0].path"},
		{"duplicate field", []LayerFile{file(LayerUser, "{\"rules\": [\n  {\"action\": \"tool\", \"decision\": \"deny\",\n   \"decision\": \"allow\"}\n]}")}, ErrDuplicateField, "user.json", 3, 4, "decision"},
		{"bad decision", []LayerFile{file(LayerUser, "{\"rules\": [{\"action\": \"tool\", \"decision\": \"maybe\"}]}")}, ErrInvalid, "user.json", 1, 43, "rules[0].decision"},
		{"bad url", []LayerFile{file(LayerUser, "{\"rules\": [{\"action\": \"egress\", \"decision\": \"deny\",\n \"url\": \"example.com\"}]}")}, ErrInvalid, "user.json", 2, 9, "rules[0].url"},
		{"bad label", []LayerFile{file(LayerUser, "{\"clear\": {\"Private\": [\"openai\"]}}")}, ErrInvalid, "user.json", 1, 12, "clear.Private"},
		{"wrong type", []LayerFile{file(LayerUser, "{\n\"cloud\": \"no\"}")}, ErrInvalid, "user.json", 2, 10, "cloud"},
		{"locked key overridden", []LayerFile{
			file(LayerManaged, `{"cloud": false, "lock": ["cloud"]}`),
			file(LayerUser, "{\n  \"comment\": \"mine\",\n  \"cloud\": true\n}"),
		}, ErrLocked, "user.json", 3, 3, "cloud"},
		{"locked clear overridden", []LayerFile{
			file(LayerManaged, `{"clear": {"pii": []}, "lock": ["clear"]}`),
			file(LayerRun, "{\"clear\": {\n  \"pii\": [\"openai\"]}}"),
		}, ErrLocked, "run.json", 2, 3, "clear.pii"},
		{"locked but unset", []LayerFile{
			file(LayerManaged, `{"lock": ["default.egress"]}`),
			file(LayerWorkspace, "{\"default\": {\"egress\": \"allow\"}}"),
		}, ErrLocked, "workspace.json", 1, 14, "default.egress"},
		{"lock below managed", []LayerFile{file(LayerUser, "{\"lock\": [\"cloud\"]}")}, ErrInvalid, "user.json", 1, 11, "lock"},
		{"unknown lock", []LayerFile{file(LayerManaged, "{\"lock\": [\"rules\"]}")}, ErrInvalid, "managed.json", 1, 11, "lock"},
		{"rule without action", []LayerFile{file(LayerUser, "{\"rules\": [{\"decision\": \"deny\"}]}")}, ErrInvalid, "user.json", 1, 12, "rules[0].action"},
		{"too large", []LayerFile{file(LayerUser, "{\"comment\": \""+strings.Repeat("x", MaxFileSize)+"\"}")}, ErrTooLarge, "user.json", 1, 1, ""},
	}
	for _, tt := range tests {
		_, err := Compile(opts, tt.files...)
		var fe *FileError
		if !errors.As(err, &fe) {
			t.Errorf("%s: Compile = %v, want a *FileError", tt.name, err)
			continue
		}
		if !errors.Is(err, tt.err) || fe.File != tt.file || fe.Line != tt.line || fe.Col != tt.col || fe.Field != tt.field {
			t.Errorf("%s: Compile = %v (field %q), want %v at %s:%d:%d field %q", tt.name, err, fe.Field, tt.err, tt.file, tt.line, tt.col, tt.field)
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%s:%d:%d", tt.file, tt.line, tt.col)) {
			t.Errorf("%s: %q does not say file:line:col", tt.name, err)
		}
	}
}

// TestLockSameValue: a lower layer repeating a locked value is not an
// override.
func TestLockSameValue(t *testing.T) {
	t.Parallel()
	compile(t, file(LayerManaged, `{"cloud": false, "lock": ["cloud"]}`), file(LayerUser, `{"cloud": false}`))
}

func TestWarnings(t *testing.T) {
	t.Parallel()
	p := compile(t,
		file(LayerManaged, `{"cloud": false, "egress_after_labels": "deny", "clear": {"pii": ["openai"]}}`),
		file(LayerUser, `{
  "cloud": true,
  "egress_after_labels": "allow",
  "clear": {"pii": ["openai", "anthropic"]},
  "rules": [
    {"action": "tool", "path": "notes/*", "decision": "deny"},
    {"action": "model", "labels": [], "decision": "deny"},
    {"action": "tool", "side_effects": ["writes"], "decision": "ask"}
  ]
}`))
	want := []string{
		"user.json:2:3: cloud: true has no effect",
		"user.json:3:3: egress_after_labels: allow has no effect",
		"user.json:4:13: clear.pii: [anthropic] has no effect",
		"user.json:6:32: rules[0].path: \"notes/*\" is relative",
		"user.json:7:25: rules[1] can never match: an empty list of labels",
		"user.json:8:40: rules[2].side_effects: no tool has side effect \"writes\"",
		"user.json:8:24: rules[2] can never match",
	}
	var got []string
	for _, w := range p.Warnings() {
		got = append(got, w.String())
	}
	all := strings.Join(got, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("warnings lack %q; got:\n%s", w, all)
		}
	}
	// The never-matching relative-path rule matches nothing.
	if d := p.Decide(&Action{Kind: KindTool, Tool: "cat", Paths: []string{"notes/a"}, Base: "/w"}); d.Outcome != Allow {
		t.Errorf("Decide = %s, want allow", d)
	}
}

func TestModelDecisions(t *testing.T) {
	t.Parallel()
	noCloud := file(LayerManaged, `{
  "comment": "No data leaves this laptop.",
  "cloud": false,
  "lock": ["cloud"]
}`)
	p := compile(t, noCloud)
	d := p.Decide(&Action{Kind: KindModel, Provider: "openai", Model: "gpt-5", Cloud: true})
	if d.Outcome != Deny || !strings.Contains(d.String(), "managed.json:3:3") {
		t.Errorf("cloud call under cloud: false = %s, want deny naming managed.json:3:3", d)
	}
	if d := p.Decide(&Action{Kind: KindModel, Provider: "ollama", Model: "qwen3", Labels: Labels(Secret)}); d.Outcome != Allow {
		t.Errorf("local call = %s, want allow", d)
	}

	p = compile(t,
		file(LayerUser, `{"clear": {"pii": ["openai", "anthropic"], "private": ["openai"]}}`),
		file(LayerWorkspace, `{"clear": {"pii": ["openai"]}}`))
	tests := []struct {
		provider string
		labels   LabelSet
		want     Outcome
		label    Label
	}{
		{"openai", LabelSet{}, Allow, ""},
		{"openai", Labels(PII), Allow, ""},
		{"anthropic", Labels(PII), Deny, PII},      // the workspace cleared it for fewer
		{"openai", Labels(Private), Deny, Private}, // private is never cleared
		{"openai", Labels(Private, PII), Deny, Private},
		{"openai", Labels(Secret), Deny, Secret},
	}
	if w := p.Warnings(); !slices.ContainsFunc(w, func(w Warning) bool {
		return w.File == "user.json" && w.Line == 1 && strings.Contains(w.Msg, "clear.private has no effect")
	}) {
		t.Errorf("warnings = %v, want one at user.json:1 saying clear.private has no effect", w)
	}
	if d := p.Decide(&Action{Kind: KindModel, Provider: "openai", Cloud: true, Labels: Labels(Private)}); !strings.Contains(d.String(), "never leaves this machine") {
		t.Errorf("private to the cloud explained as %q, want it to say private never leaves this machine", d)
	}
	for _, tt := range tests {
		d := p.Decide(&Action{Kind: KindModel, Provider: tt.provider, Cloud: true, Labels: tt.labels})
		if d.Outcome != tt.want || d.Label() != tt.label {
			t.Errorf("model %s with %s = %s (label %q), want %s (label %q)", tt.provider, tt.labels, d, d.Label(), tt.want, tt.label)
		}
	}

	p = compile(t, file(LayerUser, `{"rules": [
  {"action": "model", "where": "cloud", "labels": ["pii"], "decision": "deny", "reason": "no PII to the cloud"},
  {"action": "model", "provider": "openai", "model": "gpt-4*", "decision": "ask"}
]}`))
	if d := p.Decide(&Action{Kind: KindModel, Provider: "openai", Model: "gpt-4o", Cloud: true}); d.Outcome != Ask || d.Rule().N != 2 {
		t.Errorf("gpt-4o = %s, want ask by rule 2", d)
	}
	if d := p.Decide(&Action{Kind: KindModel, Provider: "openai", Model: "gpt-5", Cloud: true}); d.Outcome != Allow {
		t.Errorf("gpt-5 = %s, want allow", d)
	}
}

func TestEgressAfterLabels(t *testing.T) {
	t.Parallel()
	egress := func(p *Policy, ls LabelSet) Decision {
		return p.Decide(&Action{Kind: KindEgress, Tool: "fetch", Destination: "https://example.com/", Labels: ls})
	}
	p := compile(t)
	if d := egress(p, LabelSet{}); d.Outcome != Allow {
		t.Errorf("egress without labels = %s, want allow", d)
	}
	if d := egress(p, Labels(Private)); d.Outcome != Ask || !strings.Contains(d.String(), "labelled data") {
		t.Errorf("egress after private data = %s, want ask", d)
	}
	p = compile(t, file(LayerUser, `{"egress_after_labels": "allow"}`))
	if d := egress(p, Labels(Private)); d.Outcome != Allow {
		t.Errorf("egress after private data with egress_after_labels allow = %s, want allow", d)
	}
	p = compile(t, file(LayerUser, `{"rules": [{"action": "egress", "labels": ["secret"], "decision": "deny"}]}`))
	if d := egress(p, Labels(Secret, Private)); d.Outcome != Deny {
		t.Errorf("egress after secret data = %s, want deny", d)
	}
	if d := egress(p, Labels(Private)); d.Outcome != Ask {
		t.Errorf("egress after private data = %s, want ask", d)
	}
}

func TestToolArguments(t *testing.T) {
	t.Parallel()
	p := compile(t, file(LayerUser, `{"rules": [
  {"action": "tool", "path": "~/.ssh/**", "decision": "deny", "reason": "keys"},
  {"action": "tool", "tool": "write_file", "path": "/work/**", "decision": "allow"},
  {"action": "tool", "tool": "write_file", "decision": "ask"},
  {"action": "tool", "tool": "shell", "args": {"/cmd": "rm *"}, "decision": "deny"},
  {"action": "tool", "tool": "fetch", "url": "https://*.internal.test", "decision": "deny"},
  {"action": "tool", "tool": "fetch", "host": "0x7f.1", "decision": "deny"}
]}`))
	resolve := func(p string) (string, error) {
		if rest, ok := strings.CutPrefix(p, "/work/keys"); ok {
			return "/home/ada/.ssh" + rest, nil
		}
		if strings.HasPrefix(p, "/work/broken") {
			return "", errors.New("dangling")
		}
		return p, nil
	}
	tests := []struct {
		name string
		a    Action
		want Outcome
		rule int
	}{
		{"ssh key", Action{Tool: "cat", Paths: []string{"~/.ssh/id_rsa"}}, Deny, 1},
		{"ssh via ..", Action{Tool: "cat", Paths: []string{"/home/ada/src/../.ssh/id_rsa"}}, Deny, 1},
		{"ssh relative", Action{Tool: "cat", Paths: []string{"../.ssh/id_rsa"}, Base: "/home/ada/src"}, Deny, 1},
		{"ssh through a symlink", Action{Tool: "cat", Paths: []string{"/work/keys/id_rsa"}, Resolve: resolve}, Deny, 1},
		{"ssh among others", Action{Tool: "cat", Paths: []string{"/tmp/a", "~/.ssh/"}}, Deny, 1},
		{"other file", Action{Tool: "cat", Paths: []string{"~/notes"}}, Allow, 0},
		{"write in work", Action{Tool: "write_file", Paths: []string{"/work/a"}}, Ask, 3},
		{"write elsewhere", Action{Tool: "write_file", Paths: []string{"/etc/a"}}, Ask, 3},
		{"unresolvable path", Action{Tool: "write_file", Paths: []string{"/work/broken/x"}, Resolve: resolve}, Deny, 1},
		{"rm", Action{Tool: "shell", Args: []byte(`{"cmd": "rm -rf /"}`)}, Deny, 4},
		{"ls", Action{Tool: "shell", Args: []byte(`{"cmd": "ls"}`)}, Allow, 0},
		{"malformed args", Action{Tool: "shell", Args: []byte(`{"cmd": `)}, Deny, 4},
		{"internal url", Action{Tool: "fetch", URLs: []string{"https://a.INTERNAL.test./x"}}, Deny, 5},
		{"loopback url", Action{Tool: "fetch", URLs: []string{"http://2130706433:8080/"}}, Deny, 6},
		{"public url", Action{Tool: "fetch", URLs: []string{"https://example.com/"}}, Allow, 0},
	}
	for _, tt := range tests {
		a := tt.a
		a.Kind = KindTool
		d := p.Decide(&a)
		n := 0
		if d.Rule() != nil {
			n = d.Rule().N
		}
		if d.Outcome != tt.want || n != tt.rule {
			t.Errorf("%s: Decide = %s, want %s by rule %d", tt.name, d, tt.want, tt.rule)
		}
	}
	// write_file in /work: the allow rule matches but the ask rule of the
	// same layer is stricter.
	if d := p.Decide(&Action{Kind: KindTool, Tool: "write_file", Paths: []string{"/work/a"}}); !strings.Contains(d.String(), "rule 3 of the user layer (user.json:4:3)") {
		t.Errorf("explanation = %q, want it to name rule 3 at user.json:4:3", d)
	}
}

func TestRequireApproval(t *testing.T) {
	t.Parallel()
	base := compile(t, file(LayerUser, `{"rules": [{"action": "tool", "tool": "rm", "decision": "deny"}]}`))
	ra, err := RequireApproval(keel.SideEffectExternal, keel.SideEffectNonIdempotentWrite)
	if err != nil {
		t.Fatal(err)
	}
	p, err := base.WithRun(ra)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		tool string
		se   keel.SideEffect
		want Outcome
	}{
		{"fetch", keel.SideEffectExternal, Ask},
		{"append", keel.SideEffectNonIdempotentWrite, Ask},
		{"cat", keel.SideEffectReadOnly, Allow},
		{"rm", keel.SideEffectNonIdempotentWrite, Deny},
	}
	for _, tt := range tests {
		d := p.Decide(&Action{Kind: KindTool, Tool: tt.tool, SideEffect: tt.se})
		if d.Outcome != tt.want {
			t.Errorf("%s (%s) = %s, want %s", tt.tool, tt.se, d, tt.want)
		}
	}
	if d := p.Decide(&Action{Kind: KindTool, Tool: "fetch", SideEffect: keel.SideEffectExternal}); !strings.Contains(d.String(), "run layer (--require-approval:") {
		t.Errorf("explanation = %q, want it to name --require-approval", d)
	}
	if d := base.Decide(&Action{Kind: KindTool, Tool: "fetch", SideEffect: keel.SideEffectExternal}); d.Outcome != Allow {
		t.Errorf("WithRun changed its receiver: %s", d)
	}
	if _, err := RequireApproval("sometimes"); !errors.Is(err, keel.ErrInvalid) {
		t.Errorf("RequireApproval(sometimes) = %v, want ErrInvalid", err)
	}
	if _, err := base.WithRun(file(LayerUser, `{}`)); err == nil {
		t.Error("WithRun accepted a user-layer file")
	}
}

func TestLabelsOf(t *testing.T) {
	t.Parallel()
	p := compile(t,
		file(LayerManaged, `{"sources": [{"path": "~/notes/**", "labels": ["private"]}, {"source": "human", "labels": ["private"]}]}`),
		file(LayerUser, `{"sources": [
  {"path": "~/notes/hr/**", "labels": ["pii"]},
  {"scope": "hr/*", "labels": ["pii", "private"]},
  {"tool": "read_mail", "labels": ["private", "mail"]}
]}`))
	tests := []struct {
		src  Source
		want LabelSet
	}{
		{Source{SourcePath, "~/notes/a.md"}, Labels(Private)},
		{Source{SourcePath, "/home/ada/x/../notes/hr/b.md"}, Labels(Private, PII)},
		{Source{SourcePath, "/home/ada/code"}, LabelSet{}},
		{Source{SourcePath, "relative"}, Labels(Private, PII)},
		{Source{SourceScope, "hr/2026"}, Labels(PII, Private)},
		{Source{SourceScope, "eng"}, LabelSet{}},
		{Source{SourceTool, "read_mail"}, Labels("mail", Private)},
		{Source{SourceHuman, ""}, Labels(Private)},
		{Source{SourceInput, ""}, LabelSet{}},
	}
	for _, tt := range tests {
		if got := p.LabelsOf(tt.src); !got.Equal(tt.want) {
			t.Errorf("LabelsOf(%v) = %s, want %s", tt.src, got, tt.want)
		}
	}
	// Every path source's labels, of every layer, and no other source's.
	if got, want := p.PathLabels(), Labels(Private, PII); !got.Equal(want) {
		t.Errorf("PathLabels() = %s, want %s", got, want)
	}
}

func TestDigestAndKinds(t *testing.T) {
	t.Parallel()
	a := compile(t, file(LayerUser, `{}`))
	b := compile(t, file(LayerUser, `{ }`))
	c := compile(t, file(LayerWorkspace, `{}`))
	if a.Digest() == b.Digest() || a.Digest() == c.Digest() || len(a.Digest()) != 64 {
		t.Errorf("digests %s %s %s: want distinct SHA-256 hex", a.Digest(), b.Digest(), c.Digest())
	}
	if d := a.Decide(&Action{}); d.Outcome != Deny {
		t.Errorf("an action of no kind = %s, want deny", d)
	}
	p := compile(t, file(LayerUser, `{"rules": [
  {"action": "knowledge", "scope": "hr/**", "decision": "deny"},
  {"action": "telemetry", "url": "https://otel.example.com", "decision": "allow"},
  {"action": "telemetry", "host": "*", "decision": "ask"}
]}`))
	if d := p.Decide(&Action{Kind: KindKnowledge, Scope: "hr/salaries"}); d.Outcome != Deny {
		t.Errorf("knowledge hr/salaries = %s, want deny", d)
	}
	if d := p.Decide(&Action{Kind: KindTelemetry, Destination: "https://otel.example.com/v1/traces"}); d.Outcome != Ask {
		t.Errorf("telemetry = %s, want ask (the stricter rule of the layer)", d)
	}
}

// TestRuleExplanationFormattedOnce: a rule's decisions are explained by
// the text formatted at Compile, the same as the one formatted on demand.
func TestRuleExplanationFormattedOnce(t *testing.T) { // not parallel: AllocsPerRun
	p := compile(t, file(LayerUser, `{"rules": [
  {"action": "tool", "tool": "write", "decision": "deny", "reason": "no writes"},
  {"action": "tool", "tool": "echo", "decision": "allow"}
]}`))
	for _, tt := range []struct{ tool, want string }{
		{"write", "deny: rule 1 of the user layer (user.json:2:3): no writes"},
		{"echo", "allow: rule 2 of the user layer (user.json:3:3)"},
	} {
		d := p.Decide(&Action{Kind: KindTool, Tool: tt.tool})
		if got := d.String(); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.tool, got, tt.want)
		}
		if n := testing.AllocsPerRun(100, func() { _ = d.String() }); n != 0 {
			t.Errorf("%s: explaining allocates %v times, want 0 (formatted at Compile)", tt.tool, n)
		}
	}
}
