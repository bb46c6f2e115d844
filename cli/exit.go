package cli

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// Exit codes of Main. They are part of keel's interface (scripts branch
// on them), documented in docs/cli.md, and do not change.
const (
	// ExitOK: the command did what it was asked; a followed run succeeded.
	ExitOK = 0
	// ExitFailure: the command or the followed run failed, what it named
	// does not exist, or the daemon could not be reached.
	ExitFailure = 1
	// ExitUsage: the command line is wrong: an unknown command or flag, a
	// missing or extra argument, a value that is not JSON.
	ExitUsage = 2
	// ExitRefused: refused by policy or by a person: a tool call its
	// grants do not allow, or that was denied approval.
	ExitRefused = 3
	// ExitCancelled: the followed run (or a model pull) was cancelled.
	ExitCancelled = 4
	// ExitDetached: Ctrl-C on `keel run`, `keel attach` or `keel trace
	// --follow`: the CLI stopped following and the run goes on
	// (128+SIGINT, as shells say).
	ExitDetached = 130
)

// exitError carries a specific exit code out of a command. A nil err
// means the command already said what happened.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }

// exitCode maps an error a command returned to Main's exit code: an
// exitError says it; a tool call refused by its grants or denied by a
// person is ExitRefused; anything else the daemon answers (not found,
// invalid input, a failed tool) is ExitFailure. Usage errors are found
// by the CLI itself, before it asks the daemon.
func exitCode(err error) int {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	var pe *protocol.Error
	if errors.As(err, &pe) {
		var te keel.ToolError
		if pe.Code == protocol.CodeToolError && json.Unmarshal(pe.Data, &te) == nil &&
			(te.Code == keel.ToolPermissionDenied || te.Code == keel.ToolDenied) {
			return ExitRefused
		}
	}
	return ExitFailure
}
