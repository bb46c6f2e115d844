package ipc

import (
	"fmt"
	"log/slog"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// TestRPCErrorUnusableTool: a tool file keel cannot run is its own error
// code, not invalid params (issue 14: a broken binary is not invalid
// input of the user's JSON), and the message says why.
func TestRPCErrorUnusableTool(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("wasmtools: t.wasm: keel cannot run this module: uses tail calls, which keel cannot bound: %w", keel.ErrUnusableTool)
	got := rpcError(slog.New(slog.DiscardHandler), protocol.MethodToolsInstall, err)
	if got.Code != protocol.CodeUnusableTool || got.Message != err.Error() {
		t.Fatalf("rpcError(%v) = %d %q, want %d and the error's message", err, got.Code, got.Message, protocol.CodeUnusableTool)
	}
}
