// Command tally is a test tool for the crash harness: a non-idempotent
// write that counts its own executions. Each call appends one line, the
// call's key, to /workspace/tally.log, then sleeps sleep_ms before it
// returns, so that a harness can kill the daemon after the effect and
// before its result is journaled. Running a call twice leaves its key
// twice in the file: that is what the harness checks never happens.
package main

import (
	"encoding/json"
	"os"
	"strings"
	"time"

	"github.com/keel-runtime/keel/wasmtools/toolkit"
)

var manifest = toolkit.Manifest{
	Name:        "tally",
	Version:     "0.1.0",
	Description: "Record that the step named key happened (appends it to a log).",
	InputSchema: json.RawMessage(`{
		"type": "object",
		"properties": {
			"key": {"type": "string", "minLength": 1},
			"sleep_ms": {"type": "integer", "minimum": 0, "maximum": 5000}
		},
		"required": ["key"],
		"additionalProperties": false
	}`),
	SideEffects: toolkit.NonIdempotentWrite,
	Requests:    toolkit.Requests{FS: []toolkit.FSRequest{{GuestPath: "/workspace"}}},
}

type input struct {
	Key     string `json:"key"`
	SleepMS int    `json:"sleep_ms"`
}

var handler = toolkit.Typed(func(in input) (map[string]int, error) {
	f, err := os.OpenFile("/workspace/tally.log", os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, toolkit.FSError("tally.log", err, true)
	}
	if _, err := f.WriteString(in.Key + "\n"); err != nil {
		f.Close()
		return nil, toolkit.FSError("tally.log", err, true)
	}
	if err := f.Close(); err != nil {
		return nil, toolkit.FSError("tally.log", err, true)
	}
	time.Sleep(time.Duration(in.SleepMS) * time.Millisecond)
	b, err := os.ReadFile("/workspace/tally.log")
	if err != nil {
		return nil, toolkit.FSError("tally.log", err, true)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if line == in.Key {
			n++
		}
	}
	return map[string]int{"count": n}, nil
})

func init() { toolkit.Register(manifest, handler) }

func main() { toolkit.Main(manifest, handler) }
