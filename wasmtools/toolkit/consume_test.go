package toolkit

import (
	"archive/zip"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// testVersion is the version the test's module proxy serves this
// checkout as.
const testVersion = "v0.0.0-test"

// TestConsumeFromAnotherModule is a tool author's first hour: a module of
// their own, outside this repository, requires the toolkit with `go get`
// (no replace directive, no workspace) and builds a reactor tool for
// wasip1.
//
// keel is not published and CI reaches no version control host, so the
// test serves this checkout the way a module proxy would: a GOPROXY file
// tree (file://) holding its go.mod and a module zip made from its files,
// as proxy.golang.org would serve a tagged release. Unlike a go.work file
// or a replace directive, that takes the same path as a published module:
// go get resolves a version, downloads and verifies the zip, and the
// consumer's go.mod and go.sum pin it. Every other module comes from the
// developer's own module download cache, itself a valid GOPROXY tree,
// into an empty module cache, so the test also checks what the toolkit
// costs its users: keel alone, nothing of the daemon's dependencies.
func TestConsumeFromAnotherModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module from a fresh module cache")
	}
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	env := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command(goBin, args...)
		cmd.Dir = dir
		cmd.Env = os.Environ()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	downloads := filepath.Join(env(root, "env", "GOMODCACHE"), "cache", "download")

	tmp := t.TempDir()
	proxy := filepath.Join(tmp, "proxy")
	writeModule(t, root, filepath.Join(proxy, "github.com", "keel-runtime", "keel", "@v"))

	// The tool, in its own module: the README's shout example.
	tool := filepath.Join(tmp, "shout")
	files := map[string]string{
		"go.mod":  "module example.com/shout\n\ngo 1.26.8\n",
		"main.go": shoutSource,
	}
	if err := os.Mkdir(tool, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(tool, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(extra []string, args ...string) {
		t.Helper()
		cmd := exec.Command(goBin, args...)
		cmd.Dir = tool
		cmd.Env = append(os.Environ(),
			"GOPROXY=file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(downloads),
			"GOMODCACHE="+filepath.Join(tmp, "modcache"),
			"GOFLAGS=-mod=mod -modcacherw",
			"GOWORK=off",
			"GOPRIVATE=", "GONOPROXY=",
			// keel is in no checksum database, and the toolkit
			// needs no other module.
			"GONOSUMDB=github.com/keel-runtime/keel",
			"GOTOOLCHAIN=local",
		)
		cmd.Env = append(cmd.Env, extra...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run(nil, "get", "github.com/keel-runtime/keel/wasmtools/toolkit@"+testVersion)
	run([]string{"GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0"}, "build", "-buildmode=c-shared", "-o", "shout.wasm", ".")

	mod, err := os.ReadFile(filepath.Join(tool, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mod), "github.com/keel-runtime/keel "+testVersion) || strings.Contains(string(mod), "replace") {
		t.Errorf("go.mod after go get:\n%s\nwant a require of keel %s and no replace", mod, testVersion)
	}
	gosum, err := os.ReadFile(filepath.Join(tool, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(gosum)) {
		if m, _, _ := strings.Cut(line, " "); m != "github.com/keel-runtime/keel" {
			t.Errorf("the tool's go.sum pins %s: the toolkit should need keel only\n%s", m, gosum)
		}
	}
	wasm, err := os.ReadFile(filepath.Join(tool, "shout.wasm"))
	if err != nil || !bytes.HasPrefix(wasm, []byte("\x00asm")) {
		t.Fatalf("shout.wasm is not a WebAssembly module (%v)", err)
	}
}

// writeModule writes the proxy files of the module at root, as version
// testVersion, into dir (a GOPROXY tree's MODULE/@v directory): list,
// .info, .mod and a module zip of the files git tracks, or would track
// (untracked but not ignored), so a build's leftovers stay out.
func writeModule(t *testing.T, root, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ls := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	ls.Dir = root
	out, err := ls.Output()
	if err != nil {
		t.Skipf("the module zip is made from git's file list, and git ls-files failed: %v", err)
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	prefix := "github.com/keel-runtime/keel@" + testVersion + "/"
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		fi, err := os.Lstat(filepath.Join(root, name))
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the work tree, or a link: not in a module zip
		}
		data, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		w, err := zw.Create(prefix + filepath.ToSlash(name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"list":                []byte(testVersion + "\n"),
		testVersion + ".info": []byte(`{"Version":"` + testVersion + `","Time":"2026-01-01T00:00:00Z"}`),
		testVersion + ".mod":  gomod,
		testVersion + ".zip":  buf.Bytes(),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// shoutSource is the example of examples/tools/README.md.
const shoutSource = `package main

import (
	"encoding/json"
	"strings"

	"github.com/keel-runtime/keel/wasmtools/toolkit"
)

var manifest = toolkit.Manifest{
	Name:        "shout",
	Version:     "0.1.0",
	Description: "Upper-case a text.",
	InputSchema: json.RawMessage(` + "`" + `{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}` + "`" + `),
	SideEffects: toolkit.ReadOnly,
}

type input struct {
	Text string ` + "`" + `json:"text"` + "`" + `
}

var handler = toolkit.Typed(func(in input) (map[string]string, error) {
	if in.Text == "" {
		return nil, toolkit.Errorf("empty", "nothing to shout")
	}
	return map[string]string{"text": strings.ToUpper(in.Text)}, nil
})

func init() { toolkit.Register(manifest, handler) }

func main() { toolkit.Main(manifest, handler) }
`
