package recall_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-runtime/keel/knowledge"
	"github.com/keel-runtime/keel/recall"
)

// watching runs a Watcher over ix with its file in state until the test
// ends (or stop is called), and returns the channel of its syncs.
func watching(t *testing.T, ix *knowledge.Index, state string) (w *recall.Watcher, syncs <-chan recall.Sync, stop func()) {
	t.Helper()
	ch := make(chan recall.Sync, 64)
	w, err := recall.NewWatcher(recall.WatcherConfig{Index: ix, File: filepath.Join(state, recall.WatchFile), Debounce: 100 * time.Millisecond,
		OnSync: func(s recall.Sync) { ch <- s }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return w, ch, stop
}

// sources returns the sources in sc whose text matches query.
func sources(t *testing.T, ix *knowledge.Index, sc knowledge.Scope, query string) []string {
	t.Helper()
	hits, err := ix.Search(context.Background(), knowledge.Query{Text: query, Scopes: []knowledge.Scope{sc}, Limit: 20})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, h := range hits {
		out = append(out, filepath.Base(h.Source))
	}
	return out
}

// waitUntil takes syncs until ok holds (checked first, then after
// each), failing after a minute.
func waitUntil(t *testing.T, syncs <-chan recall.Sync, what string, ok func() bool) {
	t.Helper()
	deadline := time.After(time.Minute)
	for !ok() {
		select {
		case s := <-syncs:
			if s.Err != nil {
				t.Logf("sync error: %v", s.Err)
			}
		case <-deadline:
			t.Fatalf("%s: not seen within a minute", what)
		}
	}
}

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestWatch: a watched directory stays indexed through a file added,
// changed, renamed and deleted, a new subdirectory and its file; hidden
// files are left out; a new Watcher on the same file (a restarted
// daemon) watches it again and catches up with what changed while none
// ran.
func TestWatch(t *testing.T) {
	t.Parallel()
	ix := openIndex(t)
	state, dir := t.TempDir(), t.TempDir()
	sc := recall.WorkspaceScope(dir)
	write(t, dir, map[string]string{"first.md": "# First\n\nalpha bravo\n"})
	w, syncs, stop := watching(t, ix, state)
	if _, err := w.Watch(context.Background(), dir, sc, nil); err != nil {
		t.Fatal(err)
	}
	if got := sources(t, ix, sc, "alpha"); !has(got, "first.md") {
		t.Fatalf("after Watch: alpha in %v, want first.md indexed at once", got)
	}

	write(t, dir, map[string]string{"second.md": "charlie delta\n", ".hidden.md": "charlie secret\n"})
	waitUntil(t, syncs, "an added file indexed", func() bool { return has(sources(t, ix, sc, "charlie"), "second.md") })

	write(t, dir, map[string]string{"second.md": "echo foxtrot\n"})
	waitUntil(t, syncs, "a changed file indexed again", func() bool {
		return has(sources(t, ix, sc, "foxtrot"), "second.md") && !has(sources(t, ix, sc, "charlie"), "second.md")
	})

	before := docID(t, ix, sc, filepath.Join(dir, "second.md"))
	if err := os.Rename(filepath.Join(dir, "second.md"), filepath.Join(dir, "renamed.md")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, syncs, "a renamed file under its new name only", func() bool {
		got := sources(t, ix, sc, "foxtrot")
		return has(got, "renamed.md") && !has(got, "second.md")
	})
	// Moved, not indexed again: the same document.
	if after := docID(t, ix, sc, filepath.Join(dir, "renamed.md")); after != before {
		t.Errorf("the renamed file is document %s, was %s: want it moved, not indexed again", after, before)
	}

	if err := os.Remove(filepath.Join(dir, "renamed.md")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, syncs, "a deleted file forgotten", func() bool { return len(sources(t, ix, sc, "foxtrot")) == 0 })

	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, dir, map[string]string{"sub/deep.md": "golf hotel\n"})
	waitUntil(t, syncs, "a file of a new subdirectory indexed", func() bool { return has(sources(t, ix, sc, "golf"), "deep.md") })
	write(t, dir, map[string]string{"sub/deeper.md": "india juliet\n"})
	waitUntil(t, syncs, "a new subdirectory watched", func() bool { return has(sources(t, ix, sc, "juliet"), "deeper.md") })
	if got := sources(t, ix, sc, "secret"); len(got) != 0 {
		t.Errorf("hidden file indexed: %v", got)
	}

	// The daemon stops; meanwhile a file goes and one comes.
	stop()
	if err := os.Remove(filepath.Join(dir, "first.md")); err != nil {
		t.Fatal(err)
	}
	write(t, dir, map[string]string{"later.md": "kilo lima\n"})
	w2, syncs2, _ := watching(t, ix, state)
	if l := w2.List(); len(l) != 1 || l[0].Dir != dir || l[0].Scope != string(sc) {
		t.Fatalf("watches after a restart = %+v, want %s", l, dir)
	}
	waitUntil(t, syncs2, "caught up after a restart", func() bool {
		return has(sources(t, ix, sc, "lima"), "later.md") && len(sources(t, ix, sc, "alpha")) == 0
	})
	write(t, dir, map[string]string{"after.md": "mike november\n"})
	waitUntil(t, syncs2, "watched again after a restart", func() bool { return has(sources(t, ix, sc, "november"), "after.md") })

	if err := w2.Unwatch(dir); err != nil {
		t.Fatal(err)
	}
	if l := w2.List(); len(l) != 0 {
		t.Errorf("watches after Unwatch = %+v", l)
	}
	b, err := os.ReadFile(filepath.Join(state, recall.WatchFile))
	if err != nil || strings.Contains(string(b), dir) {
		t.Errorf("watch file after Unwatch: %s %v", b, err)
	}
}

// docID returns the ID of the document at source in sc.
func docID(t *testing.T, ix *knowledge.Index, sc knowledge.Scope, source string) string {
	t.Helper()
	docs, err := ix.List(context.Background(), sc)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if d.Source == source {
			return d.ID
		}
	}
	t.Fatalf("no document at %s", source)
	return ""
}
