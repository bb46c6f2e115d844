package ollama

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestGrammarSchema(t *testing.T) {
	in := `{
		"type": "object",
		"properties": {
			"url": {"type": "string", "pattern": "^https?://", "format": "uri", "maxLength": 100},
			"content": {"type": "string", "maxLength": 1048576},
			"tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 1000},
			"n": {"type": "integer", "minimum": 1, "maximum": 9},
			"x": {"$ref": "#/$defs/x"}
		},
		"required": ["url"],
		"oneOf": [{"required": ["content"]}, {"required": ["tags"]}],
		"additionalProperties": false,
		"$defs": {"x": {"type": "string"}}
	}`
	want := `{
		"type": "object",
		"properties": {
			"url": {"type": "string", "maxLength": 100},
			"content": {"type": "string"},
			"tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
			"n": {"type": "integer", "minimum": 1, "maximum": 9},
			"x": {}
		},
		"required": ["url"],
		"additionalProperties": false
	}`
	var got, w any
	if err := json.Unmarshal(grammarSchema(json.RawMessage(in)), &got); err != nil {
		t.Fatal(err)
	}
	json.Unmarshal([]byte(want), &w)
	if diff := cmp.Diff(w, got); diff != "" {
		t.Errorf("grammarSchema mismatch (-want +got):\n%s", diff)
	}
	for _, bad := range []string{`[]`, `"x"`, `nope`} {
		if got := string(grammarSchema(json.RawMessage(bad))); got != `{"type":"object"}` {
			t.Errorf("grammarSchema(%s) = %s", bad, got)
		}
	}
}
