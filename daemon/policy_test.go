package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/openai/openaitest"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/policy"
)

// TestPolicyFileDecidesToolCalls: the user layer's policy.json decides
// the tool calls of runs, against the real writefile tool, and an edit
// of the file while the daemon runs decides the next call. A deny: the
// run sees policy_denied and the file the tool would have written does
// not exist. An ask: the run waits for approval, and approving writes
// the file. A broken edit keeps the last good policy. Removing the rule:
// the next call runs at once.
func TestPolicyFileDecidesToolCalls(t *testing.T) {
	t.Parallel()
	dir := withTools(t, "writefile")
	userFile := policy.UserPath(dir)
	// An edit replaces the file whole, as editors save: a reader never
	// sees it half written.
	writePolicy := func(s string) {
		t.Helper()
		if err := os.WriteFile(userFile+".new", []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(userFile+".new", userFile); err != nil {
			t.Fatal(err)
		}
	}
	writePolicy(`{"rules": [{"action": "tool", "tool": "writefile", "decision": "deny", "reason": "no writing"}]}`)
	events := make(chan policy.Event, 16)
	write := func(id, name string) keel.ToolCall {
		return keel.ToolCall{ID: id, Name: "writefile", Arguments: json.RawMessage(`{"path":"` + name + `","content":"written"}`)}
	}
	p := scripted.New(nil,
		scripted.CallTools(write("c1", "denied.txt")), scripted.Answer("one"),
		scripted.CallTools(write("c2", "asked.txt")), scripted.Answer("two"),
		scripted.CallTools(write("c3", "allowed.txt")), scripted.Answer("three"))
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: p,
		ManagedPolicyFile: filepath.Join(t.TempDir(), "managed", "policy.json"),
		OnPolicy:          func(ev policy.Event) { events <- ev }})
	c := dial(t, d.dir)
	ctx := context.Background()
	out := t.TempDir()
	if s, e, code := runCLI(ctx, d.dir, "tools", "grant", "writefile", "fs:/workspace="+out); code != 0 {
		t.Fatalf("grant: code %d\n%s%s", code, s, e)
	}
	exists := func(name string) bool {
		_, err := os.Stat(filepath.Join(out, name))
		return !errors.Is(err, os.ErrNotExist)
	}
	nextPolicy := func(want uint64, wantErr bool) {
		t.Helper()
		select {
		case ev := <-events:
			if ev.Version != want || (ev.Err != nil) != wantErr {
				t.Fatalf("policy event = version %d, err %v; want version %d, error %v", ev.Version, ev.Err, want, wantErr)
			}
		case <-time.After(time.Minute):
			t.Fatal("no policy event within a minute of the edit")
		}
	}
	start := func(goal string) keel.RunID {
		t.Helper()
		run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: goal})
		if err != nil {
			t.Fatal(err)
		}
		return run.ID
	}

	// Deny: the tool never runs.
	id := start("write denied.txt")
	evs := follow(t, c, id)
	var res keel.ToolResultData
	for _, ev := range evs {
		if ev.Type == keel.EventToolResult {
			_ = json.Unmarshal(ev.Data, &res)
		}
	}
	if res.Error == nil || res.Error.Code != keel.ToolPolicyDenied || !strings.Contains(res.Error.Message, userFile) {
		t.Fatalf("tool.result error = %+v, want policy_denied naming %s", res.Error, userFile)
	}
	if evs[len(evs)-1].Type != keel.EventRunSucceeded {
		t.Errorf("run ended with %s, want succeeded (the model saw the denial)", evs[len(evs)-1].Type)
	}
	if exists("denied.txt") {
		t.Error("denied.txt exists: the denied tool ran")
	}

	// Ask, after a hot edit: the run waits, approving runs the tool.
	writePolicy(`{"rules": [{"action": "tool", "tool": "writefile", "decision": "ask"}]}`)
	nextPolicy(2, false)
	id = start("write asked.txt")
	waitEvent(t, d.dir, id, keel.EventApprovalAsked)
	if exists("asked.txt") {
		t.Fatal("asked.txt exists before the approval")
	}
	if s, e, code := runCLI(ctx, d.dir, "approve", string(id), "c2"); code != 0 {
		t.Fatalf("keel approve = %d: %s%s", code, s, e)
	}
	if evs := follow(t, c, id); evs[len(evs)-1].Type != keel.EventRunSucceeded || !exists("asked.txt") {
		t.Fatalf("approved run ended with %s, asked.txt written: %v", evs[len(evs)-1].Type, exists("asked.txt"))
	}

	// A broken edit keeps the ask in force; a good one replaces it.
	// env.describe and keel doctor say so, with the file.
	writePolicy(`{"rules": [`)
	nextPolicy(2, true)
	env, err := c.Describe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := env.Policy; p == nil || p.Version != 2 || !strings.Contains(p.Error, userFile) || !slices.Contains(p.Files, "user "+userFile) {
		t.Errorf("env.describe policy = %+v, want version 2, %s, and the error naming it", p, userFile)
	}
	if s, _, code := runCLI(ctx, d.dir, "doctor"); code == 0 || !strings.Contains(s, "BROKEN") || !strings.Contains(s, userFile) {
		t.Errorf("keel doctor with a broken policy file = %d:\n%s\nwant a failure naming %s", code, s, userFile)
	}
	writePolicy(`{}`)
	nextPolicy(3, false)
	if env, err := c.Describe(ctx); err != nil || env.Policy == nil || env.Policy.Error != "" || env.Policy.Version != 3 {
		t.Errorf("env.describe policy after the fix = %+v, %v; want version 3 and no error", env.Policy, err)
	}
	id = start("write allowed.txt")
	if evs := follow(t, c, id); evs[len(evs)-1].Type != keel.EventRunSucceeded || !exists("allowed.txt") {
		t.Fatalf("allowed run ended with %s, allowed.txt written: %v", evs[len(evs)-1].Type, exists("allowed.txt"))
	}
}

