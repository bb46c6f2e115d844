package recall_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/knowledge"
	"github.com/keel-runtime/keel/policy"
	"github.com/keel-runtime/keel/recall"
)

// openIndex opens a knowledge store in a new database file.
func openIndex(t *testing.T) *knowledge.Index {
	t.Helper()
	ix, err := knowledge.Open(context.Background(), filepath.Join(t.TempDir(), "keel.db"), knowledge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ix.Close() })
	return ix
}

// write writes files (name → content) under dir.
func write(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// addDir indexes files written in a new directory into scope.
func addDir(t *testing.T, ix *knowledge.Index, scope knowledge.Scope, labels []string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	write(t, dir, files)
	if _, err := ix.Add(context.Background(), []string{dir}, knowledge.AddOptions{Scope: scope, Labels: labels, AddedBy: "test"}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// spans records the spans a tool writes.
type spans struct {
	mu  sync.Mutex
	all []keel.Span
}

func (s *spans) StartSpan(_ context.Context, sp keel.Span) error { return nil }
func (s *spans) FinishSpan(_ context.Context, sp keel.Span) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, sp)
	return nil
}

func compile(t *testing.T, doc string) *policy.Policy {
	t.Helper()
	p, err := policy.Compile(policy.Options{}, policy.LayerFile{Layer: policy.LayerUser, Name: "policy.json", Data: []byte(doc)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type output struct {
	Query  string   `json:"query"`
	Scopes []string `json:"scopes"`
	Hits   []struct {
		N     int    `json:"n"`
		Cite  string `json:"cite"`
		Scope string `json:"scope"`
		Text  string `json:"text"`
	} `json:"hits"`
}

// TestToolScopes: a run reads its workspace's scope with no policy at
// all, and not the user's or another workspace's; a knowledge rule lets
// it read the user's, whose private label then labels the output; the
// retrieval span hangs under the call's span with the query, the scopes
// and the hits; the output cites each hit [n] source:lines on a line of
// its own.
func TestToolScopes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ix := openIndex(t)
	const ws = "/home/ada/proj"
	addDir(t, ix, recall.WorkspaceScope(ws), nil, map[string]string{"design.md": "# Design\n\nThe flux capacitor needs 1.21 gigawatts.\n"})
	addDir(t, ix, recall.ScopeUser, []string{"private"}, map[string]string{"diary.md": "# Diary\n\nThe flux capacitor is my secret.\n"})
	addDir(t, ix, recall.WorkspaceScope("/home/ada/other"), nil, map[string]string{"x.md": "The flux capacitor of another project.\n"})
	run := keel.Run{ID: "run_1", Workspace: ws}
	var pol *policy.Policy
	var polMu sync.Mutex
	tr := &spans{}
	tool, err := recall.NewTool(recall.Config{Index: ix, Tracer: tr,
		Runs: func(_ context.Context, id keel.RunID) (keel.Run, error) {
			if id != run.ID {
				return keel.Run{}, keel.ErrNotFound
			}
			return run, nil
		},
		Policy: func(keel.Run) (*policy.Policy, uint64) { polMu.Lock(); defer polMu.Unlock(); return pol, 1 }})
	if err != nil {
		t.Fatal(err)
	}
	call := func(args string) (output, keel.Touched, error) {
		t.Helper()
		tc := keel.Touched{}
		out, err := tool.Call(ctx, keel.ToolInvocation{Run: run.ID, Step: 2, CallID: "c1", SpanID: "span_call", Name: recall.ToolName, Args: json.RawMessage(args), Touched: &tc})
		var o output
		if err == nil {
			if jerr := json.Unmarshal(out, &o); jerr != nil {
				t.Fatalf("output %s: %v", out, jerr)
			}
			for i, line := range strings.Split(string(out), "\n")[1:] {
				if i < len(o.Hits) && !strings.Contains(line, `"cite":"[`) {
					t.Errorf("output line %d %q: want one hit a line", i+2, line)
				}
			}
		}
		return o, tc, err
	}

	if !tool.Offers(ctx, run, recall.ToolName) {
		t.Errorf("Offers = false for a run whose workspace scope holds a document")
	}
	if tool.Offers(ctx, keel.Run{ID: "run_2", Workspace: "/elsewhere"}, recall.ToolName) {
		t.Errorf("Offers = true for a run that may read no scope holding anything")
	}
	o, tc, err := call(`{"query":"flux capacitor"}`)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Scopes, []string{"workspace:" + ws}) || len(o.Hits) != 1 || !strings.Contains(o.Hits[0].Text, "gigawatts") {
		t.Errorf("no policy: searched %v, hits %+v; want the workspace's only", o.Scopes, o.Hits)
	}
	if !strings.HasPrefix(o.Hits[0].Cite, "[1] ") || !strings.Contains(o.Hits[0].Cite, "design.md:") {
		t.Errorf("cite = %q, want [1] .../design.md:LINES", o.Hits[0].Cite)
	}
	if len(tc.Labels) != 0 {
		t.Errorf("labels of the workspace's hits = %v, want none", tc.Labels)
	}
	var te *keel.ToolError
	if _, _, err := call(`{"query":"flux","scope":"user"}`); !errors.As(err, &te) || te.Code != keel.ToolPolicyDenied || !strings.Contains(te.Message, "own scopes") {
		t.Errorf("scope user with no rule: err = %v, want policy_denied explaining own scopes", err)
	}
	if _, _, err := call(`{"query":"flux","scope":"nonsense"}`); !errors.As(err, &te) || te.Code != keel.ToolInvalidInput {
		t.Errorf("a malformed scope: err = %v, want invalid_input", err)
	}
	if _, _, err := call(`{"scope":"user"}`); !errors.As(err, &te) || te.Code != keel.ToolInvalidInput {
		t.Errorf("no query: err = %v, want invalid_input", err)
	}

	polMu.Lock()
	pol = compile(t, `{"rules":[{"action":"knowledge","scope":"user","decision":"allow"}]}`)
	polMu.Unlock()
	o, tc, err = call(`{"query":"flux capacitor","limit":10}`)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Scopes, []string{"user", "workspace:" + ws}) || len(o.Hits) != 2 {
		t.Errorf("user allowed: searched %v, %d hits; want user and the workspace, 2 hits", o.Scopes, len(o.Hits))
	}
	if !slices.Contains(tc.Labels, "private") {
		t.Errorf("labels of hits from the private user scope = %v, want private", tc.Labels)
	}
	if len(tc.Paths) != 2 {
		t.Errorf("touched paths = %v, want the two files hit", tc.Paths)
	}

	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.all) != 2 {
		t.Fatalf("%d retrieval spans, want one per search that ran (2)", len(tr.all))
	}
	sp := tr.all[1]
	var at recall.RetrievalAttrs
	if err := json.Unmarshal(sp.Attrs, &at); err != nil {
		t.Fatal(err)
	}
	if sp.Kind != keel.SpanRetrieval || sp.ParentID != "span_call" || sp.RunID != run.ID || sp.Step != 2 || sp.Status != keel.SpanOK ||
		at.Query != "flux capacitor" || len(at.Scopes) != 2 || len(at.Hits) != 2 || at.Hits[0].Score == 0 || at.CallID != "c1" {
		t.Errorf("retrieval span %+v attrs %s", sp, sp.Attrs)
	}
	// The span carries its hits' labels, so that an export of it keeps
	// a private search's query and hits home.
	if !slices.Contains(at.Labels, "private") {
		t.Errorf("retrieval span's labels = %v, want private (a hit from the private user scope)", at.Labels)
	}
	var first recall.RetrievalAttrs
	if err := json.Unmarshal(tr.all[0].Attrs, &first); err != nil {
		t.Fatal(err)
	}
	if len(first.Labels) != 0 {
		t.Errorf("the workspace search's span labels = %v, want none", first.Labels)
	}
}

