package toolkit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// SideEffect classifies what a tool may change outside itself. The values
// are those of keel.SideEffect; they are repeated here so that tools
// depend on nothing but this package and the standard library.
type SideEffect string

// Side-effect classes, from harmless to irreversible.
const (
	ReadOnly           SideEffect = "read_only"
	IdempotentWrite    SideEffect = "idempotent_write"
	NonIdempotentWrite SideEffect = "non_idempotent_write"
	External           SideEffect = "external"
)

// Manifest describes a tool to the host. Name must match the module's
// file name (NAME.wasm) and ^[a-z][a-z0-9_]{0,63}$. InputSchema is
// required; OutputSchema, when set, is enforced by the host on every
// result.
type Manifest struct {
	Name         string          `json:"name"`
	Version      string          `json:"version,omitempty"`
	Description  string          `json:"description"`
	InputSchema  json.RawMessage `json:"input_schema"`
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
	SideEffects  SideEffect      `json:"side_effects"`
	Requests     Requests        `json:"requests"`
}

// Requests is what a tool asks the host for beyond its own memory, the
// clock and randomness. A call fails with permission_denied before the
// tool starts when a request was not granted.
type Requests struct {
	FS      []FSRequest `json:"fs,omitempty"`
	Network []string    `json:"network,omitempty"`
	Env     []string    `json:"env,omitempty"`
}

// FSRequest asks for a directory at GuestPath (absolute, as the tool sees
// it).
type FSRequest struct {
	GuestPath string `json:"guest_path"`
	ReadOnly  bool   `json:"read_only"`
}

// Error is a tool's own structured failure, reported to the caller as
// {"error": {"message": ..., "code": ...}}. Code is a short snake_case
// word the caller may branch on, such as "not_found".
type Error struct {
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	if e.Code == "" {
		return e.Message
	}
	return e.Code + ": " + e.Message
}

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Handler runs one call. Returning an error reports it as the tool's
// structured error: an *Error keeps its code, any other error is sent
// with its message only.
type Handler func(input json.RawMessage) (any, error)

// Typed adapts a handler of concrete input and output types: the input
// JSON is decoded into In before h runs.
func Typed[In, Out any](h func(In) (Out, error)) Handler {
	return func(raw json.RawMessage) (any, error) {
		var in In
		if err := json.Unmarshal(raw, &in); err != nil {
			return nil, Errorf("invalid_input", "decode input: %v", err)
		}
		return h(in)
	}
}

// Main runs the tool convention for the running process and exits. It
// never returns.
func Main(m Manifest, h Handler) {
	os.Exit(Run(os.Args, os.Stdin, os.Stdout, os.Stderr, m, h))
}

// Run is Main with its process parts made explicit, for tests. It returns
// the exit code: 0 whenever a result or a tool error was written, 2 for
// bad arguments, 1 when stdout cannot be written.
func Run(args []string, stdin io.Reader, stdout, stderr io.Writer, m Manifest, h Handler) int {
	switch {
	case len(args) == 2 && args[1] == "--manifest":
		return write(stdout, stderr, m)
	case len(args) > 1:
		fmt.Fprintf(stderr, "usage: %s [--manifest] < input.json\n", m.Name)
		return 2
	}
	input, err := io.ReadAll(stdin)
	if err != nil {
		return write(stdout, stderr, errorResult(Errorf("io_error", "read input: %v", err)))
	}
	if len(bytes.TrimSpace(input)) == 0 {
		input = []byte("{}")
	}
	out, err := h(json.RawMessage(input))
	if err != nil {
		return write(stdout, stderr, errorResult(err))
	}
	return write(stdout, stderr, struct {
		Output any `json:"output"`
	}{out})
}

type errorBody struct {
	Error *Error `json:"error"`
}

func errorResult(err error) errorBody {
	var te *Error
	if !errors.As(err, &te) {
		te = &Error{Message: err.Error()}
	}
	return errorBody{te}
}

func write(stdout, stderr io.Writer, v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		// An output that cannot be encoded is the tool's own bug; report
		// it as a tool error rather than writing nothing.
		b, _ = json.Marshal(errorResult(Errorf("internal", "encode result: %v", err)))
	}
	b = append(b, '\n')
	if _, err := stdout.Write(b); err != nil {
		fmt.Fprintf(stderr, "write result: %v\n", err)
		return 1
	}
	return 0
}
