package cli_test

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cli"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/spf13/cobra"
)

// run runs the command line with no daemon (a data dir where none runs).
func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = cli.Main(context.Background(), append(args, "--data-dir", filepath.Join(t.TempDir(), "none")), &out, &errb)
	return out.String(), errb.String(), code
}

// TestUnknownSubcommand: a typo in a subcommand printed the group's help
// and exited 0; it must be a usage error naming the nearest commands.
func TestUnknownSubcommand(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args    []string
		suggest string // "" when nothing is near
	}{
		{[]string{"tool", "cal"}, "call"},
		{[]string{"tools", "cal"}, "call"},
		{[]string{"tools", "lst"}, "list"},
		{[]string{"tools", "frob"}, ""},
		{[]string{"models", "pul"}, "pull"},
		{[]string{"tols", "list"}, "tools"},
		{[]string{"atach"}, "attach"},
		{[]string{"policy", "shw"}, "show"},
		{[]string{"policy", "explain", "tol"}, "tool"},
	} {
		_, errs, code := run(t, tt.args...)
		if code != cli.ExitUsage || !strings.Contains(errs, "unknown command") {
			t.Errorf("keel %s: exit %d, stderr %q; want %d and unknown command", strings.Join(tt.args, " "), code, errs, cli.ExitUsage)
		}
		if tt.suggest != "" && !strings.Contains(errs, "Did you mean this?\n\t"+tt.suggest+"\n") {
			t.Errorf("keel %s: stderr %q, want it to suggest %q", strings.Join(tt.args, " "), errs, tt.suggest)
		}
	}
	// A group alone prints its help, successfully.
	if out, _, code := run(t, "tools"); code != cli.ExitOK || !strings.Contains(out, "Available Commands") {
		t.Errorf("keel tools: exit %d, want 0 and the help\n%s", code, out)
	}
}

// TestToolIsToolsAlias: `keel tool` is `keel tools` (keel tool list used
// to be an unknown-command help page).
func TestToolIsToolsAlias(t *testing.T) {
	t.Parallel()
	out, _, code := run(t, "tool", "--help")
	if code != cli.ExitOK || !strings.Contains(out, "keel tools [command]") || !strings.Contains(out, "Aliases:\n  tools, tool") {
		t.Errorf("keel tool --help: exit %d\n%s\nwant the help of keel tools, alias tool", code, out)
	}
	// `keel tool list` reaches the daemon (not running here): not a usage error.
	if _, errs, code := run(t, "tool", "list"); code != cli.ExitFailure || strings.Contains(errs, "unknown command") {
		t.Errorf("keel tool list with no daemon: exit %d, stderr %q; want %d (daemon not running)", code, errs, cli.ExitFailure)
	}
}

// TestVersion: keel --version and keel version print keel's version, the
// commit and the protocol (they printed the protocol alone).
func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--version"}, {"version"}} {
		out, _, code := run(t, args...)
		if code != cli.ExitOK || !strings.Contains(out, "keel "+keel.Version) || !strings.Contains(out, "commit ") || !strings.Contains(out, "protocol "+protocol.Version) {
			t.Errorf("keel %s: exit %d, %q; want keel's version, commit and protocol", args[0], code, out)
		}
	}
}

func TestUsageExitCodes(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"tools", "call", "wordcount", "{not json"},
		{"tools", "list", "--bogus"},
		{"run"},
		{"attach", "run_x", "--from", "0"},
		{"decide", "run_x", "call_1", "done", "--output", "{"},
	} {
		if _, errs, code := run(t, args...); code != cli.ExitUsage {
			t.Errorf("keel %s: exit %d, want %d (usage); stderr %q", strings.Join(args, " "), code, cli.ExitUsage, errs)
		}
	}
}

// TestExtraCommandArgsAreUsage: a command added by the composition root
// (keel daemon) with a wrong argument count exits ExitUsage, like the
// CLI's own commands (`keel daemon extra` exited 1).
func TestExtraCommandArgsAreUsage(t *testing.T) {
	t.Parallel()
	ran := false
	extra := &cobra.Command{Use: "daemon", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error { ran = true; return nil }}
	var out, errb bytes.Buffer
	code := cli.Main(context.Background(), []string{"daemon", "extra"}, &out, &errb, extra)
	if code != cli.ExitUsage || ran {
		t.Errorf("keel daemon extra: exit %d (ran %v), stderr %q; want %d without running", code, ran, errb.String(), cli.ExitUsage)
	}
}

// TestPolicyUsage: keel policy explain checks its arguments before it
// asks the daemon (none runs here): a usage error is 2, and a well
// formed command gets as far as the missing daemon (1).
func TestPolicyUsage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		code int
	}{
		{[]string{"policy", "explain", "tool"}, cli.ExitUsage},
		{[]string{"policy", "explain", "tool", "fetch", "not json"}, cli.ExitUsage},
		{[]string{"policy", "explain", "tool", "fetch", "[1]"}, cli.ExitUsage},
		{[]string{"policy", "explain", "tool", "fetch", "{}", "extra"}, cli.ExitUsage},
		{[]string{"policy", "explain", "model", "llama3.2"}, cli.ExitUsage},
		{[]string{"policy", "explain", "model", "ollama/"}, cli.ExitUsage},
		{[]string{"policy", "show", "extra"}, cli.ExitUsage},
		{[]string{"policy", "explain", "tool", "fetch", `{"url": "https://x.test/"}`}, cli.ExitFailure},
		{[]string{"policy", "explain", "model", "ollama/llama3.2", "--run", "r"}, cli.ExitFailure},
		{[]string{"policy", "show"}, cli.ExitFailure},
	} {
		if out, errs, code := run(t, tt.args...); code != tt.code {
			t.Errorf("keel %s: exit %d, want %d\n%s%s", strings.Join(tt.args, " "), code, tt.code, out, errs)
		}
	}
}
