// Command readfile is an example keel tool: it reads a text file under the
// read-only directory the host grants at /workspace.
//
// Build it with GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o
// readfile.wasm (a reactor, for warm calls), or without -buildmode (a
// command); see ../README.md.
package main

import (
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"unicode/utf8"

	"github.com/keel-runtime/keel/wasmtools/toolkit"
)

// root is where the host mounts the granted directory.
const root = "/workspace"

const (
	defaultMaxBytes = 4096
	maxMaxBytes     = 256 << 10
)

var manifest = toolkit.Manifest{
	Name:        "readfile",
	Version:     "0.1.0",
	Description: "Read a UTF-8 text file from the workspace. Paths are relative to the workspace root; content longer than max_bytes is cut and marked truncated.",
	InputSchema: json.RawMessage(`{
		"type": "object",
		"properties": {
			"path": {"type": "string", "format": "path", "minLength": 1, "description": "File path relative to the workspace root, such as notes/todo.txt."},
			"max_bytes": {"type": "integer", "minimum": 1, "maximum": 262144, "default": 4096, "description": "Read at most this many bytes."}
		},
		"required": ["path"],
		"additionalProperties": false
	}`),
	OutputSchema: json.RawMessage(`{
		"type": "object",
		"properties": {
			"path": {"type": "string"},
			"content": {"type": "string"},
			"truncated": {"type": "boolean"}
		},
		"required": ["path", "content", "truncated"],
		"additionalProperties": false
	}`),
	SideEffects: toolkit.ReadOnly,
	Requests: toolkit.Requests{
		FS: []toolkit.FSRequest{{GuestPath: root, ReadOnly: true}},
	},
}

type input struct {
	Path     string `json:"path"`
	MaxBytes int    `json:"max_bytes"`
}

type output struct {
	Path      string `json:"path"`
	Content   string `json:"content"`
	Truncated bool   `json:"truncated"`
}

var handler = toolkit.Typed(func(in input) (output, error) {
	return readFile(os.DirFS(root), in)
})

// init registers the tool for a reactor build (-buildmode=c-shared, how
// keel ships it), which never runs main; main serves a command build.
func init() { toolkit.Register(manifest, handler) }

func main() { toolkit.Main(manifest, handler) }

// readFile reads in.Path from fsys, whose root is the workspace.
func readFile(fsys fs.FS, in input) (output, error) {
	name, err := toolkit.RootPath(root, in.Path)
	if err != nil {
		return output{}, err
	}
	maxBytes := in.MaxBytes
	if maxBytes <= 0 {
		maxBytes = defaultMaxBytes
	}
	maxBytes = min(maxBytes, maxMaxBytes)

	f, err := fsys.Open(name)
	if err != nil {
		return output{}, toolkit.FSError(in.Path, err, false)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return output{}, toolkit.FSError(in.Path, err, false)
	} else if st.IsDir() {
		return output{}, toolkit.Errorf("is_directory", "%s is a directory, not a file", in.Path)
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(maxBytes)+1))
	if err != nil {
		return output{}, toolkit.FSError(in.Path, err, false)
	}
	truncated := len(b) > maxBytes
	if truncated {
		b = b[:maxBytes]
		// Do not split a multi-byte character at the cut.
		for i := 0; i < utf8.UTFMax-1 && len(b) > 0 && !utf8.Valid(b); i++ {
			b = b[:len(b)-1]
		}
	}
	if !utf8.Valid(b) || bytes.IndexByte(b, 0) >= 0 {
		return output{}, toolkit.Errorf("not_text", "%s is not a UTF-8 text file", in.Path)
	}
	return output{Path: name, Content: string(b), Truncated: truncated}, nil
}
