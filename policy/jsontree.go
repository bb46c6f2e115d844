package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// node is one JSON value of a policy file with where it starts, so that
// every error and every rule can name its file, line and column.
// encoding/json's Decoder walks the tokens (it reports syntax errors with
// a byte offset); unknown and duplicate fields are found here, by the
// code that knows the format, rather than by DisallowUnknownFields, whose
// error names the field but not where it is.
type node struct {
	kind  byte // '{', '[', 's' string, 'n' number, 'b' bool, '0' null
	start int  // byte offset of the value's first byte
	end   int  // byte offset just after it
	str   string
	b     bool
	keys  []member // objects, in file order
	elems []*node  // arrays
}

type member struct {
	name  string
	start int // offset of the key
	val   *node
}

// maxDepth bounds nesting; a policy file needs four levels.
const maxDepth = 32

type treeParser struct {
	data []byte
	dec  *json.Decoder
	file string
}

// parseTree reads data, one JSON value, into a tree. Errors are
// *FileError wrapping ErrSyntax.
func parseTree(file string, data []byte) (*node, error) {
	p := &treeParser{data: data, dec: json.NewDecoder(bytes.NewReader(data)), file: file}
	p.dec.UseNumber()
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, p.errAt(0, "", ErrSyntax, "the file is empty (write {} for a policy with no rules)")
	}
	n, err := p.value(0)
	if err != nil {
		return nil, err
	}
	after := p.next(int(p.dec.InputOffset()))
	if _, err := p.dec.Token(); err != io.EOF {
		return nil, p.errAt(after, "", ErrSyntax, "data after the top-level value")
	}
	return n, nil
}

// next returns the offset of the first byte of the next token at or
// after off: past white space and the separators , and :.
func (p *treeParser) next(off int) int {
	for off < len(p.data) {
		switch p.data[off] {
		case ' ', '\t', '\r', '\n', ',', ':':
			off++
		default:
			return off
		}
	}
	return off
}

func (p *treeParser) value(depth int) (*node, error) {
	if depth > maxDepth {
		return nil, p.errAt(p.next(int(p.dec.InputOffset())), "", ErrSyntax, "nested too deep")
	}
	start := p.next(int(p.dec.InputOffset()))
	tok, err := p.dec.Token()
	if err != nil {
		return nil, p.syntax(err)
	}
	n := &node{start: start}
	switch t := tok.(type) {
	case json.Delim:
		n.kind = byte(t)
		for p.dec.More() {
			if t == '{' {
				kstart := p.next(int(p.dec.InputOffset()))
				ktok, err := p.dec.Token()
				if err != nil {
					return nil, p.syntax(err)
				}
				name := ktok.(string)
				for _, m := range n.keys {
					if m.name == name {
						return nil, p.errAt(kstart, name, ErrDuplicateField, "field %q appears twice in this object (line %d has the first)", name, lineOf(p.data, m.start))
					}
				}
				v, err := p.value(depth + 1)
				if err != nil {
					return nil, err
				}
				n.keys = append(n.keys, member{name: name, start: kstart, val: v})
				continue
			}
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			n.elems = append(n.elems, v)
		}
		if _, err := p.dec.Token(); err != nil { // the closing delimiter
			return nil, p.syntax(err)
		}
	case string:
		n.kind, n.str = 's', t
	case json.Number:
		n.kind, n.str = 'n', string(t)
	case bool:
		n.kind, n.b = 'b', t
	case nil:
		n.kind = '0'
	}
	n.end = int(p.dec.InputOffset())
	return n, nil
}

func (p *treeParser) syntax(err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		off := int(se.Offset)
		if off > 0 {
			off-- // the offset is just past the offending byte
		}
		return p.errAt(off, "", ErrSyntax, "%s", strings.TrimPrefix(se.Error(), "json: "))
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF {
		return p.errAt(len(p.data), "", ErrSyntax, "unexpected end of file")
	}
	return p.errAt(p.next(int(p.dec.InputOffset())), "", ErrSyntax, "%v", err)
}

func (p *treeParser) errAt(off int, field string, kind error, format string, args ...any) error {
	line, col := position(p.data, off)
	return &FileError{File: p.file, Line: line, Col: col, Field: field, Err: kind, Msg: fmt.Sprintf(format, args...)}
}

// position converts a byte offset to a 1-based line and column (in
// characters).
func position(data []byte, off int) (line, col int) {
	off = min(max(off, 0), len(data))
	before := data[:off]
	line = bytes.Count(before, []byte{'\n'}) + 1
	lineStart := bytes.LastIndexByte(before, '\n') + 1
	return line, utf8.RuneCount(before[lineStart:]) + 1
}

func lineOf(data []byte, off int) int {
	l, _ := position(data, off)
	return l
}

// field returns the member of object n named name.
func (n *node) field(name string) (member, bool) {
	for _, m := range n.keys {
		if m.name == name {
			return m, true
		}
	}
	return member{}, false
}

func (n *node) kindName() string {
	switch n.kind {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 's':
		return "a string"
	case 'n':
		return "a number"
	case 'b':
		return "true or false"
	}
	return "null"
}
