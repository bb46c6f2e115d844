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
	// Policy is the policy in force after the reload: the new one, or
	// the last good one when Err is set.
	Policy *Policy
	// Version numbers the policies a watcher has put in force, from 1
	// (the one NewWatcher loaded); a failed reload does not change it.
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
// fails. Its methods are safe for concurrent use. NewWatcher starts one
// goroutine; Close stops it and waits for it.
type Watcher struct {
	cfg    WatcherConfig
	fsw    *fsnotify.Watcher
	cur    atomic.Pointer[Snapshot]
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	// Owned by the watcher's goroutine after NewWatcher returns.
	watched  map[string]bool
	lastSeen string // digest of the files last read, good or bad
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
	w := &Watcher{cfg: cfg, fsw: fsw, cancel: cancel, done: make(chan struct{}), watched: map[string]bool{}, lastSeen: digest(files)}
	w.cur.Store(&Snapshot{Policy: p, Version: 1})
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

// arm watches, for each layer file, its directory or, while that does
// not exist, the nearest ancestor that does.
func (w *Watcher) arm() error {
	var errs []error
	w.cfg.Paths.each(func(_ Layer, p string) {
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
		if w.watched[dir] {
			return
		}
		if err := w.fsw.Add(dir); err != nil {
			errs = append(errs, fmt.Errorf("policy: watch %s: %w", dir, err))
			return
		}
		w.watched[dir] = true
	})
	return errors.Join(errs...)
}

// relevant reports whether a change to name can change a layer file:
// it is one, or a directory on the way to one.
func (w *Watcher) relevant(name string) bool {
	name = filepath.Clean(name)
	found := false
	w.cfg.Paths.each(func(_ Layer, p string) {
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
			if w.relevant(ev.Name) {
				w.reload()
			}
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			w.emit(Event{Policy: w.Current().Policy, Version: w.Current().Version, Err: fmt.Errorf("policy: watch: %w", err)})
		}
	}
}

// reload reads the files again and, if they changed, puts their policy
// in force or reports why it cannot.
func (w *Watcher) reload() {
	armErr := w.arm()
	files, err := ReadFiles(w.cfg.Paths)
	if err == nil {
		d := digest(files)
		if d == w.lastSeen && armErr == nil {
			return
		}
		w.lastSeen = d
		var p *Policy
		if p, err = Compile(w.cfg.Options, files...); err == nil {
			cur := w.Current()
			next := &Snapshot{Policy: p, Version: cur.Version + 1}
			w.cur.Store(next)
			w.emit(Event{Policy: p, Version: next.Version, Err: armErr})
			return
		}
	} else {
		w.lastSeen = ""
	}
	cur := w.Current()
	w.cur.Store(&Snapshot{Policy: cur.Policy, Version: cur.Version, Err: err})
	w.emit(Event{Policy: cur.Policy, Version: cur.Version, Err: err})
}

func (w *Watcher) emit(e Event) {
	if w.cfg.OnEvent != nil {
		w.cfg.OnEvent(e)
	}
}
