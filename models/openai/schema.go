package openai

import "encoding/json"

// strictUnsupported are JSON Schema keywords OpenAI's strict mode does not
// accept.
var strictUnsupported = []string{
	"allOf", "oneOf", "not", "if", "then", "else",
	"dependentRequired", "dependentSchemas", "patternProperties", "propertyNames",
	"unevaluatedProperties", "unevaluatedItems", "minProperties", "maxProperties",
	"contains", "minContains", "maxContains", "prefixItems", "$dynamicRef",
}

// strictOK reports whether schema already meets the rules of OpenAI's
// strict mode (Structured Outputs): the root is an object, every object
// lists all its properties as required and sets additionalProperties to
// false, and no keyword outside the supported subset appears. Such a schema
// is sent with strict: true, under which OpenAI guarantees a matching
// reply; any other schema is sent as it is, without that guarantee, rather
// than rewritten into something the caller did not ask for.
func strictOK(schema json.RawMessage) bool {
	var root map[string]any
	if json.Unmarshal(schema, &root) != nil || !hasType(root, "object") {
		return false
	}
	return strictNode(root)
}

func strictNode(v any) bool {
	m, ok := v.(map[string]any)
	if !ok {
		return false // boolean schemas are not supported
	}
	for _, k := range strictUnsupported {
		if _, ok := m[k]; ok {
			return false
		}
	}
	props, hasProps := m["properties"].(map[string]any)
	if hasProps || hasType(m, "object") {
		if m["additionalProperties"] != false {
			return false
		}
		required := map[string]bool{}
		list, _ := m["required"].([]any)
		for _, r := range list {
			if s, ok := r.(string); ok {
				required[s] = true
			}
		}
		for name, sub := range props {
			if !required[name] || !strictNode(sub) {
				return false
			}
		}
	}
	if items, ok := m["items"]; ok && !strictNode(items) {
		return false
	}
	alts, _ := m["anyOf"].([]any)
	for _, a := range alts {
		if !strictNode(a) {
			return false
		}
	}
	for _, k := range []string{"$defs", "definitions"} {
		defs, _ := m[k].(map[string]any)
		for _, d := range defs {
			if !strictNode(d) {
				return false
			}
		}
	}
	return true
}

// hasType reports whether schema m declares type t, alone or in a list.
func hasType(m map[string]any, t string) bool {
	switch v := m["type"].(type) {
	case string:
		return v == t
	case []any:
		for _, x := range v {
			if x == t {
				return true
			}
		}
	}
	return false
}
