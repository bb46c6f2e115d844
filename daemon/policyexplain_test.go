package daemon_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/openai/openaitest"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/policy"
)

// TestPolicyShowAndExplain: with a real policy.json in the data dir
// and a managed file that locks a setting, policy.explain over a real
// WebSocket denies a call of the tool the user file denies and names
// the rule's file:line, allows another tool, and refuses a bad kind;
// policy.show lists the rule and the lock with where they are written.
// `keel policy show` and `keel policy explain` print the same, a deny
// exiting 0 (the question was answered) and a malformed command 2.
func TestPolicyShowAndExplain(t *testing.T) {
	t.Parallel()
	dir := noTools(t)
	userFile := policy.UserPath(dir)
	user := "{\n  \"rules\": [\n    {\"action\": \"tool\", \"tool\": \"writefile\", \"args\": {\"/path\": \"secret*\"}, \"decision\": \"deny\", \"reason\": \"no secrets\"},\n" +
		"    {\"action\": \"model\", \"labels\": [\"private\"], \"decision\": \"ask\"}\n  ]\n}\n"
	if err := os.WriteFile(userFile, []byte(user), 0o600); err != nil {
		t.Fatal(err)
	}
	managedFile := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(managedFile, []byte("{\n  \"cloud\": false,\n  \"lock\": [\"cloud\"]\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	writeCloudRoute(t, dir, openaitest.New(t))
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: scripted.New(nil, scripted.Answer("done")), ManagedPolicyFile: managedFile})
	c := dial(t, d.dir)
	ctx := context.Background()

	explain := func(tool, args string) protocol.PolicyExplainResult {
		t.Helper()
		r, err := client.Do(ctx, c, client.PolicyExplain, protocol.PolicyExplainParams{Kind: protocol.PolicyKindTool, Tool: tool, Args: json.RawMessage(args)})
		if err != nil {
			t.Fatalf("policy.explain %s %s: %v", tool, args, err)
		}
		return r
	}
	where := userFile + ":3:5"
	r := explain("writefile", `{"path": "secret.txt"}`)
	if r.Decision != "deny" || !strings.Contains(r.Explanation, where) || !strings.Contains(r.Explanation, "no secrets") ||
		r.Rule == nil || r.Rule.Layer != "user" || r.Rule.File != userFile || r.Rule.Line != 3 || r.Version != 1 || r.Digest == "" {
		t.Fatalf("policy.explain writefile secret.txt = %+v, want deny by the rule at %s", r, where)
	}
	if r := explain("writefile", `{"path": "notes.txt"}`); r.Decision != "allow" || r.Rule != nil {
		t.Errorf("policy.explain writefile notes.txt = %+v, want allow by no rule", r)
	}
	explainModel := func(provider, model string, run keel.RunID) protocol.PolicyExplainResult {
		t.Helper()
		r, err := client.Do(ctx, c, client.PolicyExplain, protocol.PolicyExplainParams{Kind: protocol.PolicyKindModel, Provider: provider, Model: model, RunID: string(run)})
		if err != nil {
			t.Fatalf("policy.explain model %s/%s run %q: %v", provider, model, run, err)
		}
		return r
	}
	// The cloud provider of models.json: the managed cloud setting.
	if r := explainModel("cloud", openaitest.ChatModel, ""); r.Decision != "deny" || r.Setting == nil || r.Setting.Key != "cloud" ||
		r.Setting.File != managedFile || r.Setting.Line != 2 || !strings.Contains(r.Explanation, managedFile+":2:") {
		t.Errorf("policy.explain model cloud/%s = %+v, want deny by cloud at %s:2", openaitest.ChatModel, r, managedFile)
	}
	// A private run's model call carries the label private.
	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "private", Policy: keel.RunPolicy{Private: true}})
	if err != nil {
		t.Fatal(err)
	}
	follow(t, c, run.ID)
	if r := explainModel("ollama", "m", ""); r.Decision != "allow" {
		t.Errorf("policy.explain model ollama/m = %+v, want allow", r)
	}
	if r := explainModel("ollama", "m", run.ID); r.Decision != "ask" || r.Rule == nil || r.Rule.Line != 4 {
		t.Errorf("policy.explain model ollama/m for private run %s = %+v, want ask by the rule at line 4", run.ID, r)
	}

	_, err = client.Do(ctx, c, client.PolicyExplain, protocol.PolicyExplainParams{Kind: "egress", Tool: "fetch"})
	wantCode(t, err, protocol.CodeInvalidParams, "policy.explain kind egress")
	_, err = client.Do(ctx, c, client.PolicyExplain, protocol.PolicyExplainParams{Kind: protocol.PolicyKindTool, Tool: "x", Args: json.RawMessage(`[1]`)})
	wantCode(t, err, protocol.CodeInvalidParams, "policy.explain args [1]")
	_, err = client.Do(ctx, c, client.PolicyExplain, protocol.PolicyExplainParams{Kind: protocol.PolicyKindModel, Provider: "ollama", Model: "m", RunID: "nope"})
	wantCode(t, err, protocol.CodeNotFound, "policy.explain --run nope")

	show, err := client.Do(ctx, c, client.PolicyShow, protocol.PolicyShowParams{})
	if err != nil {
		t.Fatalf("policy.show: %v", err)
	}
	if len(show.Rules) != 2 || show.Rules[0].File != userFile || show.Rules[0].Line != 3 || show.Rules[0].Layer != "user" ||
		show.Rules[0].Decision != "deny" || !strings.Contains(show.Rules[0].Text, `"no secrets"`) {
		t.Errorf("policy.show rules = %+v, want the user file's rule at %s", show.Rules, where)
	}
	if len(show.Locks) != 1 || show.Locks[0].Key != "cloud" || show.Locks[0].File != managedFile || show.Locks[0].Line != 3 || show.Locks[0].Layer != "managed" {
		t.Errorf("policy.show locks = %+v, want cloud locked at %s:3", show.Locks, managedFile)
	}
	if len(show.Files) != 2 || show.Version != 1 || show.Digest != r.Digest {
		t.Errorf("policy.show = files %+v, version %d, digest %s; want 2 files, version 1, digest %s", show.Files, show.Version, show.Digest, r.Digest)
	}

	// The CLI.
	out, errOut, code := runCLI(ctx, d.dir, "policy", "explain", "tool", "writefile", `{"path": "secret.txt"}`)
	if code != 0 || !strings.HasPrefix(out, "deny: ") || !strings.Contains(out, where) {
		t.Errorf("keel policy explain tool writefile = %d\n%s%s\nwant exit 0 and a deny naming %s", code, out, errOut, where)
	}
	out, errOut, code = runCLI(ctx, d.dir, "policy", "explain", "model", "ollama/llama3.2")
	if code != 0 || !strings.HasPrefix(out, "allow: ") {
		t.Errorf("keel policy explain model ollama/llama3.2 = %d\n%s%s\nwant exit 0 and allow", code, out, errOut)
	}
	out, errOut, code = runCLI(ctx, d.dir, "policy", "show")
	if code != 0 || !strings.Contains(out, "rule 1 of the user layer ("+where+"): tool deny") || !strings.Contains(out, "lock: cloud (managed layer, "+managedFile+":3:") {
		t.Errorf("keel policy show = %d\n%s%s\nwant the rule at %s and the lock", code, out, errOut, where)
	}
	for _, args := range [][]string{
		{"policy", "explain", "tool"},
		{"policy", "explain", "tool", "writefile", "[1]"},
		{"policy", "explain", "model", "llama3.2"},
		{"policy", "explain", "egress", "x"},
	} {
		if out, errOut, code := runCLI(ctx, d.dir, args...); code != 2 {
			t.Errorf("keel %s = %d\n%s%s\nwant 2 (usage)", strings.Join(args, " "), code, out, errOut)
		}
	}
	if out, errOut, code := runCLI(ctx, d.dir, "policy", "explain", "model", "ollama/m", "--run", "nope"); code != 1 {
		t.Errorf("keel policy explain model --run nope = %d\n%s%s\nwant 1 (no such run)", code, out, errOut)
	}
}

// TestPolicyShowRunLayer: policy.show and policy.explain answer with
// the policy runs are decided by, the --require-approval run layer
// included, with no policy file at all.
func TestPolicyShowRunLayer(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemon.Config{Provider: scripted.New(nil), ManagedPolicyFile: filepath.Join(t.TempDir(), "policy.json"),
		RequireApproval: []keel.SideEffect{keel.SideEffectExternal}})
	c := dial(t, d.dir)
	ctx := context.Background()
	show, err := client.Do(ctx, c, client.PolicyShow, protocol.PolicyShowParams{})
	if err != nil {
		t.Fatalf("policy.show: %v", err)
	}
	if len(show.Rules) != 1 || show.Rules[0].Layer != "run" || show.Rules[0].File != policy.RequireApprovalName || show.Rules[0].Decision != "ask" {
		t.Errorf("policy.show rules = %+v, want the run layer's ask from %s", show.Rules, policy.RequireApprovalName)
	}
	out, errOut, code := runCLI(ctx, d.dir, "policy", "show")
	if code != 0 || !strings.Contains(out, "rule 1 of the run layer ("+policy.RequireApprovalName+":") {
		t.Errorf("keel policy show = %d\n%s%s\nwant the run layer's rule", code, out, errOut)
	}
}
