package openaitest

import (
	"encoding/json"
	"strings"
)

// instance returns a value valid for the JSON Schema schema, as the fake
// model's reply to a response format or its tool-call arguments. It knows
// const, enum, default, anyOf/oneOf (the first branch), allOf (merged
// objects), type (the first non-null of a list), the required properties
// of objects, minItems of arrays, minLength of strings and the bounds of
// numbers: enough for the schemas tools and formats use.
func instance(schema json.RawMessage) any {
	var s any
	if json.Unmarshal(schema, &s) != nil {
		return map[string]any{}
	}
	return gen(s)
}

func gen(v any) any {
	s, ok := v.(map[string]any)
	if !ok {
		return nil // true, or no schema: anything goes
	}
	if c, ok := s["const"]; ok {
		return c
	}
	if e, ok := s["enum"].([]any); ok && len(e) > 0 {
		return e[0]
	}
	if d, ok := s["default"]; ok {
		return d
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if alts, ok := s[k].([]any); ok && len(alts) > 0 {
			return gen(alts[0])
		}
	}
	if all, ok := s["allOf"].([]any); ok && len(all) > 0 {
		obj := map[string]any{}
		for _, sub := range all {
			if m, ok := gen(sub).(map[string]any); ok {
				for k, x := range m {
					obj[k] = x
				}
			}
		}
		return obj
	}
	typ, _ := s["type"].(string)
	if list, ok := s["type"].([]any); ok {
		for _, t := range list {
			if t, ok := t.(string); ok && t != "null" {
				typ = t
				break
			}
		}
	}
	if typ == "" {
		if _, ok := s["properties"]; ok {
			typ = "object"
		}
	}
	switch typ {
	case "object":
		obj := map[string]any{}
		props, _ := s["properties"].(map[string]any)
		required, _ := s["required"].([]any)
		for _, r := range required {
			if name, ok := r.(string); ok {
				obj[name] = gen(props[name])
			}
		}
		return obj
	case "array":
		n, _ := s["minItems"].(float64)
		arr := make([]any, int(n))
		for i := range arr {
			arr[i] = gen(s["items"])
		}
		return arr
	case "string":
		n, _ := s["minLength"].(float64)
		return strings.Repeat("x", max(1, int(n)))
	case "integer", "number":
		x := 1.0
		if lo, ok := s["minimum"].(float64); ok && x < lo {
			x = lo
		}
		if lo, ok := s["exclusiveMinimum"].(float64); ok && x <= lo {
			x = lo + 1
		}
		if hi, ok := s["maximum"].(float64); ok && x > hi {
			x = hi
		}
		if typ == "integer" {
			return int64(x)
		}
		return x
	case "boolean":
		return true
	case "null":
		return nil
	}
	return map[string]any{}
}