// TestRenderKeepsWholeHits: hits that do not fit the output's bound are
// left out whole, the best kept; the best is shown even when it alone is
// too long, its text cut.
func TestRenderKeepsWholeHits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ix := openIndex(t)
	files := map[string]string{}
	for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
		files[n+".md"] = "# " + n + "\n\nzebra " + strings.Repeat(n+" words ", 60) + "\n"
	}
	addDir(t, ix, recall.ScopeUser, nil, files)
	run := keel.Run{ID: "run_1"}
	for _, tt := range []struct {
		max       int
		min, max2 int
	}{
		{1500, 1, 2},
		{600, 1, 1},
	} {
		tool, err := recall.NewTool(recall.Config{Index: ix, MaxOutputBytes: tt.max,
			Runs: func(context.Context, keel.RunID) (keel.Run, error) { return run, nil },
			Policy: func(keel.Run) (*policy.Policy, uint64) {
				return compile(t, `{"rules":[{"action":"knowledge","scope":"user","decision":"allow"}]}`), 1
			}})
		if err != nil {
			t.Fatal(err)
		}
		out, err := tool.Call(ctx, keel.ToolInvocation{Run: run.ID, Name: recall.ToolName, Args: json.RawMessage(`{"query":"zebra","limit":6}`)})
		if err != nil {
			t.Fatal(err)
		}
		var o output
		if err := json.Unmarshal(out, &o); err != nil {
			t.Fatalf("max %d: output %s: %v", tt.max, out, err)
		}
		if len(out) > tt.max+64 || len(o.Hits) < tt.min || len(o.Hits) > tt.max2 {
			t.Errorf("max %d: %d bytes, %d hits; want about the bound, %d to %d hits", tt.max, len(out), len(o.Hits), tt.min, tt.max2)
		}
	}
}
