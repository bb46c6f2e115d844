package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// pointer is a compiled JSON pointer (RFC 6901) into a call's
// arguments: "/path", "/options/0/url". The empty pointer "" is the
// whole document.
type pointer struct {
	raw  string
	toks []string // unescaped reference tokens
}

// compilePointer compiles a JSON pointer; an error wraps ErrPattern.
func compilePointer(s string) (pointer, error) {
	p := pointer{raw: s}
	if s == "" {
		return p, nil
	}
	if s[0] != '/' {
		return p, fmt.Errorf("%w: JSON pointer %q must start with /", ErrPattern, s)
	}
	for _, t := range strings.Split(s[1:], "/") {
		for i := 0; i < len(t); i++ {
			if t[i] == '~' && (i+1 == len(t) || (t[i+1] != '0' && t[i+1] != '1')) {
				return p, fmt.Errorf("%w: JSON pointer %q: ~ must be ~0 or ~1", ErrPattern, s)
			}
		}
		p.toks = append(p.toks, strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~"))
	}
	return p, nil
}

// String returns the pointer as written.
func (p pointer) String() string { return p.raw }

var errJSON = errors.New("malformed JSON")

// lookup finds the value the pointer names in doc, a JSON document, and
// returns it as text: a string's contents, or a number, true, false or
// null as written. found is false when the pointer names nothing, or an
// object or array. err is set when doc is not well-formed JSON along
// the way. It does not allocate unless the string or a key on the way
// holds escapes.
func (p pointer) lookup(doc []byte) (text string, found bool, err error) {
	i := skipWS(doc, 0)
	for _, tok := range p.toks {
		if i >= len(doc) {
			return "", false, errJSON
		}
		switch doc[i] {
		case '{':
			i, found, err = findKey(doc, i, tok)
		case '[':
			i, found, err = findIndex(doc, i, tok)
		default:
			_, err = skipValue(doc, i)
			return "", false, err
		}
		if err != nil || !found {
			return "", false, err
		}
	}
	end, err := skipValue(doc, i)
	if err != nil {
		return "", false, err
	}
	switch doc[i] {
	case '{', '[':
		return "", false, nil
	case '"':
		raw := doc[i+1 : end-1]
		for _, c := range raw {
			if c == '\\' || c >= utf8.RuneSelf && !utf8.Valid(raw) {
				var s string
				if err := json.Unmarshal(doc[i:end], &s); err != nil {
					return "", false, errJSON
				}
				return s, true, nil
			}
		}
		return bytesString(raw), true, nil
	}
	return bytesString(doc[i:end]), true, nil
}

// findKey returns the offset of the value of key in the object at i.
func findKey(doc []byte, i int, key string) (int, bool, error) {
	i = skipWS(doc, i+1)
	if i < len(doc) && doc[i] == '}' {
		return 0, false, nil
	}
	for {
		if i >= len(doc) || doc[i] != '"' {
			return 0, false, errJSON
		}
		kend, err := skipString(doc, i)
		if err != nil {
			return 0, false, err
		}
		match, err := keyEquals(doc[i:kend], key)
		if err != nil {
			return 0, false, err
		}
		i = skipWS(doc, kend)
		if i >= len(doc) || doc[i] != ':' {
			return 0, false, errJSON
		}
		i = skipWS(doc, i+1)
		if match {
			return i, true, nil
		}
		if i, err = skipValue(doc, i); err != nil {
			return 0, false, err
		}
		i = skipWS(doc, i)
		if i >= len(doc) {
			return 0, false, errJSON
		}
		if doc[i] == '}' {
			return 0, false, nil
		}
		if doc[i] != ',' {
			return 0, false, errJSON
		}
		i = skipWS(doc, i+1)
	}
}

func keyEquals(quoted []byte, key string) (bool, error) {
	raw := quoted[1 : len(quoted)-1]
	for _, c := range raw {
		if c == '\\' {
			var s string
			if err := json.Unmarshal(quoted, &s); err != nil {
				return false, errJSON
			}
			return s == key, nil
		}
	}
	return string(raw) == key, nil
}

// findIndex returns the offset of element tok of the array at i.
func findIndex(doc []byte, i int, tok string) (int, bool, error) {
	if tok == "" || (len(tok) > 1 && tok[0] == '0') {
		_, err := skipValue(doc, i)
		return 0, false, err
	}
	n, perr := strconv.Atoi(tok)
	i = skipWS(doc, i+1)
	if i < len(doc) && doc[i] == ']' {
		return 0, false, nil
	}
	for k := 0; ; k++ {
		if k == n && perr == nil {
			if i >= len(doc) {
				return 0, false, errJSON
			}
			return i, true, nil
		}
		var err error
		if i, err = skipValue(doc, i); err != nil {
			return 0, false, err
		}
		i = skipWS(doc, i)
		if i >= len(doc) {
			return 0, false, errJSON
		}
		if doc[i] == ']' {
			return 0, false, nil
		}
		if doc[i] != ',' {
			return 0, false, errJSON
		}
		i = skipWS(doc, i+1)
	}
}

func skipWS(doc []byte, i int) int {
	for i < len(doc) && (doc[i] == ' ' || doc[i] == '\t' || doc[i] == '\n' || doc[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the offset just after the string starting at i.
func skipString(doc []byte, i int) (int, error) {
	for j := i + 1; j < len(doc); j++ {
		switch c := doc[j]; {
		case c == '\\':
			j++
		case c == '"':
			return j + 1, nil
		case c < 0x20:
			return 0, errJSON
		}
	}
	return 0, errJSON
}

// skipValue returns the offset just after the value starting at i. It
// checks structure, not every detail of numbers and escapes: Lookup is
// given arguments the caller already decoded or validated, and a
// malformed document is refused by the decoder the tool uses.
func skipValue(doc []byte, i int) (int, error) {
	if i >= len(doc) {
		return 0, errJSON
	}
	switch c := doc[i]; c {
	case '"':
		return skipString(doc, i)
	case '{', '[':
		close := byte('}')
		if c == '[' {
			close = ']'
		}
		i = skipWS(doc, i+1)
		if i < len(doc) && doc[i] == close {
			return i + 1, nil
		}
		for {
			var err error
			if c == '{' {
				if i >= len(doc) || doc[i] != '"' {
					return 0, errJSON
				}
				if i, err = skipString(doc, i); err != nil {
					return 0, err
				}
				i = skipWS(doc, i)
				if i >= len(doc) || doc[i] != ':' {
					return 0, errJSON
				}
				i = skipWS(doc, i+1)
			}
			if i, err = skipValue(doc, i); err != nil {
				return 0, err
			}
			i = skipWS(doc, i)
			if i >= len(doc) {
				return 0, errJSON
			}
			if doc[i] == close {
				return i + 1, nil
			}
			if doc[i] != ',' {
				return 0, errJSON
			}
			i = skipWS(doc, i+1)
		}
	default:
		j := i
		for j < len(doc) && (doc[j] >= 'a' && doc[j] <= 'z' || doc[j] >= '0' && doc[j] <= '9' || doc[j] == '-' || doc[j] == '+' || doc[j] == '.' || doc[j] == 'E') {
			j++
		}
		switch lit := bytesString(doc[i:j]); {
		case j == i:
			return 0, errJSON
		case lit == "true" || lit == "false" || lit == "null":
		case c == '-' || c >= '0' && c <= '9':
			if _, err := strconv.ParseFloat(lit, 64); err != nil {
				return 0, errJSON
			}
		default:
			return 0, errJSON
		}
		return j, nil
	}
}
