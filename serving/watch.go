package serving

import (
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watchQuiet is how long the adapter directories must be quiet before a
// rescan: a file copied in place sends a burst of write events, and reading
// it mid-copy would only be refused (a truncated GGUF) and read again.
const watchQuiet = 50 * time.Millisecond

// watcher rescans the adapter catalogue when files change, with fsnotify
// (inotify on Linux) on AdapterDir and on the directories of every served
// adapter's file, symlinks resolved. Directory watches see files written in
// place, renamed over, deleted, and symlinks swapped (including a swapped
// symlink to a directory, as Kubernetes volumes do); a rescan compares each
// file's stamp and content hash, so events that change nothing are cheap.
type watcher struct {
	e    *Engine
	w    *fsnotify.Watcher
	mu   sync.Mutex
	dirs map[string]bool
	err  error
	stop chan struct{}
	done chan struct{}
}

func (e *Engine) startWatch() *watcher {
	wt := &watcher{e: e, dirs: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		wt.err = err
		close(wt.done)
		return wt
	}
	wt.w = fw
	if e.cfg.AdapterDir != "" {
		wt.add(e.cfg.AdapterDir)
	}
	wt.trackServed()
	go wt.run()
	return wt
}

// add watches dir once; a failure is kept for Stats.WatchError.
func (wt *watcher) add(dir string) {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	if wt.w == nil || wt.dirs[dir] {
		return
	}
	if err := wt.w.Add(dir); err != nil {
		wt.err = err
		return
	}
	wt.dirs[dir] = true
}

// track watches the directory of path and of what it resolves to.
func (wt *watcher) track(path string) {
	wt.add(filepath.Dir(path))
	if r, err := filepath.EvalSymlinks(path); err == nil {
		wt.add(filepath.Dir(r))
	}
}

// trackServed tracks every served adapter's file.
func (wt *watcher) trackServed() {
	for _, a := range wt.e.adapters.list() {
		wt.track(a.Path)
	}
}

func (wt *watcher) run() {
	defer close(wt.done)
	var quiet <-chan time.Time
	for {
		select {
		case <-wt.stop:
			return
		case _, ok := <-wt.w.Events:
			if !ok {
				return
			}
			quiet = time.After(watchQuiet)
		case err, ok := <-wt.w.Errors:
			if !ok {
				return
			}
			wt.mu.Lock()
			wt.err = err
			wt.mu.Unlock()
			quiet = time.After(watchQuiet) // events may have been lost
		case <-quiet:
			quiet = nil
			_ = wt.e.adapters.scan(wt.e.cfg.AdapterDir)
			wt.trackServed()
			wt.e.poke()
		}
	}
}

func (wt *watcher) close() {
	if wt.w == nil {
		return
	}
	close(wt.stop)
	wt.w.Close()
	<-wt.done
}

func (wt *watcher) errString() string {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	if wt.err == nil {
		return ""
	}
	return wt.err.Error()
}
