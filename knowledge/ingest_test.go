package knowledge_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/knowledge"
)

func TestMain(m *testing.M) {
	if db := os.Getenv("KEEL_KNOWLEDGE_INGEST_CHILD"); db != "" {
		os.Exit(ingestChild(db, os.Getenv("KEEL_KNOWLEDGE_INGEST_DIR")))
	}
	os.Exit(m.Run())
}

// fileHas reports whether the file at path holds s (a missing file holds
// nothing).
func fileHas(t *testing.T, path, s string) bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Contains(b, []byte(s))
}

// TestForgetLeavesNoTrace: a canary word added by file and by text, then
// forgotten by path, by ID and by scope, is nowhere in the database file
// or its write-ahead log; the rest of the index is intact.
func TestForgetLeavesNoTrace(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"path", "id", "scope"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			ix, db := open(t, knowledge.Options{})
			addCorpus(t, ix)
			// The canary is one word: the FTS index keeps it as a term
			// (prefix-compressed against its neighbour, so the test looks
			// for its tail, which no other term shares).
			canary := "zqxcanary" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "")) + "7f3a9c"
			tail := canary[3:]
			dir := t.TempDir()
			secret := filepath.Join(dir, "secret.md")
			writeFile(t, secret, "# Vault\n\nThe passphrase is "+canary+" and nobody knows.\n")
			scope := knowledge.Scope("workspace:secrets")
			if _, err := ix.Add(ctx, []string{secret}, knowledge.AddOptions{Scope: scope}); err != nil {
				t.Fatal(err)
			}
			doc, err := ix.AddText(ctx, "keel:run/r9", "text", "remember "+canary+" forever", knowledge.AddOptions{Scope: scope})
			if err != nil {
				t.Fatal(err)
			}
			hits, err := ix.Search(ctx, knowledge.Query{Text: canary, Scopes: []knowledge.Scope{scope}})
			if err != nil || len(hits) != 2 {
				t.Fatalf("Search(canary) = %d hits, %v, want 2", len(hits), err)
			}
			if !fileHas(t, db, tail) && !fileHas(t, db+"-wal", tail) {
				t.Fatalf("canary not in the database files before Forget: the scan cannot see it")
			}
			var want int
			switch how {
			case "path":
				for _, sel := range []knowledge.ForgetSelector{{Path: dir}, {Path: "keel:run/r9"}} {
					n, err := ix.Forget(ctx, sel)
					if err != nil || n != 1 {
						t.Fatalf("Forget(%+v) = %d, %v, want 1", sel, n, err)
					}
				}
				want = 2
			case "id":
				docs, _ := ix.List(ctx, scope)
				for _, d := range docs {
					if n, err := ix.Forget(ctx, knowledge.ForgetSelector{ID: d.ID}); err != nil || n != 1 {
						t.Fatalf("Forget(%s) = %d, %v, want 1", d.ID, n, err)
					}
				}
				if _, err := ix.Forget(ctx, knowledge.ForgetSelector{ID: doc.ID}); !errors.Is(err, keel.ErrNotFound) {
					t.Errorf("Forget(%s) again error = %v, want keel.ErrNotFound", doc.ID, err)
				}
				want = 2
			case "scope":
				if n, err := ix.Forget(ctx, knowledge.ForgetSelector{Scope: scope}); err != nil || n != 2 {
					t.Fatalf("Forget(scope) = %d, %v, want 2", n, err)
				}
				scopes, _ := ix.Scopes(ctx)
				if len(scopes) != 1 || scopes[0].Name != fixtureScope {
					t.Errorf("Scopes() after Forget(scope) = %+v, want only %s", scopes, fixtureScope)
				}
				want = 2
			}
			_ = want
			for _, f := range []string{db, db + "-wal"} {
				if fileHas(t, f, tail) {
					t.Errorf("%s holds the canary after Forget", filepath.Base(f))
				}
			}
			if hits, _ := ix.Search(ctx, knowledge.Query{Text: canary, Scopes: []knowledge.Scope{scope}}); len(hits) != 0 {
				t.Errorf("Search(canary) after Forget = %+v, want none", hits)
			}
			checkConsistent(t, db)
			if hits, _ := ix.Search(ctx, knowledge.Query{Text: "sourdough", Scopes: []knowledge.Scope{fixtureScope}}); len(hits) == 0 {
				t.Errorf("Search(sourdough) after Forget = none, want the corpus intact")
			}
		})
	}
}

