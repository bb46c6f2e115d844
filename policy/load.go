package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/keel-runtime/keel"
)

// DefaultManagedPath is where the managed layer's file is on this
// system: /etc/keel/policy.json on Linux and other Unix systems,
// /Library/Application Support/keel/policy.json on macOS, and
// %ProgramData%\keel\policy.json on Windows (C:\ProgramData when the
// variable is unset). An administrator owns it; a user cannot write it.
func DefaultManagedPath() string {
	switch runtime.GOOS {
	case "darwin", "ios":
		return "/Library/Application Support/keel/policy.json"
	case "windows":
		pd := os.Getenv("ProgramData")
		if pd == "" {
			pd = `C:\ProgramData`
		}
		return filepath.Join(pd, "keel", "policy.json")
	}
	return "/etc/keel/policy.json"
}

// WorkspacePath is the workspace layer's file of the workspace at root:
// root/.keel/policy.json.
func WorkspacePath(root string) string { return filepath.Join(root, ".keel", "policy.json") }

// UserPath is the user layer's file in the data directory dir:
// dir/policy.json.
func UserPath(dir string) string { return filepath.Join(dir, "policy.json") }

// Paths names the files of the file-backed layers. An empty path is no
// file for that layer.
type Paths struct {
	Managed   string
	Workspace string
	User      string
}

func (ps Paths) each(f func(Layer, string)) {
	for l, p := range [...]string{LayerManaged: ps.Managed, LayerWorkspace: ps.Workspace, LayerUser: ps.User} {
		if p != "" {
			f(Layer(l), p)
		}
	}
}

// ReadFiles reads the layer files that exist; a missing file is no file
// (that layer has nothing to say). Any other read error fails, as does
// a file over MaxFileSize (*FileError wrapping ErrTooLarge).
func ReadFiles(ps Paths) ([]LayerFile, error) {
	var files []LayerFile
	var errs []error
	ps.each(func(l Layer, p string) {
		data, err := readFile(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			errs = append(errs, err)
		default:
			files = append(files, LayerFile{Layer: l, Name: p, Data: data})
		}
	})
	return files, errors.Join(errs...)
}

func readFile(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("policy: read %s: %w", p, err)
	}
	if len(data) > MaxFileSize {
		return nil, &FileError{File: p, Line: 1, Col: 1, Err: ErrTooLarge, Msg: fmt.Sprintf("more than %d bytes", MaxFileSize)}
	}
	return data, nil
}

// Load reads the layer files that exist and compiles them (Compile).
func Load(ps Paths, opts Options) (*Policy, error) {
	files, err := ReadFiles(ps)
	if err != nil {
		return nil, err
	}
	return Compile(opts, files...)
}

// RequireApprovalName is the name run-layer rules from RequireApproval
// go by in explanations.
const RequireApprovalName = "--require-approval"

// RequireApproval turns the side-effect classes of --require-approval
// into a run-layer file: one rule per class, asking before a tool call
// of that class. Pass the result to WithRun. An unknown class is an
// error wrapping keel.ErrInvalid.
func RequireApproval(classes ...keel.SideEffect) (LayerFile, error) {
	type rule struct {
		Action      string `json:"action"`
		SideEffects string `json:"side_effects"`
		Decision    string `json:"decision"`
		Reason      string `json:"reason"`
	}
	var doc struct {
		Rules []rule `json:"rules"`
	}
	doc.Rules = []rule{}
	for _, c := range classes {
		switch c {
		case keel.SideEffectReadOnly, keel.SideEffectIdempotentWrite, keel.SideEffectNonIdempotentWrite, keel.SideEffectExternal:
		default:
			return LayerFile{}, fmt.Errorf("%w: side-effect class %q: want read_only, idempotent_write, non_idempotent_write or external", keel.ErrInvalid, c)
		}
		doc.Rules = append(doc.Rules, rule{Action: "tool", SideEffects: string(c), Decision: "ask", Reason: "tool calls of side effect " + string(c) + " wait for approval"})
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return LayerFile{}, err
	}
	return LayerFile{Layer: LayerRun, Name: RequireApprovalName, Data: append(data, '\n')}, nil
}

// defaultFoldCase is whether paths fold case by default on this system.
func defaultFoldCase() bool {
	return runtime.GOOS == "darwin" || runtime.GOOS == "windows" || runtime.GOOS == "ios"
}

// DefaultOptions returns Options for this system: home as ~, and case
// folding where file systems usually ignore case (macOS, Windows).
func DefaultOptions(home string) Options {
	return Options{Home: strings.TrimRight(filepath.ToSlash(home), "/"), FoldCase: defaultFoldCase()}
}
