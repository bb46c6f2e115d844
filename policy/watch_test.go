package policy

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// writeAtomic replaces a file the way editors save: a temporary file
// renamed over it, so the watcher never reads it half-written.
func writeAtomic(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// waitEvent waits for the first event for which ok holds.
func waitEvent(t *testing.T, events <-chan Event, what string, ok func(Event) bool) Event {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case e := <-events:
			if ok(e) {
				return e
			}
		case <-timeout:
			t.Fatalf("no event: %s", what)
		}
	}
}

func fetchDecision(p *Policy) Outcome { return p.Decide(fetch).Outcome }

// TestWatcherReload edits real files under a real fsnotify watcher: a
// change applies from the next decision with a new version; a broken
// file keeps the last good policy and reports its file and line; fixing
// it applies again; a workspace file created later, in a directory that
// did not exist, is picked up.
func TestWatcherReload(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	user := filepath.Join(dir, "data", "policy.json")
	ws := WorkspacePath(filepath.Join(dir, "project"))
	writeAtomic(t, user, `{"rules": [{"action": "tool", "tool": "fetch", "decision": "allow"}]}`)
	if err := os.MkdirAll(filepath.Join(dir, "project"), 0o755); err != nil {
		t.Fatal(err)
	}

	events := make(chan Event, 16)
	w, err := NewWatcher(WatcherConfig{Paths: Paths{User: user, Workspace: ws}, Options: opts, OnEvent: func(e Event) { events <- e }})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	s := w.Current()
	if s.Version != 1 || fetchDecision(s.Policy) != Allow || s.Err != nil {
		t.Fatalf("Current = v%d %s %v, want v1 allow", s.Version, s.Policy.Decide(fetch), s.Err)
	}

	writeAtomic(t, user, `{"rules": [{"action": "tool", "tool": "fetch", "decision": "ask"}]}`)
	e := waitEvent(t, events, "reload to ask", func(e Event) bool { return e.Err == nil && fetchDecision(e.Policy) == Ask })
	if e.Version != 2 || w.Current().Version != 2 || fetchDecision(w.Current().Policy) != Ask {
		t.Fatalf("after the edit: event v%d, Current v%d %s, want v2 ask", e.Version, w.Current().Version, w.Current().Policy.Decide(fetch))
	}
	digest2 := e.Policy.Digest()

	writeAtomic(t, user, "{\n  \"rules\": [\n    {\"action\": \"tool\" \"decision\": \"deny\"}\n]}")
	e = waitEvent(t, events, "the broken file's error", func(e Event) bool { return e.Err != nil })
	var fe *FileError
	if !errors.As(e.Err, &fe) || !errors.Is(e.Err, ErrSyntax) || fe.File != user || fe.Line != 3 {
		t.Fatalf("error event = %v, want a syntax error at %s:3", e.Err, user)
	}
	s = w.Current()
	if e.Version != 2 || s.Version != 2 || fetchDecision(s.Policy) != Ask || s.Policy.Digest() != digest2 || !errors.Is(s.Err, ErrSyntax) {
		t.Fatalf("with a broken file: event v%d, Current v%d %s err %v, want the last good v2 (ask) and the error", e.Version, s.Version, s.Policy.Decide(fetch), s.Err)
	}

	writeAtomic(t, user, `{"rules": [{"action": "tool", "tool": "fetch", "decision": "deny"}]}`)
	e = waitEvent(t, events, "reload to deny", func(e Event) bool { return e.Err == nil && fetchDecision(e.Policy) == Deny })
	if e.Version != 3 || w.Current().Err != nil {
		t.Fatalf("after the fix: v%d err %v, want v3 and no error", e.Version, w.Current().Err)
	}

	// The workspace's .keel directory does not exist yet.
	writeAtomic(t, ws, `{"rules": [{"action": "model", "where": "cloud", "decision": "deny"}]}`)
	e = waitEvent(t, events, "the new workspace file", func(e Event) bool {
		return e.Err == nil && e.Policy.Decide(&Action{Kind: KindModel, Provider: "openai", Cloud: true}).Outcome == Deny
	})
	if e.Version != 4 || fetchDecision(e.Policy) != Deny {
		t.Fatalf("with the workspace file: v%d fetch %s, want v4, fetch still denied", e.Version, e.Policy.Decide(fetch))
	}

	// And its next edit, seen only if the new directory is watched.
	writeAtomic(t, ws, `{"rules": [{"action": "model", "where": "cloud", "decision": "ask"}]}`)
	e = waitEvent(t, events, "the workspace file's edit", func(e Event) bool {
		return e.Err == nil && e.Policy.Decide(&Action{Kind: KindModel, Provider: "openai", Cloud: true}).Outcome == Ask
	})
	if e.Version != 5 {
		t.Fatalf("after the workspace edit: v%d, want v5", e.Version)
	}

	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestNewWatcherRefusesABrokenFile(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	managed := filepath.Join(dir, "policy.json")
	writeAtomic(t, managed, "{\"cloud\": false,\n \"clouds\": true}")
	_, err := NewWatcher(WatcherConfig{Paths: Paths{Managed: managed}, Options: opts})
	var fe *FileError
	if !errors.As(err, &fe) || !errors.Is(err, ErrUnknownField) || fe.Line != 2 || fe.Field != "clouds" {
		t.Fatalf("NewWatcher = %v, want an unknown field at line 2", err)
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	user := UserPath(dir)
	writeAtomic(t, user, `{"rules": [{"action": "tool", "tool": "fetch", "decision": "deny"}]}`)
	p, err := Load(Paths{Managed: filepath.Join(dir, "missing.json"), User: user}, opts)
	if err != nil {
		t.Fatal(err)
	}
	d := p.Decide(fetch)
	if d.Outcome != Deny || d.Rule().File != user || d.Rule().Layer != LayerUser {
		t.Errorf("Decide = %s, want deny by %s", d, user)
	}
	if got := WorkspacePath("/w"); got != filepath.Join("/w", ".keel", "policy.json") {
		t.Errorf("WorkspacePath = %s", got)
	}
	if DefaultManagedPath() == "" {
		t.Error("DefaultManagedPath is empty")
	}
}

// TestWatcherWorkspaces: the workspaces runs use share one watcher. A
// workspace's policy is the watcher's files with its .keel/policy.json
// added; a missing file is no layer; a broken one refuses Use with its
// file and line; an edit of the workspace file or of the user file
// reloads the workspace's policy with a new version; a broken edit keeps
// the last good; the last release stops watching the workspace.
func TestWatcherWorkspaces(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	user := filepath.Join(dir, "data", "policy.json")
	writeAtomic(t, user, `{"rules": [{"action": "tool", "tool": "fetch", "decision": "allow"}]}`)
	a, b, broken := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "broken")
	for _, d := range []string{a, b} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeAtomic(t, WorkspacePath(a), `{"rules": [{"action": "tool", "tool": "fetch", "decision": "deny"}]}`)
	writeAtomic(t, WorkspacePath(broken), "{\n\"rules\": [}")

	events := make(chan Event, 32)
	w, err := NewWatcher(WatcherConfig{Paths: Paths{User: user}, Options: opts, OnEvent: func(e Event) { events <- e }})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	_, err = w.Use(broken)
	var fe *FileError
	if !errors.As(err, &fe) || fe.File != WorkspacePath(broken) || fe.Line != 2 {
		t.Fatalf("Use(broken) = %v, want an error at %s:2", err, WorkspacePath(broken))
	}
	relA, err := w.Use(a)
	if err != nil {
		t.Fatal(err)
	}
	relA2, err := w.Use(a)
	if err != nil {
		t.Fatal(err)
	}
	relB, err := w.Use(b)
	if err != nil {
		t.Fatal(err)
	}
	if got := fetchDecision(w.CurrentFor(a).Policy); got != Deny {
		t.Errorf("CurrentFor(a) decides fetch %s, want deny (its workspace layer)", got)
	}
	if got, want := w.CurrentFor(b), w.Current(); got.Policy != want.Policy || got.Version != want.Version {
		t.Errorf("CurrentFor(b) = v%d, want the watcher's own v%d: b has no workspace file", got.Version, want.Version)
	}
	if got := fetchDecision(w.Current().Policy); got != Allow {
		t.Errorf("Current decides fetch %s, want allow", got)
	}

	// An edit of the workspace file reloads that workspace only.
	va := w.CurrentFor(a).Version
	writeAtomic(t, WorkspacePath(a), `{"rules": [{"action": "tool", "tool": "fetch", "decision": "ask"}]}`)
	e := waitEvent(t, events, "a's edit", func(e Event) bool { return e.Workspace == a && e.Err == nil })
	if fetchDecision(e.Policy) != Ask || e.Version <= va || w.CurrentFor(a).Version != e.Version {
		t.Fatalf("after a's edit: v%d %s, want ask with a version after v%d", e.Version, e.Policy.Decide(fetch), va)
	}

	// A broken edit keeps the last good, with the error.
	writeAtomic(t, WorkspacePath(a), "{\"rules\": [\n  {\"action\": \"tool\", \"tool\": \"fetch\", \"decision\": \"maybe\"}]}")
	e = waitEvent(t, events, "a's broken edit", func(e Event) bool { return e.Workspace == a && e.Err != nil })
	if s := w.CurrentFor(a); !errors.As(e.Err, &fe) || fe.Line != 2 || fetchDecision(s.Policy) != Ask || s.Err == nil {
		t.Fatalf("after a's broken edit: %v, CurrentFor(a) %s err %v; want line 2 and the last good (ask)", e.Err, s.Policy.Decide(fetch), s.Err)
	}

	// An edit of the user file reloads the watcher's and b's.
	writeAtomic(t, user, `{"rules": [{"action": "model", "where": "cloud", "decision": "deny"}]}`)
	e = waitEvent(t, events, "b after the user edit", func(e Event) bool { return e.Workspace == b && e.Err == nil })
	if fetchDecision(e.Policy) != Allow || e.Policy.Decide(&Action{Kind: KindModel, Provider: "openai", Cloud: true}).Outcome != Deny {
		t.Fatalf("b after the user edit decides model %s", e.Policy.Decide(&Action{Kind: KindModel, Provider: "openai", Cloud: true}))
	}

	// Releasing every use stops watching: a's file may change unseen.
	relA()
	relA() // twice is once
	if len(w.InUse()) != 2 {
		t.Fatalf("InUse = %v after one of two releases of a, want a and b", w.InUse())
	}
	relA2()
	relB()
	if got := w.InUse(); len(got) != 0 {
		t.Fatalf("InUse = %v after every release, want none", got)
	}
	w.mu.Lock()
	watched := len(w.watched)
	w.mu.Unlock()
	if watched != 1 {
		t.Errorf("the watcher watches %d directories, want 1 (the user file's)", watched)
	}
}
