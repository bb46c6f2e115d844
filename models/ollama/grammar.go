package ollama

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/keel-runtime/keel/models"
	"github.com/keel-runtime/keel/schema"
)

// Limits past which a length keyword is dropped from a grammar schema:
// Ollama expands a bounded repetition into the grammar, and a bound such
// as maxLength 1048576 crashes its model runner (seen with v0.17.4).
const (
	maxGrammarLength = 256
	maxGrammarItems  = 32
)

// formatSchema returns what to send as Ollama's format for a request's
// output schema raw: "json" (any JSON string) as is; a JSON Schema, once
// it compiles, cut down to what Ollama's grammar handles (grammarSchema).
// The full schema, sent as is, can crash Ollama's model runner: the
// planner's 8 KiB goal maxLength made llama.cpp log "number of
// repetitions exceeds sane defaults" and the runner segfault (v0.17.4).
// A schema that does not compile is an error wrapping
// models.ErrInvalidRequest, and nothing is sent.
func formatSchema(raw json.RawMessage) (json.RawMessage, error) {
	if t := bytes.TrimSpace(raw); len(t) > 0 && t[0] == '"' {
		return raw, nil
	}
	if _, err := schema.Compile("ollama/format", "the output schema", raw); err != nil {
		return nil, fmt.Errorf("%w: %w", models.ErrInvalidRequest, err)
	}
	return grammarSchema(raw), nil
}

// grammarSchema returns the part of a tool's input schema that Ollama's
// grammar-constrained decoding handles: types, properties, required,
// items, enum, const, numeric bounds and small length bounds. Everything
// else (pattern, format, oneOf/anyOf/allOf, $ref, conditionals) is dropped,
// so the grammar admits a superset of the valid arguments; the tool
// sandbox validates the arguments against the full schema and the model
// sees any violation. Ollama rejects "pattern" and a oneOf beside
// properties outright ("invalid JSON schema in format"). A schema that is
// not a JSON object becomes {"type":"object"}.
func grammarSchema(raw json.RawMessage) json.RawMessage {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return json.RawMessage(`{"type":"object"}`)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return json.RawMessage(`{"type":"object"}`)
	}
	out, err := json.Marshal(sanitize(m))
	if err != nil {
		return json.RawMessage(`{"type":"object"}`)
	}
	return out
}

func sanitize(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		switch k {
		case "type", "enum", "const", "required", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "description":
			out[k] = v
		case "minLength", "maxLength":
			if n, ok := v.(float64); ok && n <= maxGrammarLength {
				out[k] = v
			}
		case "minItems", "maxItems":
			if n, ok := v.(float64); ok && n <= maxGrammarItems {
				out[k] = v
			}
		case "properties":
			props, ok := v.(map[string]any)
			if !ok {
				continue
			}
			clean := map[string]any{}
			for name, p := range props {
				if pm, ok := p.(map[string]any); ok {
					clean[name] = sanitize(pm)
				} else {
					clean[name] = map[string]any{}
				}
			}
			out[k] = clean
		case "items", "additionalProperties":
			switch x := v.(type) {
			case bool:
				out[k] = x
			case map[string]any:
				out[k] = sanitize(x)
			}
		}
	}
	return out
}
