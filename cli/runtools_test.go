package cli_test

import (
	"context"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestRunTools: keel run --tools limits the tools a run may call (the
// run's policy); --tools= gives it none; a name that is not installed is
// a usage error and starts nothing. keel run had no way to say so.
func TestRunTools(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemon.Config{}, scripted.New(nil), map[string]string{})
	bg := context.Background()

	out, errs, code := d.keel(bg, "run", "--detach", "--tools=", "no tools at all")
	if code != cli.ExitOK {
		t.Fatalf("keel run --tools=: exit %d, stderr %q", code, errs)
	}
	det, err := d.c.GetRun(bg, keel.RunID(strings.TrimSpace(out)))
	if err != nil {
		t.Fatal(err)
	}
	if det.Run.Policy.Tools == nil || len(det.Run.Policy.Tools) != 0 {
		t.Errorf("run started with --tools= has policy tools %#v, want [] (none)", det.Run.Policy.Tools)
	}

	_, errs, code = d.keel(bg, "run", "--detach", "--tools", "wordcnt", "count words")
	if code != cli.ExitUsage || !strings.Contains(errs, `no tool named "wordcnt" is installed`) {
		t.Errorf("keel run --tools wordcnt: exit %d, stderr %q; want %d naming the tool", code, errs, cli.ExitUsage)
	}
	runs, err := d.c.ListRuns(bg, 10)
	if err != nil || len(runs) != 1 {
		t.Errorf("runs after a refused --tools: %d (%v), want only the first", len(runs), err)
	}
}
