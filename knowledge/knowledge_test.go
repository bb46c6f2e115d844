package knowledge_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/knowledge"
)

const fixtureScope = knowledge.Scope("workspace:fixture")

func open(t *testing.T, o knowledge.Options) (*knowledge.Index, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keel.db")
	ix, err := knowledge.Open(t.Context(), path, o)
	if err != nil {
		t.Fatalf("Open() error = %v", err)
	}
	t.Cleanup(func() { ix.Close() })
	return ix, path
}

func corpus(t *testing.T) string {
	t.Helper()
	abs, err := filepath.Abs(filepath.Join("testdata", "corpus"))
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// addCorpus indexes testdata/corpus into fixtureScope.
func addCorpus(t *testing.T, ix *knowledge.Index) knowledge.AddReport {
	t.Helper()
	rep, err := ix.Add(t.Context(), []string{corpus(t)}, knowledge.AddOptions{Scope: fixtureScope, AddedBy: "test"})
	if err != nil {
		t.Fatalf("Add(corpus) error = %v", err)
	}
	return rep
}

// rankCase is a query of the fixture corpus and the chunk that must come
// first: its file and heading.
type rankCase struct {
	query, file, heading string
}

var rankCases = []rankCase{
	{"how often should I feed a sourdough starter", "notes/baking.md", "Bread > Sourdough"},
	{"rotating database credentials", "notes/security.md", "Operations > Secrets"},
	{"parse the JSON configuration file", "code/config.go", "func ParseConfig"},
	{"quicksort pivot partition", "code/sort.py", "def quicksort(items):"},
	{"when are spring tides", "misc/tides.txt", ""},
	{"restore a backup", "notes/security.md", "Operations > Backups"},
	{"sticky rye dough", "notes/baking.md", "Bread > Rye"},
}

// TestSearchBM25 ranks the fixture corpus by BM25 alone: each query's
// known answer comes first, with its provenance and lines.
func TestSearchBM25(t *testing.T) {
	t.Parallel()
	ix, _ := open(t, knowledge.Options{})
	rep := addCorpus(t, ix)
	if rep.Added != 6 || len(rep.Skipped) != 0 {
		t.Fatalf("Add(corpus) = %+v, want 6 added, none skipped", rep)
	}
	root := corpus(t)
	for _, c := range rankCases {
		hits, err := ix.Search(t.Context(), knowledge.Query{Text: c.query, Scopes: []knowledge.Scope{fixtureScope}})
		if err != nil {
			t.Fatalf("Search(%q) error = %v", c.query, err)
		}
		if len(hits) == 0 {
			t.Errorf("Search(%q) = no hits, want %s first", c.query, c.file)
			continue
		}
		h := hits[0]
		if h.Source != filepath.Join(root, c.file) || h.Heading != c.heading {
			t.Errorf("Search(%q)[0] = %s %q, want %s %q", c.query, h.Source, h.Heading, c.file, c.heading)
		}
		if h.BM25Rank != 1 || h.VectorRank != 0 || h.Score <= 0 || h.Scope != fixtureScope {
			t.Errorf("Search(%q)[0] = ranks %d/%d score %v scope %s, want BM25 rank 1, no vector rank, a positive score, %s",
				c.query, h.BM25Rank, h.VectorRank, h.Score, h.Scope, fixtureScope)
		}
		for i := 1; i < len(hits); i++ {
			if hits[i].Score > hits[i-1].Score {
				t.Errorf("Search(%q): hit %d scores %v above hit %d's %v", c.query, i, hits[i].Score, i-1, hits[i-1].Score)
			}
		}
	}
	// Lines and text of one known chunk.
	hits, err := ix.Search(t.Context(), knowledge.Query{Text: "Greeting banner", Scopes: []knowledge.Scope{fixtureScope}, Limit: 1})
	if err != nil || len(hits) != 1 {
		t.Fatalf("Search(Greeting banner) = %v, %v, want 1 hit", hits, err)
	}
	if h := hits[0]; h.Heading != "func Greeting" || h.StartLine != 27 || h.EndLine != 30 || !strings.HasPrefix(h.Text, "// Greeting returns") || h.Type != "go" {
		t.Errorf("Search(Greeting banner)[0] = %q lines %d-%d type %s text %q, want func Greeting, lines 27-30, go, its doc comment first",
			h.Heading, h.StartLine, h.EndLine, h.Type, h.Text)
	}
}

// TestSearchFilters: path prefix, type and time filters narrow the hits;
// the limit holds.
func TestSearchFilters(t *testing.T) {
	t.Parallel()
	ix, _ := open(t, knowledge.Options{})
	addCorpus(t, ix)
	root := corpus(t)
	all := []knowledge.Scope{fixtureScope}
	sources := func(q knowledge.Query) []string {
		t.Helper()
		hits, err := ix.Search(t.Context(), q)
		if err != nil {
			t.Fatalf("Search(%+v) error = %v", q, err)
		}
		var out []string
		for _, h := range hits {
			rel, _ := filepath.Rel(root, h.Source)
			if !slices.Contains(out, rel) {
				out = append(out, rel)
			}
		}
		slices.Sort(out)
		return out
	}
	// "the" words aside, "water" is in baking, tides (waters) and garden (watering).
	if got, want := sources(knowledge.Query{Text: "water", Scopes: all}), []string{"misc/garden.txt", "misc/tides.txt", "notes/baking.md"}; !slices.Equal(got, want) {
		t.Errorf("Search(water) sources = %v, want %v", got, want)
	}
	if got, want := sources(knowledge.Query{Text: "water", Scopes: all, PathPrefix: filepath.Join(root, "misc") + "/"}), []string{"misc/garden.txt", "misc/tides.txt"}; !slices.Equal(got, want) {
		t.Errorf("Search(water, prefix misc/) sources = %v, want %v", got, want)
	}
	if got, want := sources(knowledge.Query{Text: "water", Scopes: all, Type: "markdown"}), []string{"notes/baking.md"}; !slices.Equal(got, want) {
		t.Errorf("Search(water, markdown) sources = %v, want %v", got, want)
	}
	if got := sources(knowledge.Query{Text: "water", Scopes: all, Since: time.Now().Add(time.Hour)}); len(got) != 0 {
		t.Errorf("Search(water, since an hour ahead) sources = %v, want none", got)
	}
	if got := sources(knowledge.Query{Text: "water", Scopes: all, Until: time.Unix(0, 0)}); len(got) != 0 {
		t.Errorf("Search(water, until 1970) sources = %v, want none", got)
	}
	hits, err := ix.Search(t.Context(), knowledge.Query{Text: "water flour moon tomatoes", Scopes: all, Limit: 2})
	if err != nil || len(hits) != 2 {
		t.Errorf("Search(limit 2) = %d hits, %v, want 2", len(hits), err)
	}
	// Query syntax is not FTS5's: quotes, operators and stars are words or nothing.
	if _, err := ix.Search(t.Context(), knowledge.Query{Text: `"unbalanced AND OR * NEAR( -x`, Scopes: all}); err != nil {
		t.Errorf("Search(FTS5 syntax) error = %v, want none", err)
	}
	if hits, err := ix.Search(t.Context(), knowledge.Query{Text: "  ", Scopes: all}); err != nil || len(hits) != 0 {
		t.Errorf("Search(blank) = %v, %v, want no hits, no error", hits, err)
	}
}

// TestScopes: a search sees only the scopes it names; hits carry their
// scope's labels; a search without scopes, or with a malformed one, is
// ErrScope.
func TestScopes(t *testing.T) {
	t.Parallel()
	ix, _ := open(t, knowledge.Options{})
	ctx := t.Context()
	priv := knowledge.Scope("workspace:/home/me/private")
	if _, err := ix.AddText(ctx, "keel:note/1", "text", "the launch code is hidden under the blue mat", knowledge.AddOptions{Scope: priv, Labels: []string{keel.LabelPrivate}}); err != nil {
		t.Fatalf("AddText(private) error = %v", err)
	}
	if _, err := ix.AddText(ctx, "keel:note/2", "text", "the blue mat is in the hall", knowledge.AddOptions{Scope: knowledge.ScopeUser}); err != nil {
		t.Fatalf("AddText(user) error = %v", err)
	}
	search := func(scopes ...knowledge.Scope) []knowledge.Hit {
		t.Helper()
		hits, err := ix.Search(ctx, knowledge.Query{Text: "blue mat", Scopes: scopes})
		if err != nil {
			t.Fatalf("Search(%v) error = %v", scopes, err)
		}
		return hits
	}
	if hits := search(knowledge.ScopeUser); len(hits) != 1 || hits[0].Source != "keel:note/2" || hits[0].Labels != nil {
		t.Errorf("Search(user) = %+v, want only keel:note/2 without labels", hits)
	}
	if hits := search(priv); len(hits) != 1 || hits[0].Source != "keel:note/1" || !slices.Equal(hits[0].Labels, []string{"private"}) {
		t.Errorf("Search(private) = %+v, want only keel:note/1 labelled private", hits)
	}
	if hits := search(priv, knowledge.ScopeUser); len(hits) != 2 {
		t.Errorf("Search(both) = %d hits, want 2", len(hits))
	}
	if hits := search("run:r1"); len(hits) != 0 {
		t.Errorf("Search(run:r1) = %+v, want none", hits)
	}
	// Labels set later reach the hits; a second add does not change them.
	if err := ix.SetScopeLabels(ctx, knowledge.ScopeUser, []string{"team"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ix.AddText(ctx, "keel:note/3", "text", "mat", knowledge.AddOptions{Scope: knowledge.ScopeUser, Labels: []string{"other"}}); err != nil {
		t.Fatal(err)
	}
	if hits := search(knowledge.ScopeUser); len(hits) == 0 || !slices.Equal(hits[0].Labels, []string{"team"}) {
		t.Errorf("Search(user) after SetScopeLabels = %+v, want labels [team]", hits)
	}
	infos, err := ix.Scopes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []knowledge.ScopeInfo{
		{Name: knowledge.ScopeUser, Labels: []string{"team"}, Docs: 2, Chunks: 2, Bytes: int64(len("the blue mat is in the hall") + len("mat"))},
		{Name: priv, Labels: []string{"private"}, Docs: 1, Chunks: 1, Bytes: int64(len("the launch code is hidden under the blue mat"))},
	}
	if !slices.EqualFunc(infos, want, func(a, b knowledge.ScopeInfo) bool {
		return a.Name == b.Name && slices.Equal(a.Labels, b.Labels) && a.Docs == b.Docs && a.Chunks == b.Chunks && a.Bytes == b.Bytes
	}) {
		t.Errorf("Scopes() = %+v, want %+v", infos, want)
	}

	for _, q := range []knowledge.Query{
		{Text: "mat"},
		{Text: "mat", Scopes: []knowledge.Scope{"everything"}},
		{Text: "mat", Scopes: []knowledge.Scope{"workspace:"}},
		{Text: "mat", Scopes: []knowledge.Scope{"run:a b"}},
	} {
		if _, err := ix.Search(ctx, q); !errors.Is(err, knowledge.ErrScope) {
			t.Errorf("Search(scopes %q) error = %v, want ErrScope", q.Scopes, err)
		}
	}
	if _, err := ix.Add(ctx, []string{corpus(t)}, knowledge.AddOptions{}); !errors.Is(err, knowledge.ErrScope) {
		t.Errorf("Add(no scope) error = %v, want ErrScope", err)
	}
	if err := ix.SetScopeLabels(ctx, knowledge.ScopeUser, []string{"Not A Label"}); !errors.Is(err, keel.ErrLabel) {
		t.Errorf("SetScopeLabels(bad label) error = %v, want keel.ErrLabel", err)
	}
}

func TestParseScope(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"user", "workspace:/home/me/notes", "workspace:notes", "run:01HX"} {
		if got, err := knowledge.ParseScope(s); err != nil || string(got) != s {
			t.Errorf("ParseScope(%q) = %q, %v, want itself", s, got, err)
		}
	}
	for _, s := range []string{"", "users", "workspace", "workspace:", "run:", "run:a/b", "team:x", "workspace: x"} {
		if _, err := knowledge.ParseScope(s); !errors.Is(err, knowledge.ErrScope) {
			t.Errorf("ParseScope(%q) error = %v, want ErrScope", s, err)
		}
	}
}

// TestAddAgain: an unchanged file is not rewritten; a changed one is
// updated in place (same document ID, new chunks); AddText with the same
// source replaces; List shows provenance.
func TestAddAgain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ix, _ := open(t, knowledge.Options{})
	dir := t.TempDir()
	f := filepath.Join(dir, "a.md")
	writeFile(t, f, "# One\n\nalpha words\n")
	if rep, err := ix.Add(ctx, []string{dir}, knowledge.AddOptions{Scope: knowledge.ScopeUser, AddedBy: "cli"}); err != nil || rep.Added != 1 {
		t.Fatalf("Add() = %+v, %v, want 1 added", rep, err)
	}
	docs, err := ix.List(ctx, knowledge.ScopeUser)
	if err != nil || len(docs) != 1 {
		t.Fatalf("List() = %v, %v, want 1 doc", docs, err)
	}
	d := docs[0]
	if d.Source != f || d.Type != "markdown" || d.AddedBy != "cli" || d.Chunks != 1 || d.Bytes != 19 || len(d.Hash) != 64 || d.ModTime.IsZero() || d.AddedAt.IsZero() {
		t.Errorf("List()[0] = %+v, want %s, markdown, by cli, 1 chunk, 19 bytes, a hash and times", d, f)
	}
	if rep, err := ix.Add(ctx, []string{f}, knowledge.AddOptions{Scope: knowledge.ScopeUser}); err != nil || rep.Unchanged != 1 || rep.Added+rep.Updated != 0 {
		t.Errorf("Add(same) = %+v, %v, want 1 unchanged", rep, err)
	}
	writeFile(t, f, "# One\n\nbeta words\n\n# Two\n\ngamma\n")
	if rep, err := ix.Add(ctx, []string{f}, knowledge.AddOptions{Scope: knowledge.ScopeUser}); err != nil || rep.Updated != 1 || rep.Chunks != 2 {
		t.Errorf("Add(changed) = %+v, %v, want 1 updated, 2 chunks", rep, err)
	}
	docs, _ = ix.List(ctx, "")
	if len(docs) != 1 || docs[0].ID != d.ID || docs[0].Chunks != 2 || docs[0].Hash == d.Hash {
		t.Errorf("List() after change = %+v, want one doc %s with 2 chunks and a new hash", docs, d.ID)
	}
	for q, want := range map[string]int{"alpha": 0, "beta": 1, "gamma": 1} {
		hits, err := ix.Search(ctx, knowledge.Query{Text: q, Scopes: []knowledge.Scope{knowledge.ScopeUser}})
		if err != nil || len(hits) != want {
			t.Errorf("Search(%s) = %d hits, %v, want %d", q, len(hits), err, want)
		}
	}

	doc1, err := ix.AddText(ctx, "keel:run/r1", "", "first outcome", knowledge.AddOptions{Scope: "run:r1", AddedBy: "run:r1"})
	if err != nil {
		t.Fatal(err)
	}
	doc2, err := ix.AddText(ctx, "keel:run/r1", "", "second outcome", knowledge.AddOptions{Scope: "run:r1", AddedBy: "run:r1"})
	if err != nil {
		t.Fatal(err)
	}
	if doc1.ID != doc2.ID || doc2.Type != "text" || doc2.Hash == doc1.Hash || doc2.Chunks != 1 {
		t.Errorf("AddText twice = %+v then %+v, want the same document replaced", doc1, doc2)
	}
	if hits, _ := ix.Search(ctx, knowledge.Query{Text: "first", Scopes: []knowledge.Scope{"run:r1"}}); len(hits) != 0 {
		t.Errorf("Search(first) after replacement = %+v, want none", hits)
	}
	if _, err := ix.AddText(ctx, "keel:x", "text", "nul\x00byte", knowledge.AddOptions{Scope: knowledge.ScopeUser}); !errors.Is(err, knowledge.ErrBinary) || !errors.Is(err, keel.ErrInvalid) {
		t.Errorf("AddText(NUL) error = %v, want ErrBinary and keel.ErrInvalid", err)
	}
}

// TestAddDirReconciles: adding a directory again forgets the files gone
// from it (and their text), keeps those still there, whether the walk
// took them (a hidden file added by name) or not, and leaves other
// scopes and other directories alone.
func TestAddDirReconciles(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ix, _ := open(t, knowledge.Options{})
	dir, other := t.TempDir(), t.TempDir()
	for _, f := range []string{"a.md", "sub/b.md", ".hidden.md"} {
		writeFile(t, filepath.Join(dir, f), "# "+f+"\n\nwords of "+strings.TrimSuffix(filepath.Base(f), ".md")+"\n")
	}
	writeFile(t, filepath.Join(other, "c.md"), "# c\n\nwords of c\n")
	add := func(paths []string, s knowledge.Scope) knowledge.AddReport {
		t.Helper()
		rep, err := ix.Add(ctx, paths, knowledge.AddOptions{Scope: s})
		if err != nil {
			t.Fatalf("Add(%v) = %v", paths, err)
		}
		return rep
	}
	add([]string{dir, filepath.Join(dir, ".hidden.md"), other}, knowledge.ScopeUser)
	add([]string{dir}, "workspace:w")
	if err := os.Remove(filepath.Join(dir, "sub", "b.md")); err != nil {
		t.Fatal(err)
	}
	if rep := add([]string{dir}, knowledge.ScopeUser); rep.Forgotten != 1 || rep.Unchanged != 1 {
		t.Errorf("Add(dir) after a delete = %+v, want 1 forgotten, 1 unchanged", rep)
	}
	var got []string
	docs, _ := ix.List(ctx, knowledge.ScopeUser)
	for _, d := range docs {
		got = append(got, filepath.Base(d.Source))
	}
	if want := []string{".hidden.md", "a.md", "c.md"}; !slices.Equal(got, want) {
		t.Errorf("List(user) = %v, want %v", got, want)
	}
	if hits, _ := ix.Search(ctx, knowledge.Query{Text: "b", Scopes: []knowledge.Scope{knowledge.ScopeUser}}); len(hits) != 0 {
		t.Errorf("Search(b) = %+v, want nothing: b.md is gone", hits)
	}
	if docs, _ := ix.List(ctx, "workspace:w"); len(docs) != 2 {
		t.Errorf("List(workspace:w) = %d docs, want 2: another scope is reconciled by its own Add", len(docs))
	}
}

// TestRenameRemove: watch's rename moves a document (and a directory's
// documents), searchable under the new path; remove forgets.
func TestRenameRemove(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ix, _ := open(t, knowledge.Options{})
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "sub", "a.txt"), "apples")
	writeFile(t, filepath.Join(dir, "b.txt"), "bananas")
	if _, err := ix.Add(ctx, []string{dir}, knowledge.AddOptions{Scope: knowledge.ScopeUser}); err != nil {
		t.Fatal(err)
	}
	if err := ix.Rename(ctx, filepath.Join(dir, "sub")+"/", filepath.Join(dir, "moved")+"/"); err != nil {
		t.Fatalf("Rename(dir) error = %v", err)
	}
	if err := ix.Rename(ctx, filepath.Join(dir, "b.txt"), filepath.Join(dir, "c.txt")); err != nil {
		t.Fatalf("Rename(file) error = %v", err)
	}
	hits, err := ix.Search(ctx, knowledge.Query{Text: "apples bananas", Scopes: []knowledge.Scope{knowledge.ScopeUser}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range hits {
		got = append(got, h.Source)
	}
	slices.Sort(got)
	if want := []string{filepath.Join(dir, "c.txt"), filepath.Join(dir, "moved", "a.txt")}; !slices.Equal(got, want) {
		t.Errorf("sources after Rename = %v, want %v", got, want)
	}
	if err := ix.Rename(ctx, filepath.Join(dir, "nothing"), filepath.Join(dir, "x")); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("Rename(nothing) error = %v, want keel.ErrNotFound", err)
	}
	if err := ix.Remove(ctx, filepath.Join(dir, "c.txt")); err != nil {
		t.Fatalf("Remove() error = %v", err)
	}
	if err := ix.Remove(ctx, filepath.Join(dir, "c.txt")); !errors.Is(err, keel.ErrNotFound) {
		t.Errorf("Remove(again) error = %v, want keel.ErrNotFound", err)
	}
	docs, _ := ix.List(ctx, "")
	if len(docs) != 1 || docs[0].Source != filepath.Join(dir, "moved", "a.txt") {
		t.Errorf("List() after Remove = %+v, want moved/a.txt alone", docs)
	}
	// A directory named with its trailing slash.
	if err := ix.Remove(ctx, filepath.Join(dir, "moved")+"/"); err != nil {
		t.Errorf("Remove(dir/) error = %v", err)
	}
	if docs, _ := ix.List(ctx, ""); len(docs) != 0 {
		t.Errorf("List() after Remove(dir/) = %+v, want none", docs)
	}
}

