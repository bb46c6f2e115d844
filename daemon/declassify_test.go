package daemon_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/daemon"
	"github.com/keel-runtime/keel/ipc/client"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models/scripted"
	"github.com/keel-runtime/keel/policy"
)

// labelEvents returns the data of run id's events of type typ, decoded
// as T, through run.get.
func labelEvents[T any](t *testing.T, c *client.Client, id keel.RunID, typ keel.EventType) []T {
	t.Helper()
	got, err := c.GetRun(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []T
	for _, ev := range got.Events {
		if ev.Type != typ {
			continue
		}
		var d T
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatalf("%s %s: %v", typ, ev.Data, err)
		}
		out = append(out, d)
	}
	return out
}

// contextLabels returns what run.get says run id's context holds.
func contextLabels(t *testing.T, c *client.Client, id keel.RunID) []string {
	t.Helper()
	got, err := c.GetRun(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels == nil {
		t.Fatalf("run.get of %s has no labels (null)", id)
	}
	return got.Labels
}

// TestLabelsSurface drives the labels of a live run through the real
// daemon, WebSocket and journal: run.start refuses a malformed label
// naming it; run.say journals the labels a person gives a message,
// which the context then holds (run.get, keel show) and policy.explain
// --run decides with (a rule on pii, not only private);
// run.declassify clears a label, journaled with who (the client's
// initialize name by default, "user" without one, or --by) and why,
// and refuses an unknown run, a label not held, a blank reason and a
// malformed label; the CLI does the same.
func TestLabelsSurface(t *testing.T) {
	t.Parallel()
	dir := noTools(t)
	userFile := policy.UserPath(dir)
	rules := "{\n  \"rules\": [\n    {\"action\": \"model\", \"labels\": [\"pii\"], \"decision\": \"deny\", \"reason\": \"no personal data to models\"},\n" +
		"    {\"action\": \"tool\", \"labels\": [\"pii\"], \"decision\": \"ask\"}\n  ]\n}\n"
	if err := os.WriteFile(userFile, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	step, called := asked(block)
	d := startDaemon(t, daemon.Config{DataDir: dir, Provider: scripted.New(nil, step)})
	c := dial(t, d.dir)
	ctx := context.Background()
	if _, err := c.Initialize(ctx, protocol.InitializeParams{Client: "ide-test/1"}); err != nil {
		t.Fatal(err)
	}

	// A malformed label of the run's inputs: refused, naming the field
	// and the label, and no run is made.
	_, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "g", Policy: keel.RunPolicy{Labels: []string{"private", "Bad Label"}}})
	pe := wantCode(t, err, protocol.CodeInvalidParams, "run.start with label \"Bad Label\"")
	if !strings.Contains(pe.Message, `"Bad Label"`) || !strings.Contains(string(pe.Data), `"policy.labels"`) {
		t.Errorf("run.start with a malformed label: %q data %s, want the label and the field policy.labels named", pe.Message, pe.Data)
	}
	if runs, err := c.ListRuns(ctx, 10); err != nil || len(runs) != 0 {
		t.Fatalf("after a refused run.start: %d runs, %v; want none", len(runs), err)
	}

	run, err := c.StartRun(ctx, protocol.RunStartParams{Goal: "summarize the HR notes", Policy: keel.RunPolicy{Labels: []string{"private"}}})
	if err != nil {
		t.Fatal(err)
	}
	<-called // the run is inside its first model step, and stays there
	if got := contextLabels(t, c, run.ID); !slices.Equal(got, []string{"private"}) {
		t.Errorf("context labels after start = %v, want [private]", got)
	}
	explainModel := func() protocol.PolicyExplainResult {
		t.Helper()
		r, err := client.Do(ctx, c, client.PolicyExplain, protocol.PolicyExplainParams{Kind: protocol.PolicyKindModel, Provider: "ollama", Model: "m", RunID: string(run.ID)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := explainModel(); r.Decision != "allow" {
		t.Errorf("explain model for a run holding [private] = %+v, want allow", r)
	}

	// run.say with labels: journaled on human.message (sorted, once
	// each); a malformed one refused.
	if _, err := client.Do(ctx, c, client.RunSay, protocol.RunSayParams{RunID: run.ID, Message: "Jane's salary is in hr.csv", Labels: []string{"pii", "pii"}}); err != nil {
		t.Fatalf("run.say with labels: %v", err)
	}
	_, err = client.Do(ctx, c, client.RunSay, protocol.RunSayParams{RunID: run.ID, Message: "x", Labels: []string{"PII"}})
	if pe := wantCode(t, err, protocol.CodeInvalidParams, "run.say label PII"); !strings.Contains(pe.Message, `"PII"`) {
		t.Errorf("run.say with label PII: %q, want the label named", pe.Message)
	}
	msgs := labelEvents[keel.HumanMessageData](t, c, run.ID, keel.EventHumanMessage)
	if len(msgs) != 1 || !slices.Equal(msgs[0].Labels, []string{"pii"}) {
		t.Fatalf("human.message events = %+v, want one labelled [pii]", msgs)
	}
	if got := contextLabels(t, c, run.ID); !slices.Equal(got, []string{"pii", "private"}) {
		t.Errorf("context labels after the message = %v, want [pii private]", got)
	}

	// policy.explain --run decides with the context's labels: pii now.
	if r := explainModel(); r.Decision != "deny" || r.Rule == nil || r.Rule.Line != 3 {
		t.Errorf("explain model for a run holding pii = %+v, want deny by the rule at line 3", r)
	}
	out, errOut, code := runCLI(ctx, d.dir, "policy", "explain", "model", "ollama/m", "--run", string(run.ID))
	if code != 0 || !strings.HasPrefix(out, "deny: ") || !strings.Contains(out, userFile+":3:") {
		t.Errorf("keel policy explain model --run = %d\n%s%s\nwant deny by %s:3", code, out, errOut, userFile)
	}
	out, errOut, code = runCLI(ctx, d.dir, "policy", "explain", "tool", "wordcount", "--run", string(run.ID))
	if code != 0 || !strings.HasPrefix(out, "ask: ") || !strings.Contains(out, userFile+":4:") {
		t.Errorf("keel policy explain tool --run = %d\n%s%s\nwant ask by %s:4", code, out, errOut, userFile)
	}
	out, errOut, code = runCLI(ctx, d.dir, "show", string(run.ID))
	if code != 0 || !strings.Contains(out, "\nlabels: {pii,private}\n") || !strings.Contains(out, "person says: Jane's salary is in hr.csv  labels {pii}") {
		t.Errorf("keel show = %d\n%s%s\nwant the context's labels and the message's", code, out, errOut)
	}

	// run.declassify's refusals: nothing is journaled.
	declassify := func(p protocol.RunDeclassifyParams) (protocol.RunDeclassifyResult, error) {
		return client.Do(ctx, c, client.RunDeclassify, p)
	}
	for _, tt := range []struct {
		name  string
		p     protocol.RunDeclassifyParams
		code  int
		field string
	}{
		{"unknown run", protocol.RunDeclassifyParams{RunID: "run_nope", Label: "pii", Reason: "r"}, protocol.CodeNotFound, ""},
		{"label not held", protocol.RunDeclassifyParams{RunID: run.ID, Label: "secret", Reason: "r"}, protocol.CodeInvalidParams, ""},
		{"empty reason", protocol.RunDeclassifyParams{RunID: run.ID, Label: "pii", Reason: "  "}, protocol.CodeInvalidParams, "reason"},
		{"malformed label", protocol.RunDeclassifyParams{RunID: run.ID, Label: "P I I", Reason: "r"}, protocol.CodeInvalidParams, "label"},
		{"no run", protocol.RunDeclassifyParams{Label: "pii", Reason: "r"}, protocol.CodeInvalidParams, "run_id"},
	} {
		_, err := declassify(tt.p)
		pe := wantCode(t, err, tt.code, "run.declassify "+tt.name)
		if tt.field != "" && !strings.Contains(string(pe.Data), `"`+tt.field+`"`) {
			t.Errorf("run.declassify %s: %q data %s, want field %s named", tt.name, pe.Message, pe.Data, tt.field)
		}
		if tt.name == "label not held" && !strings.Contains(pe.Message, "pii, private") {
			t.Errorf("run.declassify %s: %q, want what the context holds named", tt.name, pe.Message)
		}
	}
	if evs := labelEvents[keel.DeclassifyData](t, c, run.ID, keel.EventDeclassified); len(evs) != 0 {
		t.Fatalf("refused declassifications journaled %+v", evs)
	}

	// The round trip: who defaults to the client's initialize name.
	res, err := declassify(protocol.RunDeclassifyParams{RunID: run.ID, Label: "pii", Reason: "Jane agreed to share it"})
	if err != nil {
		t.Fatalf("run.declassify pii: %v", err)
	}
	want := keel.DeclassifyData{Label: "pii", By: "ide-test/1", Reason: "Jane agreed to share it", Labels: []string{"private"}}
	if res.Label != want.Label || res.By != want.By || res.Reason != want.Reason || !slices.Equal(res.Labels, want.Labels) {
		t.Errorf("run.declassify = %+v, want %+v", res, want)
	}
	if evs := labelEvents[keel.DeclassifyData](t, c, run.ID, keel.EventDeclassified); len(evs) != 1 || evs[0].By != want.By || evs[0].Reason != want.Reason || !slices.Equal(evs[0].Labels, want.Labels) {
		t.Errorf("labels.declassified events = %+v, want %+v", evs, want)
	}
	if got := contextLabels(t, c, run.ID); !slices.Equal(got, []string{"private"}) {
		t.Errorf("context labels after declassifying pii = %v, want [private]", got)
	}
	if r := explainModel(); r.Decision != "allow" {
		t.Errorf("explain model after declassifying pii = %+v, want allow", r)
	}

	// A client that did not initialize is recorded as "user".
	anon := dial(t, d.dir)
	if _, err := client.Do(ctx, anon, client.RunSay, protocol.RunSayParams{RunID: run.ID, Message: "more", Labels: []string{"pii"}}); err != nil {
		t.Fatal(err)
	}
	if res, err := client.Do(ctx, anon, client.RunDeclassify, protocol.RunDeclassifyParams{RunID: run.ID, Label: "pii", Reason: "again"}); err != nil || res.By != protocol.DeclassifiedByDefault {
		t.Errorf("run.declassify without initialize = %+v, %v; want by %q", res, err, protocol.DeclassifiedByDefault)
	}

	// The CLI: say --label, declassify --by, a declassify without a
	// reason is a usage error, and show lists who cleared what and why.
	out, errOut, code = runCLI(ctx, d.dir, "say", string(run.ID), "--label", "secret", "the", "key", "is", "in", "vault")
	if code != 0 {
		t.Fatalf("keel say --label secret = %d\n%s%s", code, out, errOut)
	}
	if msgs := labelEvents[keel.HumanMessageData](t, c, run.ID, keel.EventHumanMessage); len(msgs) != 3 || msgs[2].Content != "the key is in vault" || !slices.Equal(msgs[2].Labels, []string{"secret"}) {
		t.Errorf("human.message events = %+v, want the third \"the key is in vault\" labelled [secret]", msgs)
	}
	if out, errOut, code := runCLI(ctx, d.dir, "declassify", string(run.ID), "secret"); code != 2 {
		t.Errorf("keel declassify without --reason = %d\n%s%s\nwant 2 (usage)", code, out, errOut)
	}
	out, errOut, code = runCLI(ctx, d.dir, "declassify", string(run.ID), "secret", "--reason", "a test key", "--by", "ada")
	if code != 0 || !strings.Contains(out, "label secret cleared by ada; the context now holds {private}") {
		t.Errorf("keel declassify --by ada = %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := runCLI(ctx, d.dir, "declassify", string(run.ID), "secret", "--reason", "again"); code != 1 || !strings.Contains(errOut, "does not hold secret") {
		t.Errorf("keel declassify of a label not held = %d\n%s%s\nwant 1 naming it", code, out, errOut)
	}
	out, errOut, code = runCLI(ctx, d.dir, "show", string(run.ID))
	for _, want := range []string{"\nlabels: {private}\n", "label pii cleared by ide-test/1: Jane agreed to share it", "label secret cleared by ada: a test key",
		"person says: the key is in vault  labels {secret}"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("keel show = %d\n%s%s\nwant %q", code, out, errOut, want)
		}
	}
	if _, err := c.CancelRun(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
}
