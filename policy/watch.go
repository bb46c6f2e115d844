package policy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fsnotify/fsnotify"
)

// WatcherConfig configures a Watcher. The zero value watches nothing.
type WatcherConfig struct {
	// Paths are the layer files to load and watch. A file that does not
	// exist is no file for its layer until it is created (its nearest
	// existing ancestor directory is watched meanwhile).
	Paths Paths
	// Options are passed to Compile.
	Options Options
	// OnEvent, if set, is called after each reload that changed what
	// the files hold: with the new policy, or with the error of a reload
	// that failed (the last good policy stays in force). It is called on
	// the watcher's goroutine, one event at a time; it must not call
	// Close.
	OnEvent func(Event)
}

// Event is the outcome of one reload.
type Event struct {
	// Workspace is the workspace root whose policy this is (one a run
	// Uses); "" is the policy of the watcher's own files, the one of runs
	// that name no workspace. A change to the managed or user file
	// reports an event for "" and one for each workspace in use.
	Workspace string
	// Policy is the policy in force after the reload: the new one, or
	// the last good one when Err is set.
	Policy *Policy
	// Version numbers the policies a watcher has put in force, from 1
	// (the one NewWatcher loaded), across its workspaces: a new policy
	// of any of them gets the next number. A failed reload does not
	// change it.
	Version uint64
	// Err is why the reload failed: a read error or the files' errors
	// (*FileError values, each with file and line).
	Err error
}

// Snapshot is the policy in force with its version, as a decision
// should journal it (Version and Policy.Digest()).
type Snapshot struct {
	Policy  *Policy
	Version uint64
	// Err is set while the files on disk do not load: the error of the
	// latest reload, which kept Policy in force (for keel doctor).
	Err error
}

// Watcher keeps the policy of a set of layer files current: it reloads
// them when they change and keeps the last good policy when a reload
// fails. It also keeps the policy of each workspace a run uses (Use):
// its files with the workspace's .keel/policy.json added, watched while
// in use, with one fsnotify watcher and one goroutine for all of them.
// Its methods are safe for concurrent use. NewWatcher starts one
// goroutine; Close stops it and waits for it.
type Watcher struct {
	cfg    WatcherConfig
	fsw    *fsnotify.Watcher
	cur    atomic.Pointer[Snapshot]
	ws     atomic.Pointer[map[string]*wsLayer] // copied on write, under mu
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	// mu serializes reloads, Use and releases; it guards the fields
	// below.
	mu       sync.Mutex
	watched  map[string]bool
	lastSeen string // digest of the files last read, good or bad
	version  uint64 // the last version put in force
}

// wsLayer is a workspace in use: its policy in force and how many use it.
type wsLayer struct {
	root     string
	path     string // WorkspacePath(root)
	users    int
	lastSeen string // digest of its file last read, good or bad
	cur      atomic.Pointer[Snapshot]
}

// NewWatcher loads the files in cfg.Paths and starts watching them. It
// fails if they do not load: there is no last good policy to keep yet.
func NewWatcher(cfg WatcherConfig) (*Watcher, error) {
	files, err := ReadFiles(cfg.Paths)
	if err != nil {
		return nil, err
	}
	p, err := Compile(cfg.Options, files...)
	if err != nil {
		return nil, err
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("policy: watch: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watcher{cfg: cfg, fsw: fsw, cancel: cancel, done: make(chan struct{}), watched: map[string]bool{}, lastSeen: digest(files), version: 1}
	w.cur.Store(&Snapshot{Policy: p, Version: 1})
	w.ws.Store(&map[string]*wsLayer{})
	if err := w.arm(); err != nil {
		cancel()
		fsw.Close()
		return nil, err
	}
	go w.run(ctx)
	return w, nil
}

// Current returns the policy in force, its version, and the error that
// keeps newer files from being in force, if any.
func (w *Watcher) Current() Snapshot { return *w.cur.Load() }

// Close stops watching and waits for the watcher's goroutine to end. It
// is safe to call more than once.
func (w *Watcher) Close() error {
	var err error
	w.once.Do(func() {
		w.cancel()
		err = w.fsw.Close()
		<-w.done
	})
	return err
}

// each calls f with every file the watcher watches: its layer files and
// the workspace file of each workspace in use. Called under mu.
func (w *Watcher) each(f func(string)) {
	w.cfg.Paths.each(func(_ Layer, p string) { f(p) })
	for _, l := range *w.ws.Load() {
		f(l.path)
	}
}

// arm watches, for each file (see each), its directory or, while that
// does not exist, the nearest ancestor that does, and stops watching the
// directories no file needs any longer. Called under mu.
func (w *Watcher) arm() error {
	var errs []error
	need := map[string]bool{}
	w.each(func(p string) {
		dir := filepath.Dir(p)
		for {
			if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
				break
			} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("policy: watch %s: %w", dir, err))
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				return
			}
			dir = parent
		}
		need[dir] = true
		if w.watched[dir] {
			return
		}
		if err := w.fsw.Add(dir); err != nil {
			errs = append(errs, fmt.Errorf("policy: watch %s: %w", dir, err))
			return
		}
		w.watched[dir] = true
	})
	for dir := range w.watched {
		if !need[dir] {
			_ = w.fsw.Remove(dir) // fails only for a directory already gone, which unwatched itself
			delete(w.watched, dir)
		}
	}
	return errors.Join(errs...)
}

