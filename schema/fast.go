package schema

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"unicode/utf8"
)

// A fast schema is a schema of the plain kind tool manifests use (typed
// properties, required ones, no others, bounds, string enums), compiled
// to a check that reads the JSON bytes directly. The library checks
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

// maxFastDepth bounds how deep the fast check follows nested values;
// deeper ones go to the library.
const maxFastDepth = 64

// validRaw reports whether raw is certainly one JSON value (surrounded
// by nothing but whitespace) that meets f. It reads the bytes once,
// without decoding them, so a valid call's input or output costs no
// allocation. false means "not known": raw may be invalid JSON, break f,
// or hold something the check does not judge, such as a string with
// escapes where its length or value matters, or a key with escapes.
// A nil f accepts any value.
func (f *fastSchema) validRaw(raw []byte) bool {
	s := scanner{b: raw}
	s.space()
	if !s.value(f, 0) {
		return false
	}
	s.space()
	return s.i == len(s.b)
}

// scanner reads JSON from b at i.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next reports whether the byte at i is c, and if so moves past it.
func (s *scanner) next(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// value reads one value and checks it against f; a nil f accepts any
// value.
func (s *scanner) value(f *fastSchema, depth int) bool {
	if s.i >= len(s.b) || depth > maxFastDepth {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return s.object(f, depth)
	case c == '[':
		return s.array(f, depth)
	case c == '"':
		str, escaped, ok := s.str()
		return ok && (f == nil || f.validString(str, escaped))
	case c == 't':
		return s.literal("true") && (f == nil || f.is("boolean"))
	case c == 'f':
		return s.literal("false") && (f == nil || f.is("boolean"))
	case c == 'n':
		return s.literal("null") && (f == nil || f.is("null"))
	case c == '-' || c >= '0' && c <= '9':
		n, ok := s.number()
		return ok && (f == nil || f.validNumber(n))
	}
	return false
}

// is reports whether a value of type typ, other than a string or a
// number, meets f.
func (f *fastSchema) is(typ string) bool {
	return (f.typ == "" || f.typ == typ) && f.enum == nil
}

func (s *scanner) object(f *fastSchema, depth int) bool {
	if f != nil && (!f.is("object") || len(f.required) > 64) {
		return false
	}
	s.i++ // past {
	// seen has bit j set once required[j] was read.
	var seen uint64
	s.space()
	if !s.next('}') {
		for {
			s.space()
			if s.i >= len(s.b) || s.b[s.i] != '"' {
				return false
			}
			key, escaped, ok := s.str()
			if !ok || escaped {
				return false
			}
			s.space()
			if !s.next(':') {
				return false
			}
			s.space()
			var p *fastSchema
			if f != nil {
				p = f.props[string(key)]
				if p == nil && f.closed {
					return false
				}
				for j, r := range f.required {
					if r == string(key) {
						seen |= 1 << j
					}
				}
			}
			if !s.value(p, depth+1) {
				return false
			}
			s.space()
			if s.next('}') {
				break
			}
			if !s.next(',') {
				return false
			}
		}
	}
	return f == nil || seen == 1<<len(f.required)-1
}

func (s *scanner) array(f *fastSchema, depth int) bool {
	if f != nil && !f.is("array") {
		return false
	}
	s.i++ // [
	var items *fastSchema
	if f != nil {
		items = f.items
	}
	n := 0
	s.space()
	if !s.next(']') {
		for {
			s.space()
			if !s.value(items, depth+1) {
				return false
			}
			n++
			s.space()
			if s.next(']') {
				break
			}
			if !s.next(',') {
				return false
			}
		}
	}
	return f == nil || n >= f.minItems && (f.maxItems < 0 || n <= f.maxItems)
}

// str reads a string and returns its bytes between the quotes, and
// whether it has escapes (its bytes are then not its value). A string
// that is not valid UTF-8 is not judged (the decoders replace bad bytes).
func (s *scanner) str() (str []byte, escaped, ok bool) {
	s.i++ // "
	start, high := s.i, false
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			str = s.b[start:s.i]
			s.i++
			return str, escaped, !high || utf8.Valid(str)
		case c == '\\':
			escaped = true
			if s.i+1 >= len(s.b) {
				return nil, false, false
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					return nil, false, false
				}
				for _, h := range s.b[s.i+2 : s.i+6] {
					if !isHex(h) {
						return nil, false, false
					}
				}
				s.i += 6
			default:
				return nil, false, false
			}
		case c < 0x20:
			return nil, false, false
		default:
			high = high || c >= 0x80
			s.i++
		}
	}
	return nil, false, false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// literal reads word (true, false or null).
func (s *scanner) literal(word string) bool {
	if len(s.b)-s.i < len(word) || string(s.b[s.i:s.i+len(word)]) != word {
		return false
	}
	s.i += len(word)
	return true
}

// number reads a number as JSON writes it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() ([]byte, bool) {
	start := s.i
	s.next('-')
	switch {
	case s.next('0'):
	case s.digits() == 0:
		return nil, false
	}
	if s.next('.') && s.digits() == 0 {
		return nil, false
	}
	if s.next('e') || s.next('E') {
		if !s.next('+') {
			s.next('-')
		}
		if s.digits() == 0 {
			return nil, false
		}
	}
	return s.b[start:s.i], true
}

func (s *scanner) digits() int {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i - start
}

// validString reports whether the string whose JSON bytes (between the
// quotes) are raw certainly meets f. With escapes, only a string whose
// length and value do not matter is judged.
func (f *fastSchema) validString(raw []byte, escaped bool) bool {
	if f.typ != "" && f.typ != "string" {
		return false
	}
	bounded := f.minLen > 0 || f.maxLen >= 0
	if escaped {
		return !bounded && f.enum == nil
	}
	if bounded {
		n := utf8.RuneCount(raw)
		if n < f.minLen || f.maxLen >= 0 && n > f.maxLen {
			return false
		}
	}
	if f.enum != nil {
		for _, e := range f.enum {
			if e == string(raw) {
				return true
			}
		}
		return false
	}
	return true
}

// validNumber reports whether the number n (as JSON writes it) certainly
// meets f.
func (f *fastSchema) validNumber(n []byte) bool {
	if f.typ != "" && f.typ != "integer" && f.typ != "number" || f.enum != nil {
		return false
	}
	if bytes.ContainsAny(n, ".eE") {
		// Not judged exactly here: 1.0 is an integer, and a fraction
		// near a bound needs exact decimal arithmetic.
		return f.typ != "integer" && f.unbounded()
	}
	i, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil || i > maxExact || i < -maxExact {
		return false
	}
	v := float64(i)
	return (f.min == nil || v >= *f.min) && (f.max == nil || v <= *f.max) &&
		(f.exMin == nil || v > *f.exMin) && (f.exMax == nil || v < *f.exMax)
}

// unbounded reports whether f has no numeric bound (values that are not
// numbers meet any).
func (f *fastSchema) unbounded() bool {
	return f.min == nil && f.max == nil && f.exMin == nil && f.exMax == nil
}
