// Package schema compiles and applies JSON Schemas for keel: tool input
// and output schemas, and the schemas structured model output must meet.
// It wraps github.com/santhosh-tekuri/jsonschema/v6 (draft 2020-12 by
// default) with two rules of its own: a schema may not reference other
// documents (so a schema can never make keel read a file or fetch a URL),
// and a violation is reported as the single most specific failing field,
// as a JSON pointer and a message a model or a human can act on.
package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	gojson "github.com/goccy/go-json"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// errNoLoader refuses every $ref outside the schema itself: a schema
// must not make keel read files or fetch URLs.
var errNoLoader = errors.New("schemas may not reference other documents")

type noLoader struct{}

func (noLoader) Load(string) (any, error) { return nil, errNoLoader }

// Schema is a compiled JSON Schema.
type Schema struct {
	s    *jsonschema.Schema
	fast *fastSchema // nil unless the schema is of the plain kind (see fast.go)
}

// Compile compiles raw (draft 2020-12 unless the schema says otherwise),
// which must be a JSON object. id names the schema in errors and is part
// of its base URI ("keel:///" + id + ".json"); field names it in error
// messages, as "input_schema".
func Compile(id, field string, raw json.RawMessage) (*Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%s is not JSON: %w", field, err)
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, fmt.Errorf("%s must be a JSON Schema object", field)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noLoader{})
	url := "keel:///" + id + ".json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("%s does not compile: %w", field, err)
	}
	return &Schema{s: sch, fast: compileFast(doc)}, nil
}

// Violation is the most specific reason a value broke a schema.
type Violation struct {
	Pointer string // JSON pointer of the failing value; "" is the whole value
	Message string
}

var printer = message.NewPrinter(language.English)

// Validate checks raw against s. It returns a parse error for input that
// is not JSON, a *Violation naming the deepest failing field when raw
// breaks the schema, and nil, nil when raw is valid.
func (s *Schema) Validate(raw []byte) (*Violation, error) {
	if s.Valid(raw) {
		return nil, nil
	}
	v, err := decode(raw)
	if err != nil {
		return nil, err
	}
	err = s.s.Validate(v)
	if err == nil {
		return nil, nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return &Violation{Message: err.Error()}, nil
	}
	leaf := deepest(ve)
	loc := leaf.InstanceLocation
	// "required" and "additionalProperties" fail at the parent object;
	// point at the property itself, which is what the caller must fix.
	switch k := leaf.ErrorKind.(type) {
	case *kind.Required:
		if len(k.Missing) > 0 {
			loc = append(loc[:len(loc):len(loc)], k.Missing[0])
		}
	case *kind.AdditionalProperties:
		if len(k.Properties) > 0 {
			loc = append(loc[:len(loc):len(loc)], k.Properties[0])
		}
	}
	return &Violation{Pointer: jsonPointer(loc), Message: leaf.ErrorKind.LocalizedString(printer)}, nil
}

// Valid reports whether raw is certainly one JSON value that meets s,
// judged in one pass over its bytes for a schema of the plain kind (see
// fast.go). false means only "not known": Validate tells whether and why
// raw is invalid.
func (s *Schema) Valid(raw []byte) bool {
	return s.fast != nil && s.fast.validRaw(raw)
}

// IsJSON reports whether raw is certainly one JSON value, in one pass
// over its bytes. false means only "not known" (it is also false for a
// string that is not valid UTF-8, or for values nested very deeply).
func IsJSON(raw []byte) bool {
	return (*fastSchema)(nil).validRaw(raw)
}

// deepest returns the leaf error with the longest instance location, the
// first one on ties.
func deepest(ve *jsonschema.ValidationError) *jsonschema.ValidationError {
	if len(ve.Causes) == 0 {
		return ve
	}
	var best *jsonschema.ValidationError
	for _, c := range ve.Causes {
		if d := deepest(c); best == nil || len(d.InstanceLocation) > len(best.InstanceLocation) {
			best = d
		}
	}
	return best
}

var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// jsonPointer encodes tokens as an RFC 6901 JSON pointer.
func jsonPointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(pointerEscaper.Replace(t))
	}
	return b.String()
}

// decode reads one JSON value with numbers as json.Number, as the
// validator expects (jsonschema.UnmarshalJSON does the same with
// encoding/json). It uses goccy/go-json's decoder, which takes about half
// the time: every tool call pays this twice, for its input and output.
// That decoder panics on some malformed input (a long key of invalid
// UTF-8, found by FuzzFastAgrees); the value then comes from
// encoding/json, which has the last word on what is JSON.
func decode(raw []byte) (v any, err error) {
	if !json.Valid(raw) {
		// goccy's decoder also takes some malformed JSON (leading zeros,
		// raw control characters in strings, bad \u escapes).
		return decodeWith(json.NewDecoder(bytes.NewReader(raw)))
	}
	defer func() {
		if recover() != nil {
			v, err = decodeWith(json.NewDecoder(bytes.NewReader(raw)))
		}
	}()
	return decodeWith(gojson.NewDecoder(bytes.NewReader(raw)))
}

// decoder is what decode needs of a JSON decoder.
type decoder interface {
	UseNumber()
	Decode(any) error
	Token() (json.Token, error)
}

func decodeWith(dec decoder) (any, error) {
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one JSON value")
	}
	return v, nil
}
