package policies

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
)

// watcher reloads the engine's policy directory after file-system events
// (fsnotify: inotify on Linux). It watches the directory, every folder
// read below it, the folders the loaded files really live in (the targets
// of symlinks: a ConfigMap's "..<timestamp>" folder) and the directory's
// parent (to see the directory itself swapped or recreated), and re-resolves
// that set after every reload. Events are debounced: a burst (an editor's
// rename dance, a ConfigMap swap) causes one reload after Options.Debounce
// of quiet. Reloads compare content hashes, so events that change nothing
// compile nothing.
type watcher struct {
	e  *Engine
	fw *fsnotify.Watcher

	mu      sync.Mutex
	watched map[string]bool
	root    string // absolute Dir
	parent  string // its parent directory
	added   bool   // update added a watch since the last reload
}

// newWatcher starts watching the directory and its parent, before the
// first read, so that nothing written in between is missed. On error the
// returned watcher is inert (close is still safe).
func newWatcher(e *Engine) (*watcher, error) {
	w := &watcher{e: e, watched: map[string]bool{}}
	root, err := filepath.Abs(e.opts.Dir)
	if err != nil {
		return w, err
	}
	w.root, w.parent = root, filepath.Dir(root)
	if w.fw, err = fsnotify.NewWatcher(); err != nil {
		return w, err
	}
	if err := w.fw.Add(root); err != nil {
		w.close()
		w.fw = nil
		return w, err
	}
	w.watched[root] = true
	if err := w.fw.Add(w.parent); err == nil {
		w.watched[w.parent] = true
	}
	return w, nil
}

func (w *watcher) close() {
	if w != nil && w.fw != nil {
		_ = w.fw.Close()
	}
}

// update re-resolves the watch set from the snapshot just read.
func (w *watcher) update(dir string, s *snapshot) {
	if w.fw == nil {
		return
	}
	want := map[string]bool{w.root: true, w.parent: true}
	for _, d := range s.dirs {
		want[resolved(filepath.Join(w.root, d))] = true
	}
	for _, n := range s.names {
		want[filepath.Dir(resolved(filepath.Join(w.root, n)))] = true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for p := range w.watched {
		if !want[p] {
			_ = w.fw.Remove(p) // fails when the folder is gone; fsnotify dropped it already
			delete(w.watched, p)
		}
	}
	for p := range want {
		if !w.watched[p] {
			if err := w.fw.Add(p); err != nil {
				w.e.log.Warn("policy folder not watched", zap.String("dir", dir), zap.String("folder", p), zap.Error(err))
				continue
			}
			w.watched[p] = true
			w.added = true
		}
	}
}

// forget drops a watched folder that was removed or renamed (fsnotify drops
// its watch), so that update adds it again when it comes back.
func (w *watcher) forget(p string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.watched[p] {
		_ = w.fw.Remove(p)
		delete(w.watched, p)
	}
}

// resolved resolves symlinks in p; p itself when that fails.
func resolved(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}

// relevant reports whether an event may change what is loaded: anything in
// a watched folder except the parent's other entries.
func (w *watcher) relevant(ev fsnotify.Event) bool {
	return filepath.Dir(ev.Name) != w.parent || ev.Name == w.root || w.parent == w.root
}

// maxRetries bounds the reloads tried again because the directory was
// changing while it was read (or could not be read), without a new event.
const maxRetries = 5

func (w *watcher) run(ctx context.Context) {
	defer w.close()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	retries := 0
	w.mu.Lock()
	if w.added { // folders found by the first read: read again once watched
		w.added = false
		debounce.Reset(w.e.opts.Debounce)
	}
	w.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.e.closed:
			return
		case ev, ok := <-w.fw.Events:
			if !ok {
				return
			}
			if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
				w.forget(ev.Name)
			}
			if w.relevant(ev) {
				retries = 0
				debounce.Reset(w.e.opts.Debounce)
			}
		case err, ok := <-w.fw.Errors:
			if !ok {
				return
			}
			// An overflowed queue lost events: read again to be sure.
			w.e.log.Warn("policy directory watch error; reading it again", zap.String("dir", w.e.opts.Dir), zap.Error(err))
			debounce.Reset(w.e.opts.Debounce)
		case <-debounce.C:
			err := w.e.Reload(ctx)
			w.mu.Lock()
			added := w.added
			w.added = false
			w.mu.Unlock()
			var rerr *readError
			switch {
			case (errors.Is(err, errChanging) || errors.As(err, &rerr)) && retries < maxRetries:
				retries++
				debounce.Reset(w.e.opts.Debounce)
			case added:
				// Files written in a folder before it was watched would be
				// missed: read once more now that it is.
				debounce.Reset(w.e.opts.Debounce)
			}
		}
	}
}

// readError is a failure to read the policy directory (not to compile it):
// possibly transient, such as a symlink left dangling mid-swap.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }
