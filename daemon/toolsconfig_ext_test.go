package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestToolsFileLimitsCalls: a daemon whose tools.json lowers the output
// limit applies it to a real tool's call and declares it in env.describe.
func TestToolsFileLimitsCalls(t *testing.T) {
	t.Parallel()
	dir := withTools(t)
	if err := os.WriteFile(filepath.Join(dir, daemon.ToolsConfigFile), []byte(`{"limits":{"output_bytes":16}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "workspace"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "workspace", "story.txt"), []byte(strings.Repeat("Once upon a time. ", 10)), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: scripted.New(nil)})
	c := dial(t, d.dir)
	// env.describe declares the limits in effect, tools.json's included.
	env, err := c.Describe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := env.ToolLimits.MaxOutputBytes; got != 16 {
		t.Errorf("env.describe tool_limits.max_output_bytes = %d, want tools.json's 16", got)
	}
	_, err = c.CallTool(context.Background(), "readfile", json.RawMessage(`{"path":"story.txt"}`))
	var pe *protocol.Error
	var te keel.ToolError
	if !errors.As(err, &pe) || json.Unmarshal(pe.Data, &te) != nil || te.Code != keel.ToolResourceExhausted || !strings.Contains(te.Message, "16 bytes") {
		t.Fatalf("readfile under tools.json's 16-byte output limit: %v; want resource_exhausted naming 16 bytes", err)
	}
}
