// Command hostile is a test fixture for package wasmtools: a keel tool
// that misbehaves on request. It is built for wasip1 by the package's
// TestMain.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/keel-runtime/keel/wasmtools/toolkit"
)

var manifest = toolkit.Manifest{
	Name:        "hostile",
	Version:     "0.0.1",
	Description: "Misbehaves on request, to test the sandbox.",
	InputSchema: json.RawMessage(`{
		"type": "object",
		"properties": {
			"mode": {"type": "string"},
			"path": {"type": "string"},
			"data": {"type": "string"},
			"size": {"type": "integer"}
		},
		"required": ["mode"]
	}`),
	OutputSchema: json.RawMessage(`{"type": "object"}`),
	SideEffects:  toolkit.External,
}

type input struct {
	Mode string `json:"mode"`
	Path string `json:"path"`
	Data string `json:"data"`
	Size int64  `json:"size"`
}

var keep [][]byte

// calls counts the calls this instance has served, to show whether state
// survives from one call to the next.
var calls int

// The package's TestMain builds this both as a command and as a reactor.
func init() { toolkit.Register(manifest, handler) }

func main() { toolkit.Main(manifest, handler) }

var handler = toolkit.Typed(func(in input) (any, error) {
	calls++
	switch in.Mode {
	case "counter":
		return map[string]any{"calls": calls}, nil
	case "ok":
		return map[string]any{"ok": true}, nil
	case "fail":
		return nil, toolkit.Errorf("on_purpose", "failed as asked")
	case "loop":
		for {
		}
	case "sleep":
		time.Sleep(time.Hour)
		return map[string]any{"slept": true}, nil
	case "oom":
		for {
			b := make([]byte, 8<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1 // touch every page
			}
			keep = append(keep, b)
		}
	case "stackbomb":
		return map[string]any{"depth": recurse(0)}, nil
	case "bigalloc":
		keep = append(keep, make([]byte, 1<<30))
		return map[string]any{"allocated": len(keep[0])}, nil
	case "spew":
		line := []byte(strings.Repeat("x", 1023) + "\n")
		for {
			if _, err := os.Stdout.Write(line); err != nil {
				os.Exit(0)
			}
		}
	case "panic":
		panic("boom")
	case "exit":
		fmt.Fprintln(os.Stderr, "exiting with 3")
		os.Exit(3)
	case "garbage":
		fmt.Println("this is not JSON")
		os.Exit(0)
	case "two":
		fmt.Println(`{"output":{}}`)
		return map[string]any{}, nil
	case "badoutput":
		return []int{1, 2}, nil // the output schema wants an object
	case "read":
		b, err := os.ReadFile(in.Path)
		if err != nil {
			return nil, toolkit.Errorf("read", "%v", err)
		}
		return map[string]any{"content": string(b)}, nil
	case "write":
		if err := os.WriteFile(in.Path, []byte(in.Data), 0o644); err != nil {
			return nil, toolkit.Errorf("write", "%v", err)
		}
		return map[string]any{"written": len(in.Data)}, nil
	case "fill":
		// Writes 4 KiB at a time until a write is refused, and reports
		// success anyway, as a tool that ignores errors would.
		f, err := os.Create(in.Path)
		if err != nil {
			return nil, toolkit.Errorf("fill", "%v", err)
		}
		defer f.Close()
		chunk := make([]byte, 4096)
		written := 0
		for {
			n, err := f.Write(chunk)
			written += n
			if err != nil {
				return map[string]any{"written": written, "error": err.Error()}, nil
			}
		}
	case "truncate":
		// Makes the file size bytes long without writing them.
		err := os.Truncate(in.Path, in.Size)
		return map[string]any{"error": fmt.Sprint(err)}, nil
	case "seekwrite", "pwrite":
		// Writes one byte size bytes into a new file: after a seek, or
		// with pwrite.
		f, err := os.Create(in.Path)
		if err != nil {
			return nil, toolkit.Errorf(in.Mode, "%v", err)
		}
		defer f.Close()
		if in.Mode == "pwrite" {
			_, err = f.WriteAt([]byte("x"), in.Size)
		} else if _, err = f.Seek(in.Size, 0); err == nil {
			_, err = f.Write([]byte("x"))
		}
		return map[string]any{"error": fmt.Sprint(err)}, nil
	case "symlink":
		if err := os.Symlink(in.Data, in.Path); err != nil {
			return nil, toolkit.Errorf("symlink", "%v", err)
		}
		return map[string]any{"linked": true}, nil
	case "ls":
		entries, err := os.ReadDir(in.Path)
		if err != nil {
			return nil, toolkit.Errorf("ls", "%v", err)
		}
		names := []string{}
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return map[string]any{"names": names}, nil
	case "env":
		env := os.Environ()
		sort.Strings(env)
		return map[string]any{"env": env, "args": os.Args}, nil
	}
	return nil, toolkit.Errorf("bad_mode", "unknown mode %q", in.Mode)
})

// recurse calls itself until the stack gives out; the frame carries a
// buffer so each level takes real stack.
//
//go:noinline
func recurse(n int) int {
	var pad [64]byte
	pad[n%len(pad)] = byte(n)
	return recurse(n+1) + int(pad[(n+1)%len(pad)])
}
