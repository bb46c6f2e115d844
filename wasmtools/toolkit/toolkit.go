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
// depend on nothing of keel but this package.
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
	// Isolation is Pooled ("") or Fresh; see those constants.
	Isolation string `json:"isolation,omitempty"`
	// Labels are the labels the tool's output carries by declaration,
	// whatever it read: a tool that reads from a service holding
	// personal data declares "pii", say. Every result of the tool brings
	// them into the run's context, where they follow the data (see
	// docs/policy.md). Each is a label name: a lower-case letter, then
	// letters, digits, '-' or '_', at most 64 (the host refuses the
	// manifest otherwise). Default none.
	Labels []string `json:"labels,omitempty"`
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

// Manifest fields that are not part of the tool's contract but of how the
// host runs it.

// Isolation values for Manifest.Isolation.
const (
	// Pooled, the default, lets the host reuse an initialized instance of
	// a reactor build from one call to the next: package variables keep
	// their values between calls.
	Pooled = ""
	// Fresh makes the host start a new instance for every call, so
	// nothing a call leaves behind is seen by the next one. It costs the
	// module's instantiation and runtime start-up on every call.
	Fresh = "fresh"
)

// Main runs the tool convention for the running process and exits. It
// never returns. It serves a command build (no -buildmode); a reactor
// build (-buildmode=c-shared) never runs main and serves the tool given
// to [Register] instead.
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
	return writeBytes(stdout, stderr, append(respond(h, input), '\n'))
}

// respond runs h on input and encodes its result object.
func respond(h Handler, input []byte) []byte {
	if len(bytes.TrimSpace(input)) == 0 {
		input = []byte("{}")
	}
	out, err := h(json.RawMessage(input))
	if err != nil {
		return encode(errorResult(err))
	}
	b, err := json.Marshal(out)
	if err != nil {
		return encode(errorResult(Errorf("internal", "encode result: %v", err)))
	}
	r := make([]byte, 0, len(b)+11)
	r = append(r, `{"output":`...)
	r = append(r, b...)
	return append(r, '}')
}

// registered is the tool a reactor build serves; see Register.
var registered struct {
	m Manifest
	h Handler
}

// Register makes m and h the tool that a reactor build serves. Call it
// from an init function (or a package variable's initializer): a reactor
// runs package initialization when the host starts it, but never main.
// A tool that is also built as a command calls Main from main as well:
//
//	func init() { toolkit.Register(manifest, handler) }
//	func main() { toolkit.Main(manifest, handler) }
//
// In a reactor build the module exports, for the host:
//
//	keel_manifest() i64          the manifest JSON, as ptr<<32 | len
//	keel_alloc(size i32) i32     a buffer of size bytes for the input; it
//	                             stays valid until the next keel_alloc
//	keel_call(ptr, len i32) i64  runs the handler on the input at
//	                             ptr/len (inside the last keel_alloc
//	                             buffer) and returns the result object
//	                             {"output": ...} or {"error": ...} as
//	                             ptr<<32 | len, valid until the next call
//
// Register is not safe for concurrent use; a second call replaces the
// first.
func Register(m Manifest, h Handler) {
	registered.m, registered.h = m, h
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
	return writeBytes(stdout, stderr, append(encode(v), '\n'))
}

// encode marshals v. An output that cannot be encoded is the tool's own
// bug; it is reported as a tool error rather than as nothing.
func encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(errorResult(Errorf("internal", "encode result: %v", err)))
	}
	return b
}

func writeBytes(stdout, stderr io.Writer, b []byte) int {
	if _, err := stdout.Write(b); err != nil {
		fmt.Fprintf(stderr, "write result: %v\n", err)
		return 1
	}
	return 0
}