// checkConsistent opens the database at path on its own and checks that
// the FTS index agrees with the chunk rows (FTS5's integrity-check
// against its content table), that every document's chunk count is its
// chunks, and that no chunk or vector is orphaned.
func checkConsistent(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`INSERT INTO kn_fts(kn_fts, rank) VALUES ('integrity-check', 1)`); err != nil {
		t.Errorf("FTS integrity-check: %v", err)
	}
	for q, what := range map[string]string{
		`SELECT count(*) FROM kn_docs d WHERE d.chunks != (SELECT count(*) FROM kn_chunks c WHERE c.doc_id = d.id)`: "documents whose chunk count is wrong",
		`SELECT count(*) FROM kn_chunks c WHERE NOT EXISTS (SELECT 1 FROM kn_docs d WHERE d.id = c.doc_id)`:         "orphan chunks",
		`SELECT count(*) FROM kn_vectors v WHERE NOT EXISTS (SELECT 1 FROM kn_chunks c WHERE c.id = v.chunk_id)`:    "orphan vectors",
		`SELECT (SELECT count(*) FROM kn_chunks) - (SELECT count(*) FROM kn_fts_docsize)`:                           "chunks minus FTS rows",
	} {
		var n int
		if err := db.QueryRow(q).Scan(&n); err != nil || n != 0 {
			t.Errorf("%s = %d, %v, want 0", what, n, err)
		}
	}
}