func TestForgetSelector(t *testing.T) {
	t.Parallel()
	ix, _ := open(t, knowledge.Options{})
	for _, sel := range []knowledge.ForgetSelector{{}, {Path: "/a", ID: "d1"}} {
		if _, err := ix.Forget(t.Context(), sel); !errors.Is(err, keel.ErrInvalid) {
			t.Errorf("Forget(%+v) error = %v, want keel.ErrInvalid", sel, err)
		}
	}
	for _, sel := range []knowledge.ForgetSelector{{Path: "/nothing"}, {ID: "d99"}, {ID: "junk"}, {Scope: "run:none"}} {
		if _, err := ix.Forget(t.Context(), sel); !errors.Is(err, keel.ErrNotFound) {
			t.Errorf("Forget(%+v) error = %v, want keel.ErrNotFound", sel, err)
		}
	}
}

func ctxTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestSearchFilterPastFirstPage: a filter that leaves none of FTS5's
// first page of matches still finds the match further down.
func TestSearchFilterPastFirstPage(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ix, _ := open(t, knowledge.Options{})
	for i := range 60 {
		if _, err := ix.AddText(ctx, fmt.Sprintf("keel:a/%d", i), "text", fmt.Sprintf("walrus walrus walrus %d", i), knowledge.AddOptions{Scope: "workspace:a"}); err != nil {
			t.Fatal(err)
		}
	}
	long := "a walrus once, " + strings.Repeat("and many other words besides ", 40)
	if _, err := ix.AddText(ctx, "keel:b/1", "text", long, knowledge.AddOptions{Scope: "workspace:b"}); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []knowledge.Mode{knowledge.ModeBM25, knowledge.ModeAuto} {
		hits, err := ix.Search(ctx, knowledge.Query{Text: "walrus", Scopes: []knowledge.Scope{"workspace:b"}, Limit: 1, Mode: mode})
		if err != nil || len(hits) != 1 || hits[0].Source != "keel:b/1" {
			t.Errorf("Search(walrus, scope b, %q) = %+v, %v, want keel:b/1", mode, hits, err)
		}
		hits, err = ix.Search(ctx, knowledge.Query{Text: "walrus", Scopes: []knowledge.Scope{"workspace:a", "workspace:b"}, Limit: 100, Mode: mode})
		if err != nil || len(hits) != 61 || hits[60].Source != "keel:b/1" {
			t.Errorf("Search(walrus, both scopes) = %d hits, %v, want 61, keel:b/1 last", len(hits), err)
		}
	}
}

// TestOccupied: Occupied names the scopes holding a document, sorted,
// not one whose labels were set but that holds nothing, nor one whose
// last document was forgotten.
func TestOccupied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ix, _ := open(t, knowledge.Options{})
	if err := ix.SetScopeLabels(ctx, "workspace:empty", []string{"team"}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []knowledge.Scope{"workspace:b", knowledge.ScopeUser, "workspace:a"} {
		if _, err := ix.AddText(ctx, "keel:run/r1", "text", "a note in "+string(s), knowledge.AddOptions{Scope: s}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ix.Forget(ctx, knowledge.ForgetSelector{Scope: "workspace:b"}); err != nil {
		t.Fatal(err)
	}
	got, err := ix.Occupied(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []knowledge.Scope{knowledge.ScopeUser, "workspace:a"}; !slices.Equal(got, want) {
		t.Errorf("Occupied = %q, want %q", got, want)
	}
}
