// Command wordcount is an example keel tool: pure computation, no grants.
// It counts the words, lines and characters of a text.
//
// Build it with GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o
// wordcount.wasm (a reactor, for warm calls), or without -buildmode (a
// command); see ../README.md.
package main

import (
	"encoding/json"
	"strings"
	"unicode"

	"github.com/keel-runtime/keel/wasmtools/toolkit"
)

var manifest = toolkit.Manifest{
	Name:        "wordcount",
	Version:     "0.1.0",
	Description: "Count the words (runs of non-space characters), lines and characters (Unicode code points) of a text.",
	InputSchema: json.RawMessage(`{
		"type": "object",
		"properties": {
			"text": {"type": "string", "description": "The text to count."}
		},
		"required": ["text"],
		"additionalProperties": false
	}`),
	OutputSchema: json.RawMessage(`{
		"type": "object",
		"properties": {
			"words": {"type": "integer", "minimum": 0},
			"lines": {"type": "integer", "minimum": 0},
			"chars": {"type": "integer", "minimum": 0}
		},
		"required": ["words", "lines", "chars"],
		"additionalProperties": false
	}`),
	SideEffects: toolkit.ReadOnly,
}

type input struct {
	Text string `json:"text"`
}

type output struct {
	Words int `json:"words"`
	Lines int `json:"lines"`
	Chars int `json:"chars"`
}

var handler = toolkit.Typed(func(in input) (output, error) {
	return count(in.Text), nil
})

// init registers the tool for a reactor build (-buildmode=c-shared, how
// keel ships it), which never runs main; main serves a command build.
func init() { toolkit.Register(manifest, handler) }

func main() { toolkit.Main(manifest, handler) }

// count counts s in one pass, as strings.Fields, strings.Count and
// utf8.RuneCountInString would together (words are runs of runes that are
// not unicode.IsSpace; a byte that is not UTF-8 is one character). One
// pass matters here: Go's WebAssembly output runs such loops many times
// slower than native code, and this was a fifth of a warm call. A final
// line without a trailing newline still counts; the empty text has no
// lines.
func count(s string) output {
	var o output
	inWord := false
	for _, r := range s {
		o.Chars++
		if r == '\n' {
			o.Lines++
		}
		if unicode.IsSpace(r) {
			inWord = false
		} else if !inWord {
			inWord = true
			o.Words++
		}
	}
	if s != "" && !strings.HasSuffix(s, "\n") {
		o.Lines++
	}
	return o
}
