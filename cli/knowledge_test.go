package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
)

// TestKnowledgeCommands: keel knowledge add, search (text and --json),
// list, label and forget against a real daemon, and their usage errors.
func TestKnowledgeCommands(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemon.Config{}, scripted.New(nil), map[string]string{})
	ctx := context.Background()
	notes := t.TempDir()
	for name, body := range map[string]string{"a.md": "# A\n\nalpha bravo\n", "b.md": "# B\n\ncharlie\n", "pic.bin": "\x00\x01\x02binary"} {
		if err := os.WriteFile(filepath.Join(notes, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	keel := func(want int, args ...string) string {
		t.Helper()
		out, errs, code := d.keel(ctx, args...)
		if code != want {
			t.Fatalf("keel %s = %d, want %d:\n%s%s", strings.Join(args, " "), code, want, out, errs)
		}
		return out + errs
	}
	if out := keel(0, "knowledge", "list"); !strings.Contains(out, "empty") {
		t.Errorf("list of an empty store:\n%s", out)
	}
	out := keel(0, "knowledge", "add", notes, "--scope", "user", "--label", "private")
	if !strings.Contains(out, "user: 2 added") || !strings.Contains(out, "skipped "+filepath.Join(notes, "pic.bin")+": ") {
		t.Errorf("add:\n%s", out)
	}
	if out := keel(0, "knowledge", "search", "alpha"); !strings.HasPrefix(out, "[1] "+filepath.Join(notes, "a.md")+":") || !strings.Contains(out, "{private}") ||
		!strings.Contains(out, "    alpha bravo") {
		t.Errorf("search:\n%s", out)
	}
	var res protocol.KnowledgeSearchResult
	if err := json.Unmarshal([]byte(keel(0, "knowledge", "search", "charlie", "--json")), &res); err != nil || len(res.Hits) != 1 || res.Hits[0].Scope != "user" {
		t.Errorf("search --json = %+v, %v", res, err)
	}
	if out := keel(0, "knowledge", "list"); !strings.Contains(out, "user") || !strings.Contains(out, "2 docs") || !strings.Contains(out, filepath.Join(notes, "b.md")) {
		t.Errorf("list:\n%s", out)
	}
	if out := keel(0, "knowledge", "label", "user"); strings.TrimSpace(out) != "user -" {
		t.Errorf("label clearing: %q", out)
	}
	keel(2, "knowledge", "forget")
	keel(2, "knowledge", "forget", "x", "--scope", "user")
	keel(2, "run", "--remember", "--detach", "goal")
	keel(2, "run", "--scope", "user", "goal")
	if out := keel(1, "knowledge", "add", notes, "--scope", "team"); !strings.Contains(out, "want user, workspace:") {
		t.Errorf("add to a malformed scope:\n%s", out)
	}
	// Which runs may read which scope: the policy's say.
	ws := t.TempDir()
	if out := keel(0, "policy", "explain", "knowledge", "user", "--workspace", ws); !strings.HasPrefix(out, "deny: no knowledge rule matched; a run reads only its own scopes") {
		t.Errorf("policy explain knowledge user:\n%s", out)
	}
	if out := keel(0, "policy", "explain", "knowledge", "workspace:"+ws, "--workspace", ws); !strings.HasPrefix(out, "allow: no knowledge rule matched; a run may read its own scopes") {
		t.Errorf("policy explain knowledge of the workspace's own scope:\n%s", out)
	}
	if out := keel(0, "knowledge", "forget", "--scope", "user"); !strings.Contains(out, "forgot 2 documents") {
		t.Errorf("forget --scope:\n%s", out)
	}
	if out := keel(0, "knowledge", "search", "alpha"); !strings.Contains(out, "no match") {
		t.Errorf("search after forget:\n%s", out)
	}
}
