package schema

import (
	"strings"
	"testing"
)

// fastSchemas are plain schemas the fast check handles, with bounds and
// enums at several depths.
var fastSchemas = []string{
	`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}`,
	`{"type":"object","properties":{"words":{"type":"integer","minimum":0},"lines":{"type":"integer","minimum":0},"chars":{"type":"integer","minimum":0}},"required":["words","lines","chars"],"additionalProperties":false}`,
	`{"type":"object","properties":{"path":{"type":"string","minLength":1,"maxLength":8},"mode":{"type":"string","enum":["r","w"]},"n":{"type":"number","exclusiveMinimum":-3,"exclusiveMaximum":10},"tags":{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":3},"flag":{"type":"boolean"},"nothing":{"type":"null"}}}`,
	`{"properties":{"k":{"maximum":5}},"description":"any type, a bound on k"}`,
	`{"type":"array","items":{"type":"object","properties":{"id":{"type":"integer","minimum":1,"maximum":9007199254740992}},"required":["id"]}}`,
}

// FuzzFastAgrees: the fast check never accepts a value the library
// refuses, for any value and any of fastSchemas.
func FuzzFastAgrees(f *testing.F) {
	for _, seed := range []string{
		`{"text":"hi"}`, `{"text":1}`, `{}`, `{"text":"a","x":1}`,
		`{"words":1,"lines":2,"chars":3}`, `{"words":-1,"lines":0,"chars":0}`, `{"words":1.0,"lines":0,"chars":0}`, `{"words":1e2,"lines":0,"chars":0}`,
		`{"path":"abcdefghi","mode":"x","n":10,"tags":[],"flag":null}`, `{"path":"é","mode":"r","n":-2.5,"tags":["a"],"flag":true,"nothing":null}`,
		`{"k":5}`, `{"k":5.0000000000000000001}`, `{"k":"six"}`, `[{"id":9007199254740993}]`, `[{"id":0}]`, `[{"id":1},{}]`, `null`, `"s"`, `12345678901234567890`,
	} {
		for i := range fastSchemas {
			f.Add(i, seed)
		}
	}
	compiled := make([]*Schema, len(fastSchemas))
	for i, raw := range fastSchemas {
		s, err := Compile("fuzz", "input_schema", []byte(raw))
		if err != nil {
			f.Fatal(err)
		}
		if s.fast == nil {
			f.Fatalf("schema %d has no fast check", i)
		}
		compiled[i] = s
	}
	f.Fuzz(func(t *testing.T, i int, value string) {
		if i < 0 || i >= len(compiled) {
			return
		}
		s := compiled[i]
		v, err := decode([]byte(value))
		if err != nil {
			return
		}
		if s.fast.valid(v) {
			if err := s.s.Validate(v); err != nil {
				t.Errorf("schema %d: the fast check accepts %s, which the library refuses: %v", i, value, err)
			}
		}
	})
}

// TestFastCheck: which schemas get a fast check, and that it accepts the
// plain valid values (so tool calls take it) and leaves the rest to the
// library, whose verdict and message stand.
func TestFastCheck(t *testing.T) {
	for _, raw := range []string{
		`{"type":["string","null"]}`,
		`{"$ref":"#/$defs/x","$defs":{"x":{"type":"string"}}}`,
		`{"type":"object","additionalProperties":{"type":"string"}}`,
		`{"minimum":0.5}`,
		`{"enum":[1,2]}`,
		`{"$schema":"http://json-schema.org/draft-07/schema#","type":"string"}`,
		`{"type":"string","pattern":"^a"}`,
		`{"type":"object","properties":{"x":{"format":"email"}}}`,
	} {
		s, err := Compile("t", "input_schema", []byte(raw))
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if s.fast != nil {
			t.Errorf("%s got a fast check; it uses what the fast check does not handle", raw)
		}
	}
	tests := []struct {
		schema, value string
		fast          bool   // the fast check accepts it
		pointer       string // the violation, "-" for none
	}{
		{fastSchemas[0], `{"text":"hi"}`, true, "-"},
		{fastSchemas[0], `{"text":"hi","more":1}`, false, "/more"},
		{fastSchemas[0], `{}`, false, "/text"},
		{fastSchemas[1], `{"words":9,"lines":1,"chars":40}`, true, "-"},
		{fastSchemas[1], `{"words":9.0,"lines":1,"chars":40}`, false, "-"}, // 9.0 is an integer: the library says so
		{fastSchemas[1], `{"words":-1,"lines":1,"chars":40}`, false, "/words"},
		{fastSchemas[2], `{"path":"a","mode":"w","n":9.5,"tags":["x"],"flag":false,"nothing":null}`, false, "-"},
		{fastSchemas[2], `{"path":"a","mode":"w","n":9,"tags":["x"],"flag":false,"nothing":null}`, true, "-"},
		{fastSchemas[2], `{"mode":"x"}`, false, "/mode"},
		{fastSchemas[2], `{"path":"ééééééééé"}`, false, "/path"},
		{fastSchemas[2], `{"tags":[]}`, false, "/tags"},
		{fastSchemas[2], `{"n":10}`, false, "/n"},
		{fastSchemas[3], `{"k":"text"}`, true, "-"}, // a bound holds only numbers
		{fastSchemas[3], `{"k":6}`, false, "/k"},
		{fastSchemas[4], `[{"id":9007199254740993}]`, false, "/0/id"},
	}
	for _, tt := range tests {
		s, err := Compile("t", "input_schema", []byte(tt.schema))
		if err != nil {
			t.Fatal(err)
		}
		v, err := decode([]byte(tt.value))
		if err != nil {
			t.Fatal(err)
		}
		if got := s.fast.valid(v); got != tt.fast {
			t.Errorf("fast check of %s = %v, want %v", tt.value, got, tt.fast)
		}
		viol, err := s.Validate([]byte(tt.value))
		switch {
		case err != nil:
			t.Errorf("Validate(%s): %v", tt.value, err)
		case tt.pointer == "-" && viol != nil:
			t.Errorf("Validate(%s) = %+v, want valid", tt.value, viol)
		case tt.pointer != "-" && (viol == nil || viol.Pointer != tt.pointer || strings.TrimSpace(viol.Message) == ""):
			t.Errorf("Validate(%s) = %+v, want a violation at %s", tt.value, viol, tt.pointer)
		}
	}
}