// relevant reports whether a change to name can change a watched file:
// it is one, or a directory on the way to one. Called under mu.
func (w *Watcher) relevant(name string) bool {
	name = filepath.Clean(name)
	found := false
	w.each(func(p string) {
		p = filepath.Clean(p)
		if p == name || strings.HasPrefix(p, name+string(filepath.Separator)) {
			found = true
		}
	})
	return found
}

func (w *Watcher) run(ctx context.Context) {
	defer close(w.done)
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			w.reload(ev.Name)
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			w.emit(Event{Policy: w.Current().Policy, Version: w.Current().Version, Err: fmt.Errorf("policy: watch: %w", err)})
		}
	}
}

// reload reads the files again if name is one of them (or on the way
// to one) and, for the watcher's own files and each workspace in use
// whose files changed, puts their policy in force or reports why it
// cannot. The events are emitted after mu is released, in order (only
// the watcher's goroutine reloads).
func (w *Watcher) reload(name string) {
	w.mu.Lock()
	if !w.relevant(name) {
		w.mu.Unlock()
		return
	}
	armErr := w.arm()
	var evs []Event
	baseChanged, baseEv := w.reloadBase(armErr)
	if baseEv != nil {
		evs = append(evs, *baseEv)
	}
	for _, l := range *w.ws.Load() {
		if ev := w.reloadWorkspace(l, baseChanged, baseEv != nil && baseEv.Err != nil); ev != nil {
			evs = append(evs, *ev)
		}
	}
	w.mu.Unlock()
	for _, e := range evs {
		w.emit(e)
	}
}

// reloadBase reloads the watcher's own files: changed reports a new
// policy in force; ev is the event to report, nil when nothing changed.
// Called under mu.
func (w *Watcher) reloadBase(armErr error) (changed bool, ev *Event) {
	files, err := ReadFiles(w.cfg.Paths)
	if err == nil {
		d := digest(files)
		if d == w.lastSeen && armErr == nil {
			return false, nil
		}
		w.lastSeen = d
		var p *Policy
		if p, err = Compile(w.cfg.Options, files...); err == nil {
			w.version++
			w.cur.Store(&Snapshot{Policy: p, Version: w.version})
			return true, &Event{Policy: p, Version: w.version, Err: armErr}
		}
	} else {
		w.lastSeen = ""
	}
	cur := w.Current()
	w.cur.Store(&Snapshot{Policy: cur.Policy, Version: cur.Version, Err: err})
	return false, &Event{Policy: cur.Policy, Version: cur.Version, Err: err}
}

// reloadWorkspace reloads the workspace file of l if it changed, or
// combines it again with the watcher's files if those changed
// (baseChanged) or stopped loading (baseFailed). It returns the event to
// report, nil when nothing changed. Called under mu.
func (w *Watcher) reloadWorkspace(l *wsLayer, baseChanged, baseFailed bool) *Event {
	files, err := ReadFiles(Paths{Workspace: l.path})
	if err == nil {
		d := digest(files)
		if d == l.lastSeen && !baseChanged {
			if !baseFailed {
				return nil
			}
			// The watcher's files stopped loading: the same policy stays,
			// and says why newer files are not in force.
			cur, base := l.cur.Load(), w.Current()
			l.cur.Store(&Snapshot{Policy: cur.Policy, Version: cur.Version, Err: base.Err})
			return &Event{Workspace: l.root, Policy: cur.Policy, Version: cur.Version, Err: base.Err}
		}
		l.lastSeen = d
		var next Snapshot
		if next, err = w.combine(files); err == nil {
			l.cur.Store(&next)
			return &Event{Workspace: l.root, Policy: next.Policy, Version: next.Version, Err: next.Err}
		}
	} else {
		l.lastSeen = ""
	}
	cur := l.cur.Load()
	l.cur.Store(&Snapshot{Policy: cur.Policy, Version: cur.Version, Err: err})
	return &Event{Workspace: l.root, Policy: cur.Policy, Version: cur.Version, Err: err}
}