// TestBrokenPolicyFileStopsStart: a policy file that does not load at
// start names its file and line, and the daemon does not start: there is
// no last good policy to keep.
func TestBrokenPolicyFileStopsStart(t *testing.T) {
	t.Parallel()
	// noTools, not an empty dir: on an empty one the daemon installs the
	// bundled tools and starts compiling them before it reads the policy
	// (21 s of this test's 21 s under -race on the loaded machine).
	dir := noTools(t)
	if err := os.WriteFile(policy.UserPath(dir), []byte("{\n  \"rulez\": []\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := daemon.Run(ctx, daemon.Config{DataDir: dir, Addr: "127.0.0.1:0", Provider: scripted.New(nil),
		ManagedPolicyFile: filepath.Join(dir, "managed.json"), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Ready: func(protocol.DaemonInfo) { cancel() }}) // it started: the test fails
	var fe *policy.FileError
	if !errors.As(err, &fe) || fe.Line != 2 || !errors.Is(err, policy.ErrUnknownField) {
		t.Fatalf("Run with a broken policy.json = %v, want an unknown field at line 2", err)
	}
}

// TestPolicyRefusesCloudModel: a user policy with "cloud": false keeps
// a run allowed to use the cloud, on a route whose only target is a
// cloud model (an OpenAI-compatible server on loopback that records
// every request), from sending it anything: the run fails with the
// policy's explanation and the server receives no chat request.
func TestPolicyRefusesCloudModel(t *testing.T) {
	t.Parallel()
	srv := openaitest.New(t)
	dir := noTools(t)
	writeCloudRoute(t, dir, srv)
	if err := os.WriteFile(policy.UserPath(dir), []byte(`{"cloud": false}`), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: scripted.New(nil), ManagedPolicyFile: filepath.Join(t.TempDir(), "policy.json")})
	c := dial(t, d.dir)
	srv.Script(openaitest.Reply{Content: []string{"from the cloud"}})
	got := runToEnd(t, c, protocol.RunStartParams{Goal: "hello", Model: "default", MaxSteps: 2, Policy: keel.RunPolicy{AllowCloud: true}})
	if got.Run.Status != keel.RunFailed || !strings.Contains(got.Run.Error, "no cloud model calls") {
		t.Errorf("run = %s %q, want failed by the policy's cloud setting", got.Run.Status, got.Run.Error)
	}
	for _, r := range srv.Requests() {
		if r.Path == openaitest.ChatPath {
			t.Errorf("the cloud server received a chat request: %s", r.Body)
		}
	}
}

