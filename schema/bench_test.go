package schema

import "testing"

// BenchmarkValidate: validating a tool's small input and output, the
// per-call cost keel pays on the host for every tool call.
func BenchmarkValidate(b *testing.B) {
	in, err := Compile("in", "input_schema", []byte(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}`))
	if err != nil {
		b.Fatal(err)
	}
	out, err := Compile("out", "output_schema", []byte(`{"type":"object","properties":{"words":{"type":"integer","minimum":0},"lines":{"type":"integer","minimum":0},"chars":{"type":"integer","minimum":0}},"required":["words","lines","chars"],"additionalProperties":false}`))
	if err != nil {
		b.Fatal(err)
	}
	input := []byte(`{"text":"the quick brown fox jumps over the lazy dog\nand again"}`)
	output := []byte(`{"words":11,"lines":2,"chars":53}`)
	b.ReportAllocs()
	for b.Loop() {
		if v, err := in.Validate(input); v != nil || err != nil {
			b.Fatal(v, err)
		}
		if v, err := out.Validate(output); v != nil || err != nil {
			b.Fatal(v, err)
		}
	}
}
