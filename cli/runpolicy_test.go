package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestRunPolicyFile: keel run --policy FILE sends the file as the run's
// own rules: the run's writefile is denied naming the file's line and
// column (run.start:3:5), a run without it is not; keel policy explain
// --run decides with the run's rules; a file that does not compile
// refuses the start with its line and column (invalid params on the
// wire) and starts no run; a missing file is a usage error.
func TestRunPolicyFile(t *testing.T) {
	t.Parallel()
	p := scripted.ByGoal(nil, func(goal string) []scripted.Step {
		return []scripted.Step{scripted.CallTool("writefile", `{"path": "notes.txt", "content": "x"}`), scripted.Answer("done")}
	})
	d := startDaemon(t, daemon.Config{}, p, map[string]string{})
	bg := context.Background()
	dir := t.TempDir()
	file := filepath.Join(dir, "run-policy.json")
	if err := os.WriteFile(file, []byte("{\n  \"rules\": [\n    {\"action\": \"tool\", \"tool\": \"writefile\", \"decision\": \"deny\", \"reason\": \"this run only reads\"}\n  ]\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	denied := func(id keel.RunID) *keel.ToolError {
		t.Helper()
		det, err := d.c.GetRun(bg, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range det.Events {
			if ev.Type == keel.EventToolResult {
				var res keel.ToolResultData
				if err := json.Unmarshal(ev.Data, &res); err != nil {
					t.Fatal(err)
				}
				if res.Error != nil && res.Error.Code == keel.ToolPolicyDenied {
					return res.Error
				}
			}
		}
		return nil
	}
	out, errs, code := d.keel(bg, "run", "--no-workspace", "--policy", file, "write the notes")
	if code != cli.ExitOK {
		t.Fatalf("keel run --policy: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	id := keel.RunID(strings.Fields(strings.TrimPrefix(out, "run "))[0])
	if te := denied(id); te == nil || !strings.Contains(te.Message, "rule 1 of the run layer (run.start:3:5): this run only reads") {
		t.Fatalf("the run's writefile = %+v, want denied by rule 1 of the run layer (run.start:3:5)", te)
	}
	out, errs, code = d.keel(bg, "policy", "explain", "tool", "writefile", `{"path": "x"}`, "--run", string(id))
	if code != cli.ExitOK || !strings.HasPrefix(out, "deny: rule 1 of the run layer (run.start:3:5)") {
		t.Errorf("keel policy explain --run: exit %d, stdout %q, stderr %q; want the run's deny", code, out, errs)
	}

	out, errs, code = d.keel(bg, "run", "--no-workspace", "write the notes again")
	if code != cli.ExitOK {
		t.Fatalf("keel run: exit %d, stderr %q", code, errs)
	}
	other := keel.RunID(strings.Fields(strings.TrimPrefix(out, "run "))[0])
	if te := denied(other); te != nil {
		t.Errorf("a run without --policy was denied: %+v", te)
	}
	if out, _, _ := d.keel(bg, "policy", "explain", "tool", "writefile", `{"path": "x"}`, "--run", string(other)); !strings.HasPrefix(out, "allow") {
		t.Errorf("keel policy explain --run for the run without rules = %q, want allow", out)
	}

	before, err := d.c.ListRuns(bg, 0)
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte("{\n  \"rules\": [\n    {\"action\": \"tool\", \"colour\": \"red\", \"decision\": \"deny\"}\n  ]\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := d.keel(bg, "run", "--detach", "--no-workspace", "--policy", bad, "g"); code == cli.ExitOK || !strings.Contains(errs, "policy.rules") || !strings.Contains(errs, "run.start:3:24") {
		t.Errorf("keel run --policy with an unknown field: exit %d, stderr %q; want a refusal naming policy.rules and run.start:3:24", code, errs)
	}
	_, err = d.c.StartRun(bg, protocol.RunStartParams{Goal: "g", Policy: keel.RunPolicy{Rules: json.RawMessage(`{"rules": 3}`)}})
	if pe, ok := errors.AsType[*protocol.Error](err); !ok || pe.Code != protocol.CodeInvalidParams || !strings.Contains(pe.Message, "policy.rules") {
		t.Errorf("run.start with bad rules = %v, want invalid params naming policy.rules", err)
	}
	if after, err := d.c.ListRuns(bg, 0); err != nil || len(after) != len(before) {
		t.Errorf("runs after refused starts: %d (%v), want %d", len(after), err, len(before))
	}
	never := filepath.Join(dir, "never.json")
	if err := os.WriteFile(never, []byte("{\"rules\": [\n  {\"action\": \"tool\", \"path\": \"relative\", \"decision\": \"deny\"}\n]}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := d.keel(bg, "run", "--no-workspace", "--policy", never, "write nothing"); code != cli.ExitOK || !strings.Contains(errs, "warning: --policy "+never+": run.start:2:") {
		t.Errorf("keel run --policy with a rule that can never match: exit %d, stderr %q; want a warning naming run.start:2", code, errs)
	}
	if _, errs, code := d.keel(bg, "run", "--policy", filepath.Join(dir, "missing.json"), "g"); code != cli.ExitUsage || !strings.Contains(errs, "--policy") {
		t.Errorf("keel run --policy MISSING: exit %d, stderr %q; want a usage error naming --policy", code, errs)
	}
}
