// Command writefile is an example keel tool that changes files: it writes
// a whole text file, or patches one by replacing an exact snippet, under
// the directory the host grants read-write at /workspace. keel installs it
// with no grants; the user grants a directory:
//
//	keel tools grant writefile fs:/workspace=~/notes
//
// Build it with GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o
// writefile.wasm; see ../README.md.
package main

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/keel-runtime/keel/wasmtools/toolkit"
)

// root is where the host mounts the granted directory.
const root = "/workspace"

// maxFileBytes bounds what one call writes or patches.
const maxFileBytes = 1 << 20

var manifest = toolkit.Manifest{
	Name:    "writefile",
	Version: "0.1.0",
	Description: "Write a UTF-8 text file in the workspace (content replaces the whole file, creating it and its directories), " +
		"or patch one: replace the exact text old, which must occur exactly once, with new. Paths are relative to the workspace root.",
	InputSchema: json.RawMessage(`{
		"type": "object",
		"properties": {
			"path": {"type": "string", "format": "path", "minLength": 1, "description": "File path relative to the workspace root."},
			"content": {"type": "string", "maxLength": 1048576, "description": "The whole new content of the file."},
			"old": {"type": "string", "minLength": 1, "description": "Text to replace; must occur exactly once."},
			"new": {"type": "string", "description": "Replacement for old."}
		},
		"required": ["path"],
		"oneOf": [{"required": ["content"]}, {"required": ["old", "new"]}],
		"additionalProperties": false
	}`),
	OutputSchema: json.RawMessage(`{
		"type": "object",
		"properties": {
			"path": {"type": "string"},
			"bytes": {"type": "integer", "minimum": 0},
			"created": {"type": "boolean"},
			"patched": {"type": "boolean"}
		},
		"required": ["path", "bytes", "created", "patched"],
		"additionalProperties": false
	}`),
	// Writing the same content twice leaves the same file; a patch applied
	// twice fails the second time (old is gone) rather than change more.
	SideEffects: toolkit.IdempotentWrite,
	Requests: toolkit.Requests{
		FS: []toolkit.FSRequest{{GuestPath: root, ReadOnly: false}},
	},
}

type input struct {
	Path    string  `json:"path"`
	Content *string `json:"content"`
	Old     string  `json:"old"`
	New     *string `json:"new"`
}

type output struct {
	Path    string `json:"path"`
	Bytes   int    `json:"bytes"`
	Created bool   `json:"created"`
	Patched bool   `json:"patched"`
}

var handler = toolkit.Typed(func(in input) (output, error) { return apply(root, in) })

// init registers the tool for a reactor build (-buildmode=c-shared, how
// keel ships it), which never runs main; main serves a command build.
func init() { toolkit.Register(manifest, handler) }

func main() { toolkit.Main(manifest, handler) }

// apply writes or patches in.Path under dir.
func apply(dir string, in input) (output, error) {
	name, err := toolkit.RootPath(root, in.Path)
	if err != nil {
		return output{}, err
	}
	full := filepath.Join(dir, filepath.FromSlash(name))
	if in.Content != nil {
		_, statErr := os.Stat(full)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return output{}, toolkit.FSError(in.Path, err, true)
		}
		if err := os.WriteFile(full, []byte(*in.Content), 0o644); err != nil {
			return output{}, toolkit.FSError(in.Path, err, true)
		}
		return output{Path: name, Bytes: len(*in.Content), Created: errors.Is(statErr, fs.ErrNotExist)}, nil
	}
	if in.New == nil || in.Old == "" {
		return output{}, toolkit.Errorf("bad_request", "give content, or old and new")
	}
	b, err := os.ReadFile(full)
	if err != nil {
		return output{}, toolkit.FSError(in.Path, err, true)
	}
	switch n := strings.Count(string(b), in.Old); n {
	case 0:
		return output{}, toolkit.Errorf("no_match", "the text to replace does not occur in %s", in.Path)
	case 1:
	default:
		return output{}, toolkit.Errorf("ambiguous", "the text to replace occurs %d times in %s; include more context so it occurs once", n, in.Path)
	}
	patched := strings.Replace(string(b), in.Old, *in.New, 1)
	if len(patched) > maxFileBytes {
		return output{}, toolkit.Errorf("too_large", "the patched file would exceed %d bytes", maxFileBytes)
	}
	if err := os.WriteFile(full, []byte(patched), 0o644); err != nil {
		return output{}, toolkit.FSError(in.Path, err, true)
	}
	return output{Path: name, Bytes: len(patched), Patched: true}, nil
}