// TestSkipReasons: binary, invalid UTF-8, too large (a 1 GiB sparse
// file), a symlink loop and a self-referencing link are skipped with a
// reason; the good file beside them is indexed.
func TestSkipReasons(t *testing.T) {
	t.Parallel()
	ix, _ := open(t, knowledge.Options{})
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "good.txt"), "good text")
	writeFile(t, filepath.Join(dir, "bin.dat"), "PK\x03\x04\x00\x00binary")
	writeFile(t, filepath.Join(dir, "latin1.txt"), "caf\xe9")
	writeFile(t, filepath.Join(dir, ".hidden", "h.txt"), "hidden")
	huge := filepath.Join(dir, "huge.log")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil { // sparse: no 1 GiB written
		t.Fatal(err)
	}
	f.Close()
	if err := os.Symlink(dir, filepath.Join(dir, "loop")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "self"), filepath.Join(dir, "self")); err != nil {
		t.Fatal(err)
	}
	rep, err := ix.Add(t.Context(), []string{dir, filepath.Join(dir, "missing")}, knowledge.AddOptions{Scope: knowledge.ScopeUser})
	if err != nil {
		t.Fatalf("Add() error = %v", err)
	}
	if rep.Added != 1 || rep.Chunks != 1 {
		t.Errorf("Add() = %+v, want good.txt added alone", rep)
	}
	want := map[string]error{
		"bin.dat":    knowledge.ErrBinary,
		"latin1.txt": knowledge.ErrInvalidUTF8,
		"huge.log":   knowledge.ErrTooLarge,
		"loop":       knowledge.ErrSymlinkLoop,
		"self":       knowledge.ErrSymlinkLoop,
		"missing":    os.ErrNotExist,
	}
	got := map[string]error{}
	for _, s := range rep.Skipped {
		if s.Reason == "" || s.Reason != s.Err.Error() {
			t.Errorf("Skip %s: reason %q, err %v: want the error's text", s.Path, s.Reason, s.Err)
		}
		got[filepath.Base(s.Path)] = s.Err
	}
	for name, w := range want {
		if !errors.Is(got[name], w) {
			t.Errorf("skip of %s = %v, want %v", name, got[name], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("skipped %v, want exactly %v", rep.Skipped, want)
	}
	// A smaller limit from Options.
	ix2, _ := open(t, knowledge.Options{MaxFileBytes: 4})
	rep, err = ix2.Add(t.Context(), []string{filepath.Join(dir, "good.txt")}, knowledge.AddOptions{Scope: knowledge.ScopeUser})
	if err != nil || len(rep.Skipped) != 1 || !errors.Is(rep.Skipped[0].Err, knowledge.ErrTooLarge) {
		t.Errorf("Add(9 bytes, limit 4) = %+v, %v, want skipped as too large", rep, err)
	}
}

// TestConcurrentIngestSearch: adds into two scopes, text adds, renames,
// forgets and searches at once (run it with -race); the index ends
// consistent with every file in.
func TestConcurrentIngestSearch(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t)
	ix, db := open(t, knowledge.Options{})
	dirs := []string{t.TempDir(), t.TempDir()}
	for d, dir := range dirs {
		for i := range 40 {
			writeFile(t, filepath.Join(dir, fmt.Sprintf("f%02d.md", i)), fmt.Sprintf("# File %d\n\nshared words dir%d file%d\n\n## More\n\nmore shared words\n", i, d, i))
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for d, dir := range dirs {
		wg.Go(func() {
			scope := knowledge.Scope(fmt.Sprintf("workspace:d%d", d))
			for range 3 {
				if _, err := ix.Add(ctx, []string{dir}, knowledge.AddOptions{Scope: scope}); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 30 {
			if _, err := ix.AddText(ctx, fmt.Sprintf("keel:t/%d", i%5), "text", fmt.Sprintf("shared note %d", i), knowledge.AddOptions{Scope: knowledge.ScopeUser}); err != nil {
				errs <- err
			}
			if i%7 == 0 {
				if _, err := ix.Forget(ctx, knowledge.ForgetSelector{Path: fmt.Sprintf("keel:t/%d", i%5)}); err != nil {
					errs <- err
				}
			}
		}
	})
	for range 3 {
		wg.Go(func() {
			for range 30 {
				_, err := ix.Search(ctx, knowledge.Query{Text: "shared words", Scopes: []knowledge.Scope{"workspace:d0", "workspace:d1", knowledge.ScopeUser}})
				if err != nil {
					errs <- err
				}
				if _, err := ix.List(ctx, ""); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent call error = %v", err)
	}
	for d := range dirs {
		docs, err := ix.List(ctx, knowledge.Scope(fmt.Sprintf("workspace:d%d", d)))
		if err != nil || len(docs) != 40 {
			t.Errorf("List(d%d) = %d docs, %v, want 40", d, len(docs), err)
		}
	}
	checkConsistent(t, db)
}

// TestCancelledIngest: an Add cancelled part-way returns ctx's error and
// leaves the index consistent; the next Add completes it.
func TestCancelledIngest(t *testing.T) {
	t.Parallel()
	ix, db := open(t, knowledge.Options{})
	dir := manyFiles(t, 600)
	ctx, cancel := context.WithCancel(t.Context())
	knowledge.SetAfterCommit(ix, cancel) // cancelled once the first batch is in
	rep, err := ix.Add(ctx, []string{dir}, knowledge.AddOptions{Scope: knowledge.ScopeUser})
	knowledge.SetAfterCommit(ix, nil)
	cancel()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Add(cancelled) = %+v, %v, want context.Canceled", rep, err)
	}
	checkConsistent(t, db)
	docs, _ := ix.List(t.Context(), knowledge.ScopeUser)
	if len(docs) == 0 || len(docs) >= 600 {
		t.Fatalf("cancelled Add indexed %d of 600 files, want some: the test did not cancel part-way", len(docs))
	}
	rep, err = ix.Add(t.Context(), []string{dir}, knowledge.AddOptions{Scope: knowledge.ScopeUser})
	if err != nil || rep.Added+rep.Unchanged != 600 || rep.Unchanged != len(docs) {
		t.Errorf("Add(again) = added %d unchanged %d, %v; want 600 in all, %d unchanged", rep.Added, rep.Unchanged, err, len(docs))
	}
	checkConsistent(t, db)
}

// manyFiles writes n small Markdown files into a new directory.
func manyFiles(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	for i := range n {
		writeFile(t, filepath.Join(dir, fmt.Sprintf("n%04d.md", i)), fmt.Sprintf("# Note %d\n\nbody of note %d with some words\n\n## Part two\n\nsecond part %d\n", i, i, i))
	}
	return dir
}

// ingestChild is the child process of TestKilledIngest: it adds dir over
// and over, with the files changed each time, and says "ready" after the
// first round, until it is killed.
func ingestChild(db, dir string) int {
	ctx := context.Background()
	ix, err := knowledge.Open(ctx, db, knowledge.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ents, _ := os.ReadDir(dir)
	for round := 0; ; round++ {
		for i, e := range ents {
			os.WriteFile(filepath.Join(dir, e.Name()), fmt.Appendf(nil, "# Round %d\n\nfile %d text\n\n# Two\n\nmore %d\n", round, i, round), 0o644)
		}
		if _, err := ix.Add(ctx, []string{dir}, knowledge.AddOptions{Scope: knowledge.ScopeUser}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if round == 0 {
			fmt.Println("ready")
		}
	}
}

// TestKilledIngest: a process killed (SIGKILL) in the middle of ingests
// leaves an index that is consistent, and that a new Add completes.
func TestKilledIngest(t *testing.T) {
	t.Parallel()
	dir := manyFiles(t, 300)
	db := filepath.Join(t.TempDir(), "keel.db")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctxTimeout(t), exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "KEEL_KNOWLEDGE_INGEST_CHILD="+db, "KEEL_KNOWLEDGE_INGEST_DIR="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child said %q, %v; want ready", line, err)
	}
	// The child is in its second round or later: writing.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	checkConsistent(t, db)
	ix, err := knowledge.Open(t.Context(), db, knowledge.Options{})
	if err != nil {
		t.Fatalf("Open() after kill error = %v", err)
	}
	defer ix.Close()
	rep, err := ix.Add(t.Context(), []string{dir}, knowledge.AddOptions{Scope: knowledge.ScopeUser})
	if err != nil || rep.Added != 0 || rep.Updated+rep.Unchanged != 300 {
		t.Errorf("Add() after kill = %+v, %v, want all 300 files there, updated or unchanged", rep, err)
	}
	checkConsistent(t, db)
	docs, _ := ix.List(t.Context(), knowledge.ScopeUser)
	if len(docs) != 300 {
		t.Errorf("List() after re-Add = %d docs, want 300", len(docs))
	}
}