// combine returns the policy of the watcher's files in force with a
// workspace's files added: the watcher's snapshot itself when there are
// none, else a new version. Called under mu.
func (w *Watcher) combine(ws []LayerFile) (Snapshot, error) {
	base := w.Current()
	if len(ws) == 0 {
		return base, nil
	}
	p, err := Compile(w.cfg.Options, append(base.Policy.Files(), ws...)...)
	if err != nil {
		return Snapshot{}, err
	}
	w.version++
	return Snapshot{Policy: p, Version: w.version, Err: base.Err}, nil
}

// Use puts the workspace layer of the workspace at root (its
// .keel/policy.json; a missing file is no layer) in force for the runs
// that name root, and watches it until every use is released: the first
// Use of a root loads and watches its file, later ones share it, and the
// release of the last stops watching it, so a watcher holds only the
// workspaces in use. It fails, with the file's *FileError (file and
// line), when the file with the watcher's files in force does not load.
// root should be absolute and clean. The release func is safe to call
// more than once.
func (w *Watcher) Use(root string) (release func(), err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := *w.ws.Load()
	l := m[root]
	if l == nil {
		l = &wsLayer{root: root, path: WorkspacePath(root)}
		files, err := ReadFiles(Paths{Workspace: l.path})
		if err != nil {
			return nil, err
		}
		snap, err := w.combine(files)
		if err != nil {
			return nil, err
		}
		l.cur.Store(&snap)
		l.lastSeen = digest(files)
		next := make(map[string]*wsLayer, len(m)+1)
		for k, v := range m {
			next[k] = v
		}
		next[root] = l
		w.ws.Store(&next)
		if err := w.arm(); err != nil {
			// Unwatched, the layer would never reload: refuse it.
			w.ws.Store(&m)
			_ = w.arm()
			return nil, err
		}
	}
	l.users++
	var once sync.Once
	return func() { once.Do(func() { w.release(l) }) }, nil
}

func (w *Watcher) release(l *wsLayer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l.users--; l.users > 0 {
		return
	}
	m := *w.ws.Load()
	next := make(map[string]*wsLayer, len(m))
	for k, v := range m {
		if v != l {
			next[k] = v
		}
	}
	w.ws.Store(&next)
	_ = w.arm() // removing watches only
}

// CurrentFor returns the policy in force for runs of the workspace at
// root: Current for "", else, while root is in use (Use), its layer with
// the watcher's files. For a root not in use it loads the files once,
// unwatched, with Version 0 (no version was put in force), or returns
// the watcher's policy with Err set when they do not load. Safe for
// concurrent use; lock-free for a root in use.
func (w *Watcher) CurrentFor(root string) Snapshot {
	if root == "" {
		return w.Current()
	}
	if l := (*w.ws.Load())[root]; l != nil {
		return *l.cur.Load()
	}
	base := w.Current()
	files, err := ReadFiles(Paths{Workspace: WorkspacePath(root)})
	if err == nil && len(files) == 0 {
		return base
	}
	if err == nil {
		var p *Policy
		if p, err = Compile(w.cfg.Options, append(base.Policy.Files(), files...)...); err == nil {
			return Snapshot{Policy: p, Err: base.Err}
		}
	}
	return Snapshot{Policy: base.Policy, Version: base.Version, Err: err}
}

// InUse returns the workspace roots in use (Use), for a check that
// nothing leaks.
func (w *Watcher) InUse() []string {
	var roots []string
	for root := range *w.ws.Load() {
		roots = append(roots, root)
	}
	return roots
}

func (w *Watcher) emit(e Event) {
	if w.cfg.OnEvent != nil {
		w.cfg.OnEvent(e)
	}
}
