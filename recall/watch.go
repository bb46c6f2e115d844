package recall

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/internal/atomicfile"
	"github.com/keel-runtime/keel/internal/jsonfile"
	"github.com/keel-runtime/keel/internal/logkey"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/knowledge"
)

// WatchFile is the name of the file, in the data directory, that holds
// the directories the daemon keeps indexed.
const WatchFile = "knowledge-watch.json"

// DefaultDebounce is how long a Watcher waits after a change for more
// before it applies them.
const DefaultDebounce = 250 * time.Millisecond

// WatcherConfig configures a Watcher. Index and File are required.
type WatcherConfig struct {
	Index *knowledge.Index
	// File keeps the watched directories (WatchFile in the data
	// directory), so a restart watches them again.
	File string
	// Debounce; default DefaultDebounce.
	Debounce time.Duration
	// OnSync, when set, is called after each batch of changes is applied
	// (and after a watched directory's catch-up at Run), on the watch's
	// goroutine.
	OnSync func(Sync)
	// Logger; default discards.
	Logger *slog.Logger
}

// Sync is what one batch of changes did.
type Sync struct {
	// Added are the paths indexed again (files and new directories),
	// Forgotten those whose documents were forgotten (gone, or renamed
	// away), sorted.
	Added, Forgotten []string
	// Err joins what failed; the rest was applied.
	Err error
}

// watchEntry is a watched directory as the file keeps it.
type watchEntry struct {
	Dir    string   `json:"dir"`
	Scope  string   `json:"scope"`
	Labels []string `json:"labels,omitempty"`
}

type watchDoc struct {
	Version int          `json:"version"`
	Watches []watchEntry `json:"watches"`
}

// Watcher keeps directories indexed with fsnotify: files created,
// written, renamed and removed under them (recursively, new
// subdirectories included; hidden ones, node_modules and editor backups
// skipped) are added to or forgotten from their scope, a batch at a time
// once changes pause for Config.Debounce. Safe for concurrent use; Run
// owns its one goroutine.
type Watcher struct {
	cfg WatcherConfig
	log *slog.Logger
	fw  *fsnotify.Watcher

	mu      sync.Mutex
	watches []watchEntry
	errs    map[string]string // dir -> why it is not watched now
}

// NewWatcher reads cfg.File and makes the fsnotify watcher; Run watches.
func NewWatcher(cfg WatcherConfig) (*Watcher, error) {
	if cfg.Index == nil || cfg.File == "" {
		return nil, errors.New("recall: a Watcher needs Index and File")
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = DefaultDebounce
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	doc, err := jsonfile.Read[watchDoc](cfg.File, "docs/knowledge.md")
	if err != nil {
		return nil, err
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("recall: watch: %w", err)
	}
	return &Watcher{cfg: cfg, log: log, fw: fw, watches: doc.Watches, errs: map[string]string{}}, nil
}

// List returns the watched directories, with why one is not watched now.
func (w *Watcher) List() []protocol.KnowledgeWatch {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]protocol.KnowledgeWatch, 0, len(w.watches))
	for _, e := range w.watches {
		out = append(out, protocol.KnowledgeWatch{Dir: e.Dir, Scope: e.Scope, Labels: e.Labels, Error: w.errs[e.Dir]})
	}
	return out
}

// save writes the watched directories to the file. w.mu is held.
func (w *Watcher) save() error {
	b, err := json.MarshalIndent(watchDoc{Version: 1, Watches: w.watches}, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(w.cfg.File, bytes.NewReader(append(b, '\n')), 0o600)
}

// skipName reports whether a file or directory of this name is left out,
// as the store's Add leaves it out of a directory it walks.
func skipName(name string) bool {
	return strings.HasPrefix(name, ".") || name == "node_modules" || strings.HasSuffix(name, "~")
}

// addTree puts dir and its subdirectories under the fsnotify watcher.
func (w *Watcher) addTree(dir string) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == dir {
				return err
			}
			return nil
		}
		if !d.IsDir() {
			return nil
		}
		if path != dir && skipName(d.Name()) {
			return filepath.SkipDir
		}
		if err := w.fw.Add(path); err != nil {
			if path == dir {
				return err
			}
			w.log.Warn("knowledge: watch a subdirectory", logkey.Dir, path, logkey.Err, err)
		}
		return nil
	})
}