// TestPolicyPathAndURLRules: path and url rules match the arguments the
// real bundled tools' schemas mark as paths and URLs. A path rule names
// host paths: writefile's path, relative to its guest /workspace, is
// resolved through its grant and the host's symlinks, so a deny on one
// host directory stops a write into it, written directly or through a
// symlink, while a write beside it runs. A url rule matches fetch's url
// however it is written: the call waits for approval.
func TestPolicyPathAndURLRules(t *testing.T) {
	t.Parallel()
	dir := withTools(t, "writefile", "fetch")
	out, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(out, "secret"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("secret", filepath.Join(out, "link")); err != nil {
		t.Fatal(err)
	}
	rules, err := json.Marshal(map[string]any{"rules": []map[string]any{
		{"action": "tool", "path": filepath.ToSlash(out) + "/secret/**", "decision": "deny", "reason": "secrets stay"},
		{"action": "tool", "url": "https://api.example.test/v1/**", "decision": "ask"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(policy.UserPath(dir), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(id, name string) keel.ToolCall {
		return keel.ToolCall{ID: id, Name: "writefile", Arguments: json.RawMessage(`{"path":"` + name + `","content":"written"}`)}
	}
	fetch := keel.ToolCall{ID: "f1", Name: "fetch", Arguments: json.RawMessage(`{"url":"https://API.example.test:443/v1/items"}`)}
	p := scripted.New(nil,
		scripted.CallTools(write("w1", "secret/a.txt"), write("w2", "link/b.txt"), write("w3", "ok.txt")), scripted.Answer("done"),
		scripted.CallTools(fetch), scripted.Answer("fetched"))
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: p,
		ManagedPolicyFile: filepath.Join(t.TempDir(), "managed", "policy.json")})
	c := dial(t, d.dir)
	ctx := context.Background()
	if s, e, code := runCLI(ctx, d.dir, "tools", "grant", "writefile", "fs:/workspace="+out); code != 0 {
		t.Fatalf("grant: code %d\n%s%s", code, s, e)
	}

	// policy.explain sees the same paths and URLs as a run.
	for args, want := range map[string]string{`{"path": "link/x.txt", "content": ""}`: "deny", `{"path": "ok.txt", "content": ""}`: "allow"} {
		r, err := client.Do(ctx, c, client.PolicyExplain, protocol.PolicyExplainParams{Kind: protocol.PolicyKindTool, Tool: "writefile", Args: json.RawMessage(args)})
		if err != nil || r.Decision != want {
			t.Errorf("policy.explain writefile %s = %+v, %v; want %s", args, r, err, want)
		}
	}

	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "write three files"})
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]*keel.ToolError{}
	for _, ev := range follow(t, c, run.ID) {
		if ev.Type == keel.EventToolResult {
			var res keel.ToolResultData
			if err := json.Unmarshal(ev.Data, &res); err != nil {
				t.Fatal(err)
			}
			results[res.CallID] = res.Error
		}
	}
	for _, id := range []string{"w1", "w2"} {
		if e := results[id]; e == nil || e.Code != keel.ToolPolicyDenied || !strings.Contains(e.Message, "secrets stay") {
			t.Errorf("call %s error = %+v, want policy_denied by the path rule", id, e)
		}
	}
	if e, ok := results["w3"]; !ok || e != nil {
		t.Errorf("call w3 (ok.txt) error = %+v (reported: %v), want it to run", e, ok)
	}
	for name, want := range map[string]bool{"secret/a.txt": false, "secret/b.txt": false, "ok.txt": true} {
		if _, err := os.Stat(filepath.Join(out, name)); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", name, err == nil, want)
		}
	}

	run, err = c.StartRun(ctx, protocol.RunStartParams{Goal: "fetch the items"})
	if err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(t, d.dir, run.ID, keel.EventApprovalAsked)
	if !strings.Contains(string(ev.Data), "rule 2 of the user layer") {
		t.Errorf("approval.requested = %s, want the url rule in its policy decision", ev.Data)
	}
}

