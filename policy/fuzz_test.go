package policy

import (
	"bytes"
	"errors"
	"testing"

	"github.com/keel-runtime/keel"
)

// FuzzCompile feeds arbitrary bytes to the file parser: it never
// panics, every error is a *FileError at a real position of the file,
// and a policy that compiles decides without panicking.
func FuzzCompile(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"cloud": false, "lock": ["cloud"]}`,
		`{"rules": [{"action": "tool", "tool": "fetch", "path": ["~/x/**", "/y"], "url": "https://*.a.test", "decision": "deny"}]}`,
		`{"rules": [{"action": "model", "where": "cloud", "labels": ["pii"], "provider": "o*", "decision": "ask"}]}`,
		`{"rules": [{"action": "tool", "args": {"/a/0": "x*"}, "side_effects": "external", "decision": "allow"}]}`,
		`{"default": {"egress": "deny"}, "clear": {"private": ["*"]}, "egress_after_labels": "deny"}`,
		`{"sources": [{"path": "~/n/**", "labels": ["private"]}, {"source": "human", "labels": ["x"]}]}`,
		"{\n \"rules\": [\n  {\"action\": \"tool\",}\n ]\n}", `{"a":1,"a":2}`, `[`, "", "{}{}",
	} {
		f.Add([]byte(s), uint8(LayerManaged))
		f.Add([]byte(s), uint8(LayerUser))
	}
	f.Fuzz(func(t *testing.T, data []byte, layer uint8) {
		l := Layer(layer % numLayers)
		p, err := Compile(opts, LayerFile{Layer: l, Name: "f.json", Data: data})
		if err != nil {
			lines := bytes.Count(data, []byte{'\n'}) + 1
			for _, e := range unjoin(err) {
				var fe *FileError
				if !errors.As(e, &fe) {
					t.Fatalf("error %v is not a *FileError", e)
				}
				if fe.File != "f.json" || fe.Line < 1 || fe.Line > lines || fe.Col < 1 {
					t.Fatalf("error %v: position %d:%d outside the file's %d lines", e, fe.Line, fe.Col, lines)
				}
			}
			return
		}
		for _, a := range []Action{
			{Kind: KindTool, Tool: "fetch", SideEffect: keel.SideEffectExternal, Paths: []string{"~/x/a", "rel"}, URLs: []string{"https://b.a.test/", "bad"}, Args: []byte(`{"a":["xy"]}`), Labels: Labels(PII)},
			{Kind: KindModel, Provider: "openai", Model: "m", Cloud: true, Labels: Labels(Private)},
			{Kind: KindEgress, Tool: "fetch", Destination: "https://a.test/", Labels: Labels(Private)},
			{Kind: KindKnowledge, Scope: "a/b"},
			{Kind: KindTelemetry, Destination: "http://[::1]/"},
		} {
			d := p.Decide(&a)
			if d.Outcome < Allow || d.Outcome > Deny {
				t.Fatalf("Decide(%v) = %v", a.Kind, d.Outcome)
			}
			_ = d.String()
		}
		p.LabelsOf(Source{SourcePath, "~/n/a"})
	})
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