// Watch indexes dir into scope now and keeps it indexed, also after a
// restart, until Unwatch. A directory watched already is watched again
// with the new scope and labels. Errors: dir not an absolute directory
// (keel.ErrInvalid), the store's.
func (w *Watcher) Watch(ctx context.Context, dir string, scope knowledge.Scope, labels []string) (protocol.KnowledgeWatch, error) {
	dir = filepath.Clean(dir)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || !filepath.IsAbs(dir) {
		return protocol.KnowledgeWatch{}, fmt.Errorf("watch %s: not a directory: %w", dir, keel.ErrInvalid)
	}
	// Watched before it is read, so that nothing changed meanwhile is
	// missed.
	if err := w.addTree(dir); err != nil {
		return protocol.KnowledgeWatch{}, fmt.Errorf("watch %s: %w", dir, err)
	}
	e := watchEntry{Dir: dir, Scope: string(scope), Labels: labels}
	w.mu.Lock()
	i := slices.IndexFunc(w.watches, func(x watchEntry) bool { return x.Dir == dir })
	if i >= 0 {
		w.watches[i] = e
	} else {
		w.watches = append(w.watches, e)
	}
	delete(w.errs, dir)
	err := w.save()
	w.mu.Unlock()
	if err != nil {
		return protocol.KnowledgeWatch{}, fmt.Errorf("save the watched directories: %w", err)
	}
	if _, err := w.cfg.Index.Add(ctx, []string{dir}, knowledge.AddOptions{Scope: scope, Labels: labels, AddedBy: "watch"}); err != nil {
		return protocol.KnowledgeWatch{}, storeErr(err)
	}
	return protocol.KnowledgeWatch{Dir: dir, Scope: string(scope), Labels: labels}, nil
}

// Unwatch stops watching dir; what it indexed stays. Not watched wraps
// keel.ErrNotFound.
func (w *Watcher) Unwatch(dir string) error {
	dir = filepath.Clean(dir)
	w.mu.Lock()
	defer w.mu.Unlock()
	i := slices.IndexFunc(w.watches, func(x watchEntry) bool { return x.Dir == dir })
	if i < 0 {
		return fmt.Errorf("%s is not watched: %w", dir, keel.ErrNotFound)
	}
	w.watches = slices.Delete(w.watches, i, i+1)
	delete(w.errs, dir)
	for _, p := range w.fw.WatchList() {
		if p == dir || strings.HasPrefix(p, dir+string(filepath.Separator)) && w.rootOf(p) == nil {
			_ = w.fw.Remove(p)
		}
	}
	return w.save()
}

// rootOf returns the watch p is under (the deepest), or nil. w.mu is
// held.
func (w *Watcher) rootOf(p string) *watchEntry {
	var best *watchEntry
	for i := range w.watches {
		e := &w.watches[i]
		if (p == e.Dir || strings.HasPrefix(p, e.Dir+string(filepath.Separator))) && (best == nil || len(e.Dir) > len(best.Dir)) {
			best = e
		}
	}
	return best
}

// skipped reports whether p, under root, is left out (a hidden or
// node_modules directory on its way, an editor's backup).
func skipped(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	if err != nil {
		return true
	}
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		if part != "." && skipName(part) {
			return true
		}
	}
	return false
}

// Run watches the directories of the file (catching each up first: its
// changed files indexed, its deleted ones forgotten) and applies changes
// until ctx ends; then it closes the fsnotify watcher.
func (w *Watcher) Run(ctx context.Context) error {
	defer w.fw.Close()
	w.mu.Lock()
	start := slices.Clone(w.watches)
	w.mu.Unlock()
	for _, e := range start {
		w.catchUp(ctx, e)
	}
	pending := map[string]bool{}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.fw.Events:
			if !ok {
				return nil
			}
			if ev.Op == fsnotify.Chmod {
				continue
			}
			pending[filepath.Clean(ev.Name)] = true
			timer.Reset(w.cfg.Debounce)
		case err, ok := <-w.fw.Errors:
			if !ok {
				return nil
			}
			// Such as an overflow of the kernel's queue: catch up.
			w.log.Warn("knowledge: watch", logkey.Err, err)
			w.mu.Lock()
			all := slices.Clone(w.watches)
			w.mu.Unlock()
			for _, e := range all {
				w.catchUp(ctx, e)
			}
		case <-timer.C:
			batch := pending
			pending = map[string]bool{}
			w.apply(ctx, batch)
		}
	}
}

// catchUp watches e's directory again and brings its scope up to date
// with it: every file indexed (unchanged ones cost a hash), documents
// of files gone forgotten.
func (w *Watcher) catchUp(ctx context.Context, e watchEntry) {
	var s Sync
	if err := w.addTree(e.Dir); err != nil {
		w.mu.Lock()
		w.errs[e.Dir] = err.Error()
		w.mu.Unlock()
		w.log.Warn("knowledge: a watched directory cannot be watched now; the daemon tries again at its next start", logkey.Dir, e.Dir, logkey.Err, err)
		return
	}
	sc := knowledge.Scope(e.Scope)
	if _, err := w.cfg.Index.Add(ctx, []string{e.Dir}, knowledge.AddOptions{Scope: sc, Labels: e.Labels, AddedBy: "watch"}); err != nil {
		s.Err = errors.Join(s.Err, err)
	}
	s.Added = []string{e.Dir}
	gone, err := w.forgetGone(ctx, sc, e.Dir)
	s.Forgotten, s.Err = gone, errors.Join(s.Err, err)
	w.synced(s)
}

