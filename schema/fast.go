package schema

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A fast schema is a schema of the plain kind tool manifests use (typed
// properties, required ones, no others, bounds, string enums), compiled
// to a check that reads the decoded value directly. The library checks
// every number through fmt and math/big, which was most of a warm tool
// call's validation. The check only ever says "valid"; anything else
// (a violation, or a value it cannot judge exactly, such as a number
// with a fraction against a bound) goes to the library, which has the
// last word and writes the message. So a fast check may not accept what
// the library refuses, and FuzzFastAgrees checks that it never does.
type fastSchema struct {
	typ      string // "" for any type
	props    map[string]*fastSchema
	required []string
	closed   bool // additionalProperties: false
	min, max *float64
	exMin    *float64
	exMax    *float64
	minLen   int
	maxLen   int // -1: no bound
	enum     []string
	items    *fastSchema
	minItems int
	maxItems int // -1: no bound
}

// annotations are keywords that never make a value invalid.
var annotations = map[string]bool{"description": true, "title": true, "default": true, "examples": true, "$comment": true}

// compileFast returns the fast check of doc, or nil when doc uses
// anything it does not handle (the library then checks every value).
func compileFast(doc any) *fastSchema {
	m, ok := doc.(map[string]any)
	if !ok {
		return nil
	}
	if d, ok := m["$schema"]; ok && d != "https://json-schema.org/draft/2020-12/schema" {
		return nil
	}
	f := &fastSchema{maxLen: -1, maxItems: -1}
	for k, v := range m {
		switch {
		case annotations[k] || k == "$schema":
		case k == "type":
			t, ok := v.(string)
			if !ok {
				return nil // a list of types
			}
			switch t {
			case "object", "array", "string", "integer", "number", "boolean", "null":
				f.typ = t
			default:
				return nil
			}
		case k == "properties":
			ps, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			f.props = make(map[string]*fastSchema, len(ps))
			for name, p := range ps {
				if f.props[name] = compileFast(p); f.props[name] == nil {
					return nil
				}
			}
		case k == "required":
			rs, ok := v.([]any)
			if !ok {
				return nil
			}
			for _, r := range rs {
				s, ok := r.(string)
				if !ok {
					return nil
				}
				f.required = append(f.required, s)
			}
		case k == "additionalProperties":
			b, ok := v.(bool)
			if !ok {
				return nil // a schema for the others
			}
			f.closed = !b
		case k == "minimum" || k == "maximum" || k == "exclusiveMinimum" || k == "exclusiveMaximum":
			n, ok := exactNumber(v)
			if !ok {
				return nil
			}
			switch k {
			case "minimum":
				f.min = &n
			case "maximum":
				f.max = &n
			case "exclusiveMinimum":
				f.exMin = &n
			default:
				f.exMax = &n
			}
		case k == "minLength" || k == "maxLength" || k == "minItems" || k == "maxItems":
			n, ok := exactNumber(v)
			if !ok || n < 0 || n != math.Trunc(n) {
				return nil
			}
			switch k {
			case "minLength":
				f.minLen = int(n)
			case "maxLength":
				f.maxLen = int(n)
			case "minItems":
				f.minItems = int(n)
			default:
				f.maxItems = int(n)
			}
		case k == "enum":
			es, ok := v.([]any)
			if !ok || len(es) == 0 {
				return nil
			}
			for _, e := range es {
				s, ok := e.(string)
				if !ok {
					return nil
				}
				f.enum = append(f.enum, s)
			}
		case k == "items":
			if f.items = compileFast(v); f.items == nil {
				return nil
			}
		default:
			return nil
		}
	}
	return f
}

// maxExact bounds the integers a float64 holds exactly.
const maxExact = 1 << 53

// exactNumber returns a schema's number as a float64 when that is exact:
// an integer within ±2^53.
func exactNumber(v any) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil || i > maxExact || i < -maxExact {
		return 0, false
	}
	return float64(i), true
}

// valid reports whether v (as decode returns it) certainly meets f.
func (f *fastSchema) valid(v any) bool {
	switch v := v.(type) {
	case map[string]any:
		if f.typ != "" && f.typ != "object" {
			return false
		}
		for _, r := range f.required {
			if _, ok := v[r]; !ok {
				return false
			}
		}
		for k, pv := range v {
			p, ok := f.props[k]
			if !ok {
				if f.closed {
					return false
				}
				continue
			}
			if !p.valid(pv) {
				return false
			}
		}
		return f.enum == nil
	case []any:
		if f.typ != "" && f.typ != "array" || len(v) < f.minItems || f.maxItems >= 0 && len(v) > f.maxItems {
			return false
		}
		if f.items != nil {
			for _, e := range v {
				if !f.items.valid(e) {
					return false
				}
			}
		}
		return f.enum == nil
	case string:
		if f.typ != "" && f.typ != "string" {
			return false
		}
		if f.minLen > 0 || f.maxLen >= 0 {
			n := utf8.RuneCountInString(v)
			if n < f.minLen || f.maxLen >= 0 && n > f.maxLen {
				return false
			}
		}
		if f.enum != nil {
			for _, e := range f.enum {
				if e == v {
					return true
				}
			}
			return false
		}
		return true
	case json.Number:
		if f.typ != "" && f.typ != "integer" && f.typ != "number" || f.enum != nil {
			return false
		}
		s := string(v)
		if strings.ContainsAny(s, ".eE") {
			// Not judged exactly here: 1.0 is an integer, and a fraction
			// near a bound needs exact decimal arithmetic.
			return f.typ != "integer" && f.unbounded()
		}
		i, err := strconv.ParseInt(s, 10, 64)
		if err != nil || i > maxExact || i < -maxExact {
			return false
		}
		n := float64(i)
		return (f.min == nil || n >= *f.min) && (f.max == nil || n <= *f.max) &&
			(f.exMin == nil || n > *f.exMin) && (f.exMax == nil || n < *f.exMax)
	case bool:
		return (f.typ == "" || f.typ == "boolean") && f.enum == nil
	case nil:
		return (f.typ == "" || f.typ == "null") && f.enum == nil
	}
	return false
}

// unbounded reports whether f has no numeric bound (values that are not
// numbers meet any).
func (f *fastSchema) unbounded() bool {
	return f.min == nil && f.max == nil && f.exMin == nil && f.exMax == nil
}
