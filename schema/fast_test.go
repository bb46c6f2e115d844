package schema

import (
	"slices"
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
		" {\"text\" : \"a\\u00e9\\n\" } ", `{"text":"a"}x`, `{"text":"a"} {}`, "{\"text\":\"\x01\"}", `{"te\u0078t":"a"}`, `{"text":"a","text":1}`,
		`{"path":"\u00e9","mode":"\u0072"}`, `{"k":-0}`, `{"k":01}`, `{"k":1.}`, `{"k":-}`, `{"k":1e+}`, `[[[[[[[]]]]]]]`, "{\"text\":\"\xff\"}",
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
		if !s.fast.validRaw([]byte(value)) {
			return
		}
		v, err := decode([]byte(value))
		if err != nil {
			t.Fatalf("schema %d: the fast check accepts %q, which is not JSON: %v", i, value, err)
		}
		if err := s.s.Validate(v); err != nil {
			t.Errorf("schema %d: the fast check accepts %s, which the library refuses: %v", i, value, err)
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
		{fastSchemas[0], " {\n\t\"text\" : \"tab\\there \\u00e9\" }\r\n", true, "-"}, // whitespace and escapes where only the type matters
		{fastSchemas[0], `{"te\u0078t":"a"}`, false, "-"},                            // an escaped key: not judged here
		{fastSchemas[0], `{"text":"a","text":"b"}`, true, "-"},
		{fastSchemas[2], `{"mode":"\u0072"}`, false, "-"},       // an escaped enum value: not judged here, valid
		{fastSchemas[2], `{"path":"\u00e9\u00e9"}`, false, "-"}, // an escaped string under a length bound
		{fastSchemas[2], `{"tags":["a","b","c","d"]}`, false, "/tags"},
		{fastSchemas[4], `[]`, true, "-"},
		{fastSchemas[4], `[{"id":1},{"id":2,"x":[{"y":[null,true,false,-0.5e-3]}]}]`, true, "-"},
	}
	for _, tt := range tests {
		s, err := Compile("t", "input_schema", []byte(tt.schema))
		if err != nil {
			t.Fatal(err)
		}
		if got := s.fast.validRaw([]byte(tt.value)); got != tt.fast {
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

// TestValidRefusesWhatIsNotJSON: the one-pass check never takes bytes
// that are not exactly one JSON value for valid, whatever the schema.
func TestValidRefusesWhatIsNotJSON(t *testing.T) {
	for _, raw := range []string{
		``, ` `, `{"text":"a"}x`, `{"text":"a"} {}`, `{"text":"a",}`, `{"text":"a"`, `{"text" "a"}`, `{text:"a"}`,
		"{\"text\":\"a\x01\"}", `{"text":"a\x"}`, `{"text":"\u00g0"}`, `{"text":"a`, `{"text":"a\`,
		`[1,]`, `[01]`, `[1.]`, `[.5]`, `[-]`, `[1e]`, `[1e+]`, `[+1]`, `[tru]`, `[nul]`, `[True]`, `[1 2]`, "[\v1]",
	} {
		if IsJSON([]byte(raw)) {
			t.Errorf("IsJSON(%q) = true", raw)
		}
		for i, sch := range append(slices.Clone(fastSchemas), `{}`) {
			s, err := Compile("t", "input_schema", []byte(sch))
			if err != nil {
				t.Fatal(err)
			}
			if s.Valid([]byte(raw)) {
				t.Errorf("schema %d: Valid(%q) = true for what is not JSON", i, raw)
			}
			if _, err := s.Validate([]byte(raw)); err == nil {
				t.Errorf("schema %d: Validate(%q) found no parse error", i, raw)
			}
		}
	}
}

func TestIsJSON(t *testing.T) {
	for _, raw := range []string{`0`, `-0.5e+10`, ` "a\"\\\/\b\f\n\r\t\u00e9" `, `[]`, `{}`, `[{"a":[1,{"b":null}]},true,false]`, `{"a":1,"a":2}`} {
		if !IsJSON([]byte(raw)) {
			t.Errorf("IsJSON(%s) = false", raw)
		}
	}
	deep := strings.Repeat("[", maxFastDepth+2) + strings.Repeat("]", maxFastDepth+2)
	if IsJSON([]byte(deep)) {
		t.Errorf("IsJSON judged a value nested deeper than %d", maxFastDepth)
	}
}
