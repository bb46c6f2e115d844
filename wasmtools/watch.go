package wasmtools

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/keel-runtime/keel/internal/logkey"
)

// Reload rescans the tool directory: new and changed NAME.wasm files are
// compiled and loaded, deleted ones dropped, unchanged ones kept as they
// are. The new set replaces the old one atomically; calls already running
// finish on the tool they started with. A file that fails to load (for
// example one still being written) is skipped as at Open. Reload reports
// whether the set of tools or any tool's content changed. It waits for a
// load in progress (the first, or another Reload), unless ctx ends or the
// registry is closed first.
func (r *Registry) Reload(ctx context.Context) (changed bool, err error) {
	if err := r.lockLoad(ctx); err != nil {
		return false, fmt.Errorf("wasmtools: reload: %w", err)
	}
	defer r.unlockLoad()
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return false, errors.New("wasmtools: reload: registry closed")
	}
	entries, err := os.ReadDir(r.cfg.Dir)
	if err != nil {
		return false, fmt.Errorf("wasmtools: reload: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(r.ctx, cancel)() // Close stops the load

	prev := r.set.Load()
	next, err := r.loadDir(ctx, entries, prev)
	if err != nil {
		return false, err
	}
	changed = !slices.Equal(prev.names, next.names)
	for name, t := range prev.tools {
		if next.tools[name] != t {
			r.retired = append(r.retired, t)
			if t.pool != nil {
				// Its idle instances are no use now; calls still
				// running on it close theirs when they finish.
				t.pool.close(ctx)
			}
			changed = true
		}
	}
	r.set.Store(next)
	if changed && r.cfg.OnChange != nil {
		r.cfg.OnChange()
	}
	return changed, nil
}

// Watch reloads the registry whenever a .wasm or .manifest.json file in
// the tool directory is created, written, renamed or removed, waiting
// for quiet (settle, default 300ms) first so a file being copied in is
// loaded once, complete. onChange, when not nil, is called after each
// reload that changed the tools. Watch blocks until ctx is done and
// returns nil then; the caller owns the goroutine it runs in. Watch
// rescans once as soon as it is watching, so nothing changed before it
// started is missed.
func (r *Registry) Watch(ctx context.Context, settle time.Duration, onChange func([]Tool)) error {
	if settle <= 0 {
		settle = 300 * time.Millisecond
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("wasmtools: watch: %w", err)
	}
	defer w.Close()
	if err := w.Add(r.cfg.Dir); err != nil {
		return fmt.Errorf("wasmtools: watch %s: %w", r.cfg.Dir, err)
	}
	// Rescan once the watch is in place: a change made between Open (or
	// the call to Watch) and now produced no event.
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if strings.HasSuffix(ev.Name, ".wasm") || strings.HasSuffix(ev.Name, ".manifest.json") {
				timer.Reset(settle)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			r.log.Warn("wasmtools: watch error; rescanning", logkey.Err, err)
			timer.Reset(settle)
		case <-timer.C:
			changed, err := r.Reload(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				r.log.Error("wasmtools: reload failed", logkey.Err, err)
				continue
			}
			if changed {
				r.log.Info("wasmtools: tools reloaded", logkey.Tools, len(r.set.Load().names))
				if onChange != nil {
					onChange(r.Tools())
				}
			}
		}
	}
}