// TestPolicyNestedTargets: path and url rules match the paths and URLs a
// tool's schema marks inside arrays and nested objects, through the
// engine's decision in a run and through policy.explain. The real
// readfile module, with a sidecar manifest whose schema marks
// {"files": [path...], "target": {"url": uri}}: a run's call naming a
// denied host directory as the second element of files is denied; the
// nested url asks; a call naming more paths than the bound (256) is
// denied by the deny rule, not allowed by the allow rule.
func TestPolicyNestedTargets(t *testing.T) {
	t.Parallel()
	dir := withTools(t, "readfile")
	manifest, err := json.Marshal(map[string]any{
		"name": "readfile", "description": "Reads files.", "side_effects": "read_only",
		"input_schema": json.RawMessage(`{"type":"object","properties":{
			"files":{"type":"array","items":{"type":"string","format":"path"}},
			"target":{"type":"object","properties":{"url":{"type":"string","format":"uri"}}}}}`),
		"requests": map[string]any{"fs": []map[string]any{{"guest_path": "/workspace", "read_only": true}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tools", "readfile.manifest.json"), manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rules, err := json.Marshal(map[string]any{"rules": []map[string]any{
		{"action": "tool", "path": filepath.ToSlash(out) + "/secret/**", "decision": "deny", "reason": "secrets stay"},
		{"action": "tool", "url": "https://api.example.test/v1/**", "decision": "ask"},
		{"action": "tool", "tool": "readfile", "path": filepath.ToSlash(out) + "/**", "decision": "allow"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(policy.UserPath(dir), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	call := keel.ToolCall{ID: "r1", Name: "readfile", Arguments: json.RawMessage(`{"files":["ok.txt","secret/a.txt"]}`)}
	p := scripted.New(nil, scripted.CallTools(call), scripted.Answer("done"))
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: p,
		ManagedPolicyFile: filepath.Join(t.TempDir(), "managed", "policy.json")})
	c := dial(t, d.dir)
	ctx := context.Background()
	if s, e, code := runCLI(ctx, d.dir, "tools", "grant", "readfile", "fs:/workspace="+out); code != 0 {
		t.Fatalf("grant: code %d\n%s%s", code, s, e)
	}

	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "read two files"})
	if err != nil {
		t.Fatal(err)
	}
	var res keel.ToolResultData
	for _, ev := range follow(t, c, run.ID) {
		if ev.Type == keel.EventToolResult {
			if err := json.Unmarshal(ev.Data, &res); err != nil {
				t.Fatal(err)
			}
		}
	}
	if e := res.Error; e == nil || e.Code != keel.ToolPolicyDenied || !strings.Contains(e.Message, "secrets stay") {
		t.Errorf("call r1 error = %+v, want policy_denied by the path rule", e)
	}

	many := make([]string, 257)
	for i := range many {
		many[i] = `"f` + strconv.Itoa(i) + `.txt"`
	}
	for args, want := range map[string]string{
		`{"files":["ok.txt","secret/a.txt"]}`:                    "deny",
		`{"files":["ok.txt","b.txt"]}`:                           "allow",
		`{"target":{"url":"https://api.example.test/v1/items"}}`: "ask",
		`{"files":[` + strings.Join(many[1:], ",") + `]}`:        "allow",
		`{"files":[` + strings.Join(many, ",") + `]}`:            "deny",
	} {
		r, err := client.Do(ctx, c, client.PolicyExplain, protocol.PolicyExplainParams{Kind: protocol.PolicyKindTool, Tool: "readfile", Args: json.RawMessage(args)})
		if err != nil || r.Decision != want {
			t.Errorf("policy.explain readfile %.60s = %+v, %v; want %s", args, r, err, want)
		}
	}
}
