package schema

import "testing"

func TestValidatePointer(t *testing.T) {
	sch, err := Compile("t", "input_schema", []byte(`{
		"type": "object",
		"properties": {
			"items": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
			"a/b": {"type": "string"},
			"opt": {"type": "string", "enum": ["x", "y"]}
		},
		"additionalProperties": false
	}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		in, pointer string
	}{
		{`{"items":[{"n":1},{"n":"two"}]}`, "/items/1/n"},
		{`{"items":[{"n":1},{}]}`, "/items/1/n"},
		{`{"a/b":1}`, "/a~1b"},
		{`{"opt":"z"}`, "/opt"},
		{`{"zzz":1}`, "/zzz"},
		{`"str"`, ""},
	}
	for _, tt := range tests {
		v, err := sch.Validate([]byte(tt.in))
		if err != nil || v == nil {
			t.Errorf("validate(%s) = %v, %v; want a violation", tt.in, v, err)
			continue
		}
		if v.Pointer != tt.pointer || v.Message == "" {
			t.Errorf("validate(%s) = %+v, want pointer %q and a message", tt.in, v, tt.pointer)
		}
	}
	if v, err := sch.Validate([]byte(`{"items":[{"n":3}],"opt":"x"}`)); v != nil || err != nil {
		t.Errorf("validate(valid) = %v, %v", v, err)
	}
	if _, err := sch.Validate([]byte(`{`)); err == nil {
		t.Error("validate(not JSON) succeeded")
	}
}