// forgetGone forgets the documents of scope sc under dir (dir itself
// included) whose files no longer exist, and returns their sources.
func (w *Watcher) forgetGone(ctx context.Context, sc knowledge.Scope, dir string) ([]string, error) {
	docs, err := w.cfg.Index.List(ctx, sc)
	if err != nil {
		return nil, err
	}
	var gone []string
	var errs error
	for _, d := range docs {
		if d.Source != dir && !strings.HasPrefix(d.Source, dir+string(filepath.Separator)) {
			continue
		}
		if _, err := os.Lstat(d.Source); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if _, err := w.cfg.Index.Forget(ctx, knowledge.ForgetSelector{ID: d.ID}); err != nil && !errors.Is(err, keel.ErrNotFound) {
			errs = errors.Join(errs, err)
			continue
		}
		gone = append(gone, d.Source)
	}
	slices.Sort(gone)
	return gone, errs
}

// apply applies one batch of changed paths: a path that exists is
// indexed (a new directory watched and indexed whole), one that does not
// (removed, or renamed away: its new name is a path of its own) has its
// documents forgotten, with everything under it.
func (w *Watcher) apply(ctx context.Context, batch map[string]bool) {
	paths := make([]string, 0, len(batch))
	for p := range batch {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	var s Sync
	if from, to, ok := w.renamed(ctx, paths); ok {
		// Moved in the store, so an add of its new name finds its
		// content unchanged: nothing is chunked or embedded again.
		if err := w.cfg.Index.Rename(ctx, from, to); err != nil {
			s.Err = errors.Join(s.Err, fmt.Errorf("rename %s to %s: %w", from, to, err))
		} else {
			s.Forgotten = append(s.Forgotten, from)
			paths = slices.DeleteFunc(paths, func(p string) bool { return p == from })
		}
	}
	for _, p := range paths {
		w.mu.Lock()
		e := w.rootOf(p)
		var ent watchEntry
		if e != nil {
			ent = *e
		}
		w.mu.Unlock()
		if e == nil || skipped(ent.Dir, p) {
			continue
		}
		sc := knowledge.Scope(ent.Scope)
		fi, err := os.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// Removed, or renamed away (its new name is a path of its
			// own): it and everything under it go, in one forget.
			if _, err := w.cfg.Index.Forget(ctx, knowledge.ForgetSelector{Path: p}); err != nil && !errors.Is(err, keel.ErrNotFound) {
				s.Err = errors.Join(s.Err, fmt.Errorf("forget %s: %w", p, err))
			} else if err == nil {
				s.Forgotten = append(s.Forgotten, p)
			}
			continue
		case err != nil:
			s.Err = errors.Join(s.Err, err)
			continue
		case fi.IsDir():
			if err := w.addTree(p); err != nil {
				s.Err = errors.Join(s.Err, err)
			}
		}
		if _, err := w.cfg.Index.Add(ctx, []string{p}, knowledge.AddOptions{Scope: sc, Labels: ent.Labels, AddedBy: "watch"}); err != nil {
			s.Err = errors.Join(s.Err, fmt.Errorf("index %s: %w", p, err))
			continue
		}
		s.Added = append(s.Added, p)
	}
	if len(s.Added) == 0 && len(s.Forgotten) == 0 && s.Err == nil {
		return
	}
	slices.Sort(s.Forgotten)
	w.synced(s)
}

// renamed recognizes a rename in a batch of changed paths: exactly one
// path gone that the store holds documents at (or under), and exactly
// one path new to the store, in the same watched directory, both files
// or both directories (as far as the store tells). fsnotify reports a
// rename as the old name gone and the new one created, unpaired.
func (w *Watcher) renamed(ctx context.Context, paths []string) (from, to string, ok bool) {
	type cand struct {
		path string
		root string
	}
	var gone, fresh []cand
	for _, p := range paths {
		w.mu.Lock()
		e := w.rootOf(p)
		root := ""
		if e != nil {
			root = e.Dir
		}
		w.mu.Unlock()
		if e == nil || skipped(root, p) {
			continue
		}
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			gone = append(gone, cand{p, root})
		} else if err == nil {
			fresh = append(fresh, cand{p, root})
		}
	}
	if len(gone) != 1 || len(fresh) != 1 || gone[0].root != fresh[0].root {
		return "", "", false
	}
	w.mu.Lock()
	sc := knowledge.Scope(w.rootOf(gone[0].root).Scope)
	w.mu.Unlock()
	docs, err := w.cfg.Index.List(ctx, sc)
	if err != nil {
		return "", "", false
	}
	at := func(p string) (file, under bool) {
		for _, d := range docs {
			file = file || d.Source == p
			under = under || strings.HasPrefix(d.Source, p+string(filepath.Separator))
		}
		return file, under
	}
	oldFile, oldDir := at(gone[0].path)
	newFile, newDir := at(fresh[0].path)
	fi, err := os.Lstat(fresh[0].path)
	if err != nil || newFile || newDir || (oldFile && fi.IsDir()) || (oldDir && !fi.IsDir()) || !oldFile && !oldDir {
		return "", "", false
	}
	return gone[0].path, fresh[0].path, true
}

func (w *Watcher) synced(s Sync) {
	if s.Err != nil {
		w.log.Warn("knowledge: apply the changes of watched directories", logkey.Err, s.Err)
	}
	if w.cfg.OnSync != nil {
		w.cfg.OnSync(s)
	}
}
