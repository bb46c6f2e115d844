package cli_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/policy"
)

// TestRunWorkspace: keel run names its working directory as the run's
// workspace, --workspace DIR another (made absolute), --no-workspace
// none; a workspace whose policy file does not load refuses the start
// with the file and line. keel policy show and explain --workspace use
// the workspace's layer.
func TestRunWorkspace(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemon.Config{}, scripted.New(nil, scripted.Repeat(scripted.Block())), map[string]string{})
	bg := context.Background()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	ws := t.TempDir()
	file := policy.WorkspacePath(ws)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(`{"rules": [{"action": "tool", "tool": "writefile", "decision": "deny", "reason": "read-only project"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(wd, ws)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, wd},
		{[]string{"--workspace", rel}, ws},
		{[]string{"--no-workspace"}, ""},
	} {
		args := append([]string{"run", "--detach"}, tc.args...)
		out, errs, code := d.keel(bg, append(args, "a goal")...)
		if code != cli.ExitOK {
			t.Fatalf("keel %s: exit %d, stderr %q", strings.Join(args, " "), code, errs)
		}
		det, err := d.c.GetRun(bg, keel.RunID(strings.TrimSpace(out)))
		if err != nil {
			t.Fatal(err)
		}
		if det.Run.Workspace != tc.want {
			t.Errorf("keel %s: run workspace %q, want %q", strings.Join(args, " "), det.Run.Workspace, tc.want)
		}
		if _, err := d.c.CancelRun(bg, det.Run.ID); err != nil {
			t.Fatal(err)
		}
	}

	if _, errs, code := d.keel(bg, "run", "--detach", "--workspace", ws, "--no-workspace", "g"); code != cli.ExitUsage {
		t.Errorf("--workspace with --no-workspace: exit %d (%q), want usage", code, errs)
	}

	out, errs, code := d.keel(bg, "policy", "show", "--workspace", rel)
	if code != cli.ExitOK || !strings.Contains(out, "file: workspace "+file) || !strings.Contains(out, "rule 1 of the workspace layer ("+file+":1:") {
		t.Errorf("keel policy show --workspace: exit %d, stdout %q, stderr %q; want the workspace file and its rule", code, out, errs)
	}
	if out, _, _ := d.keel(bg, "policy", "show"); strings.Contains(out, file) {
		t.Errorf("keel policy show without --workspace shows the workspace file: %q", out)
	}
	out, errs, code = d.keel(bg, "policy", "explain", "tool", "writefile", `{"path": "x"}`, "--workspace", ws)
	if code != cli.ExitOK || !strings.HasPrefix(out, "deny: rule 1 of the workspace layer") {
		t.Errorf("keel policy explain --workspace: exit %d, stdout %q, stderr %q; want the workspace's deny", code, out, errs)
	}

	if err := os.WriteFile(file, []byte("{\n  \"rules\": 3\n}"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errs, code = d.keel(bg, "run", "--detach", "--workspace", ws, "g")
	if code == cli.ExitOK || !strings.Contains(errs, file+":2:") {
		t.Errorf("keel run in a workspace with a broken policy: exit %d, stderr %q; want a failure naming %s:2", code, errs, file)
	}
}
