package serving

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ollama/ollama/fs/ggml"
	"golang.org/x/sys/unix"

	"github.com/molly-gateway/molly/serving/gguf"
	"github.com/molly-gateway/molly/serving/llama"
)

// AdapterState is where an adapter version lives (docs/architecture.md).
type AdapterState string

const (
	// Cold: only on disk.
	Cold AdapterState = "cold"
	// Warm: file bytes in host memory, header validated against the base.
	Warm AdapterState = "warm"
	// Hot: initialised in llama.cpp, tensors resident, ready to apply.
	Hot AdapterState = "hot"
)

// AdapterInfo describes the served version of one registered adapter.
//
// An adapter version is identified by its content: Version is the SHA-256 of
// the file's bytes, and BaseChecksum and Quantization say what it was made
// for. Replacing the file (in place, by rename or by swapping a symlink)
// registers a new version; requests already running finish on the version
// they started with, and prefix-cache KV is only reused under the version
// that computed it.
type AdapterInfo struct {
	Name         string       `json:"name"`
	Path         string       `json:"path"`
	Version      string       `json:"version"`                 // "sha256:<64 hex digits>" of the file
	BaseChecksum string       `json:"base_checksum,omitempty"` // adapter.base_checksum, "" if the file has none
	Quantization string       `json:"quantization"`            // ggml type of the LoRA matrices, e.g. "f32"
	Loaded       time.Time    `json:"loaded"`                  // when this version was registered
	State        AdapterState `json:"state"`
	Bytes        int64        `json:"bytes"`     // file size
	HotBytes     int64        `json:"hot_bytes"` // resident tensor bytes while hot, else 0
	Uses         int          `json:"uses"`      // requests served by this version
	Hits         int          `json:"hits"`      // of Uses, those that found it hot (no load): Hits/Uses is the hit rate
	Running      int          `json:"running"`   // requests running on this version
	// Draining lists older versions of this name that still have running
	// requests.
	Draining []string      `json:"draining,omitempty"`
	LoadTime time.Duration `json:"load_time_ns"` // last warm/cold → hot time
}

// ErrAdapterRefused wraps every refusal of an adapter that does not fit the
// loaded base model (architecture, tensor shapes or base checksum).
var ErrAdapterRefused = errors.New("adapter refused")

// errRetired means a version was replaced or removed before it could be
// pinned; admission looks the name up again.
var errRetired = errors.New("adapter version retired")

// errVersionGone means a version's bytes are neither in memory nor on disk any
// more (its file now holds other content).
var errVersionGone = errors.New("adapter version no longer on disk")

// adapterEntry is one adapter version.
type adapterEntry struct {
	id           uint64 // unique per version; orders batches by adapter
	name, path   string
	version      string // "sha256:<hex>"
	baseChecksum string
	quant        string
	invocation   []int32 // aLoRA invocation tokens (alora.go); nil: plain LoRA
	loaded       time.Time
	size         int64
	data         []byte         // warm bytes (validated), nil when cold
	hot          *llama.Adapter // nil unless hot
	hotBytes     int64
	uses         int
	hits         int // uses that found the version hot
	lastUsed     time.Time
	loadTime     time.Duration // last cold→hot (or warm→hot) time
	pins         int           // running requests
	retired      bool          // replaced or removed: never given to new requests
}

func (a *adapterEntry) state() AdapterState {
	switch {
	case a.hot != nil:
		return Hot
	case a.data != nil:
		return Warm
	}
	return Cold
}

// reloadCost is the expected cost of evicting a: how often it is used, how
// recently, times how long it takes to bring back (S-LoRA's observation that
// adapter loading dominates when the set does not fit; the score follows
// GreedyDual-style cost-aware caching, Cao & Irani, USITS'97). Lower scores
// are evicted first; a retired version costs nothing.
func (a *adapterEntry) reloadCost(now time.Time) float64 {
	if a.retired {
		return 0
	}
	age := now.Sub(a.lastUsed).Seconds()
	lt := math.Max(a.loadTime.Seconds(), 1e-4)
	return float64(a.uses+1) / (1 + age) * lt
}

// fileStamp identifies what a path resolved to when last read (symlinks
// followed), so unchanged files are not read and hashed again.
type fileStamp struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

func stampOf(path string) (fileStamp, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	fs := fileStamp{size: st.Size(), mtime: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		fs.dev, fs.ino = uint64(sys.Dev), sys.Ino
	}
	return fs, nil
}

// adapterManager keeps the adapter catalogue (name → served version) and the
// hot/warm/cold states. Metadata is guarded by mu; llama.cpp load and free
// run only on the scheduler goroutine (pin, demote, collect), because a
// version may be in use by a decode.
//
// Catalogue rules. A name's served version changes when its file's content
// changes (noticed by the directory watch, a rescan, or a request for an
// unknown name). DELETE (remove) tombstones the name: the folder scan does
// not bring it back, even if its file changes, until the adapter is added
// again through the API (add) or its file leaves the folder (a file that
// appears later under that name is a new adapter). Tombstones live in memory:
// after a restart the folder is the truth again, so delete the file to remove
// an adapter for good.
type adapterManager struct {
	mu        sync.Mutex
	model     *llama.Model
	arch      string
	checksum  string
	shapes    map[string][]uint64
	hotBudget int64
	warmBudg  int64
	entries   map[string]*adapterEntry // served versions
	retired   []*adapterEntry          // older versions still pinned or hot
	stamps    map[string]fileStamp     // per name: the file behind the served version
	deleted   map[string]bool          // tombstones (see the type comment)
	dir       string
	refused   map[string]error // last refusal per name, for clear errors
	// refusedStamp is the file a refusal was for, not read again.
	refusedStamp map[string]fileStamp
	nextID       uint64
	loads        int64 // versions made hot
	evictions    int64 // hot versions demoted for room
	now          func() time.Time
}

func newAdapterManager(m *llama.Model, g *ggml.GGML, hot, warm int64) *adapterManager {
	shapes := map[string][]uint64{}
	for _, t := range g.Tensors().Items() {
		shapes[t.Name] = t.Shape
	}
	sum, _ := m.Meta(gguf.KeyBaseChecksum)
	return &adapterManager{
		model: m, arch: g.KV().Architecture(), checksum: sum, shapes: shapes,
		hotBudget: hot, warmBudg: warm, entries: map[string]*adapterEntry{}, stamps: map[string]fileStamp{},
		deleted: map[string]bool{}, refused: map[string]error{}, refusedStamp: map[string]fileStamp{}, now: time.Now,
	}
}

// header is what validation learns about an adapter file.
type header struct {
	baseChecksum, quant string
	invocation          []int32 // aLoRA invocation tokens (alora.go), nil for a plain LoRA
}

// validate checks an adapter file's header against the base model: GGUF with
// every tensor's data inside the file, general.type=adapter,
// adapter.type=lora, same architecture, same base checksum when both record
// one, and for every X.lora_a [n_in, r] / X.lora_b [r, n_out] pair a base
// tensor X of shape [n_in, n_out].
func (am *adapterManager) validate(name string, data []byte) (header, error) {
	refuse := func(format string, args ...any) (header, error) {
		return header{}, fmt.Errorf("%w: %s: %s", ErrAdapterRefused, name, fmt.Sprintf(format, args...))
	}
	g, err := ggml.Decode(bytes.NewReader(data), maxInvocationTokens)
	if err != nil {
		return refuse("not a GGUF file: %v", err)
	}
	kv := g.KV()
	if t := kv.String("general.type"); t != "adapter" {
		return refuse("general.type is %q, want \"adapter\"", t)
	}
	if t, _ := kv["adapter.type"].(string); t != "lora" {
		return refuse("adapter.type is %q, want \"lora\"", t)
	}
	if a := kv.Architecture(); a != am.arch {
		return refuse("architecture %q does not match the base model's %q", a, am.arch)
	}
	sum, _ := kv[gguf.KeyAdapterBaseChecksum].(string)
	if sum != "" && am.checksum != "" && sum != am.checksum {
		return refuse("made for base checksum %.12s…, the loaded base is %.12s…", sum, am.checksum)
	}
	pairs := map[string][2][]uint64{}
	quant := ""
	for _, t := range g.Tensors().Items() {
		switch {
		case strings.HasSuffix(t.Name, ".lora_a"):
			p := pairs[strings.TrimSuffix(t.Name, ".lora_a")]
			p[0] = t.Shape
			pairs[strings.TrimSuffix(t.Name, ".lora_a")] = p
			if quant == "" {
				quant = strings.ToLower(t.Type())
			}
		case strings.HasSuffix(t.Name, ".lora_b"):
			p := pairs[strings.TrimSuffix(t.Name, ".lora_b")]
			p[1] = t.Shape
			pairs[strings.TrimSuffix(t.Name, ".lora_b")] = p
		case strings.HasSuffix(t.Name, "_norm.weight"):
		default:
			return refuse("unexpected tensor %s", t.Name)
		}
	}
	if len(pairs) == 0 {
		return refuse("no LoRA tensors")
	}
	names := make([]string, 0, len(pairs))
	for base := range pairs {
		names = append(names, base)
	}
	sort.Strings(names)
	for _, base := range names {
		a, b := pairs[base][0], pairs[base][1]
		if a == nil || b == nil {
			return refuse("tensor %s lacks lora_a or lora_b", base)
		}
		w, ok := am.shapes[base]
		if !ok {
			return refuse("base model has no tensor %s", base)
		}
		if len(w) != 2 || len(a) != 2 || len(b) != 2 || strings.HasSuffix(base, "token_embd.weight") {
			return refuse("unsupported LoRA target %s", base)
		}
		if a[0] != w[0] || b[1] != w[1] || a[1] != b[0] {
			return refuse("tensor %s: lora_a %v and lora_b %v do not fit base shape %v", base, a, b, w)
		}
	}
	inv, err := invocationTokens(kv)
	if err != nil {
		return refuse("%v", err)
	}
	return header{baseChecksum: sum, quant: quant, invocation: inv}, nil
}

func contentVersion(data []byte) string {
	h := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(h[:])
}

// validName checks an adapter name: non-empty, without ':' (which
// separates it from the base model in "<model>:<adapter>"), '/' or
// spaces, and not "." or ".." (path segments: URL paths such as
// /molly/adapters/<name> resolve them away, so such an adapter could be
// neither addressed nor removed).
func validName(name string) error {
	if name == "" || strings.ContainsAny(name, ":/ ") {
		return fmt.Errorf("adapter name %q must be non-empty without ':', '/' or spaces", name)
	}
	if name == "." || name == ".." {
		return fmt.Errorf("adapter name %q is a path segment; use letters, digits, '.', '_' or '-'", name)
	}
	return nil
}

// add registers adapter name from path through the API or configuration: it
// clears a tombstone and serves the file's content as the name's version
// (replacing another version). Errors: bad name, unreadable file,
// ErrAdapterRefused.
func (am *adapterManager) add(name, path string) error {
	if err := validName(name); err != nil {
		return err
	}
	am.mu.Lock()
	delete(am.deleted, name)
	am.mu.Unlock()
	_, err := am.load(name, path, true)
	return err
}

// load reads path and, if its content differs from name's served version,
// validates it and serves it as the new version. force reads the file even if
// its stamp did not change. It reports whether the served version changed.
func (am *adapterManager) load(name, path string, force bool) (bool, error) {
	st, err := stampOf(path)
	if err != nil {
		return false, fmt.Errorf("reading adapter %s: %w", name, err)
	}
	am.mu.Lock()
	cur := am.entries[name]
	if !force && ((cur != nil && cur.path == path && am.stamps[name] == st) || am.refusedStamp[name] == st) {
		am.mu.Unlock()
		return false, nil
	}
	am.mu.Unlock()
	data, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("reading adapter %s: %w", name, err)
	}
	if after, err := stampOf(path); err != nil || after != st || int64(len(data)) != st.size {
		// Being written: the watch sees the writer's next event.
		return false, fmt.Errorf("reading adapter %s: the file changed while it was read", name)
	}
	version := contentVersion(data)
	am.mu.Lock()
	if cur := am.entries[name]; cur != nil && cur.version == version {
		cur.path = path
		am.stamps[name] = st
		delete(am.refused, name)
		am.mu.Unlock()
		return false, nil
	}
	am.mu.Unlock()
	h, err := am.validate(name, data)
	am.mu.Lock()
	defer am.mu.Unlock()
	if err != nil {
		am.refused[name] = err
		am.refusedStamp[name] = st
		return false, err
	}
	delete(am.refused, name)
	delete(am.refusedStamp, name)
	am.nextID++
	e := &adapterEntry{
		id: am.nextID, name: name, path: path, version: version, baseChecksum: h.baseChecksum, quant: h.quant, invocation: h.invocation,
		loaded: am.now(), size: int64(len(data)), lastUsed: am.now(),
	}
	am.retire(name)
	am.entries[name] = e
	am.stamps[name] = st
	am.makeWarm(e, data)
	return true, nil
}

// retire moves name's served version, if any, to the retired list. Caller
// holds mu.
func (am *adapterManager) retire(name string) {
	if old, ok := am.entries[name]; ok {
		old.retired = true
		am.retired = append(am.retired, old)
		delete(am.entries, name)
		delete(am.stamps, name)
	}
}

// remove unregisters name until it is added again (see the type comment); a
// hot version is freed once no request uses it. Errors: no such adapter.
func (am *adapterManager) remove(name string) error {
	am.mu.Lock()
	defer am.mu.Unlock()
	if _, ok := am.entries[name]; !ok {
		return fmt.Errorf("no adapter %q", name)
	}
	am.retire(name)
	if am.dir != "" {
		am.deleted[name] = true
	}
	return nil
}

// scan makes the catalogue match dir and the files behind registered
// adapters: a *.gguf in dir not yet known (name = file name without
// extension) is added unless tombstoned, a changed file becomes a new
// version, and an adapter whose file left dir is removed (clearing its
// tombstone). Files whose stamp did not change are not read. A refused file is
// not read again until it changes. Refusals are returned joined.
func (am *adapterManager) scan(dir string) error {
	var errs []error
	present := map[string]string{}
	if dir != "" {
		files, err := filepath.Glob(filepath.Join(dir, "*.gguf"))
		if err != nil {
			return err
		}
		for _, f := range files {
			present[strings.TrimSuffix(filepath.Base(f), ".gguf")] = f
		}
	}
	am.mu.Lock()
	type job struct{ name, path string }
	var jobs []job
	for name, f := range present {
		if am.deleted[name] || validName(name) != nil {
			continue
		}
		jobs = append(jobs, job{name, f})
	}
	for name, e := range am.entries {
		if _, ok := present[name]; ok {
			continue
		}
		if dir != "" && filepath.Dir(e.path) == filepath.Clean(dir) {
			am.retire(name)
			continue
		}
		// A name given to a file by AddAdapter or Config.Adapters goes
		// with its file.
		if _, err := os.Stat(e.path); errors.Is(err, fs.ErrNotExist) {
			am.retire(name)
			continue
		}
		jobs = append(jobs, job{name, e.path})
	}
	for name := range am.deleted {
		if _, ok := present[name]; !ok {
			delete(am.deleted, name)
		}
	}
	am.mu.Unlock()
	sort.Slice(jobs, func(i, j int) bool { return jobs[i].name < jobs[j].name })
	for _, j := range jobs {
		if _, err := am.load(j.name, j.path, false); err != nil {
			if errors.Is(err, ErrAdapterRefused) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func (am *adapterManager) refusal(name string) error {
	am.mu.Lock()
	defer am.mu.Unlock()
	return am.refused[name]
}

// lookup returns name's served version.
func (am *adapterManager) lookup(name string) (*adapterEntry, bool) {
	am.mu.Lock()
	defer am.mu.Unlock()
	e, ok := am.entries[name]
	return e, ok
}

func (am *adapterManager) list() []AdapterInfo {
	am.mu.Lock()
	defer am.mu.Unlock()
	var out []AdapterInfo
	for _, e := range am.entries {
		info := AdapterInfo{
			Name: e.name, Path: e.path, Version: e.version, BaseChecksum: e.baseChecksum, Quantization: e.quant,
			Loaded: e.loaded, State: e.state(), Bytes: e.size, HotBytes: e.hotBytes, Uses: e.uses, Hits: e.hits, Running: e.pins, LoadTime: e.loadTime,
		}
		for _, r := range am.retired {
			if r.name == e.name && r.pins > 0 {
				info.Draining = append(info.Draining, r.version)
			}
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// all calls f for every version, served and retired. Caller holds mu.
func (am *adapterManager) all(f func(*adapterEntry)) {
	for _, e := range am.entries {
		f(e)
	}
	for _, e := range am.retired {
		f(e)
	}
}

// hotBytes and warmBytes sum the resident tensor bytes of hot versions and
// the kept file bytes of warm ones. Caller holds mu.
func (am *adapterManager) hotBytes() (n int64) {
	am.all(func(e *adapterEntry) {
		if e.hot != nil {
			n += e.hotBytes
		}
	})
	return n
}

func (am *adapterManager) warmBytes() (n int64) {
	am.all(func(e *adapterEntry) {
		if e.data != nil {
			n += e.size
		}
	})
	return n
}

// hotCost is the bytes e will take once hot: its resident size if it was hot
// before, else its file size (the file is almost all tensor data).
func (e *adapterEntry) hotCost() int64 {
	if e.hotBytes > 0 {
		return e.hotBytes
	}
	return e.size
}

// errBusy means the memory budget is full of things in use; the request
// waits.
var errBusy = errors.New("memory budget full of adapters and KV in use")

// pin makes e hot and marks it in use; room(bytes) must make room for e's
// tensors in the engine's memory budget (evicting by reload cost) or return
// false. Hot versions beyond the hot budget are demoted first, lowest
// expected reload cost first. Errors: errBusy (retry later), errRetired (look
// the name up again), a version larger than the hot budget, errVersionGone,
// load failures. Scheduler goroutine
// only; the caller does not hold mu.
func (am *adapterManager) pin(e *adapterEntry, room func(need int64, keep *adapterEntry) bool) error {
	am.mu.Lock()
	if e.retired && e.hot == nil {
		am.mu.Unlock()
		return errRetired
	}
	if e.hot != nil {
		e.hits++
	} else {
		need := e.hotCost()
		if need > am.hotBudget {
			am.mu.Unlock()
			return fmt.Errorf("adapter %s (%d bytes) is larger than the hot budget (%d bytes)", e.name, need, am.hotBudget)
		}
		for am.hotBytes()+need > am.hotBudget {
			v := am.victim(func(x *adapterEntry) bool { return x.hot != nil && x.pins == 0 })
			if v == nil {
				am.mu.Unlock()
				return errBusy
			}
			am.demote(v)
			am.evictions++
		}
		am.mu.Unlock()
		if !room(need, e) {
			return errBusy
		}
		am.mu.Lock()
		start := am.now()
		data := e.data
		if data == nil {
			b, err := os.ReadFile(e.path)
			if err == nil && contentVersion(b) != e.version {
				err = errVersionGone
			}
			if err != nil {
				am.mu.Unlock()
				return fmt.Errorf("reading adapter %s: %w", e.name, err)
			}
			data = b
		}
		a, err := loadFromBytes(am.model, e.name, data)
		if err != nil {
			am.mu.Unlock()
			return err
		}
		e.hot = a
		e.hotBytes = a.Bytes()
		e.loadTime = am.now().Sub(start)
		am.loads++
		if e.data == nil {
			am.makeWarm(e, data)
		}
	}
	e.pins++
	e.uses++
	e.lastUsed = am.now()
	am.mu.Unlock()
	return nil
}

func (am *adapterManager) unpin(e *adapterEntry) {
	am.mu.Lock()
	defer am.mu.Unlock()
	e.pins--
	e.lastUsed = am.now()
}

// makeWarm keeps data for e if the warm budget allows after evicting warm
// bytes of lower reload cost. Caller holds mu.
func (am *adapterManager) makeWarm(e *adapterEntry, data []byte) {
	if e.size > am.warmBudg {
		return
	}
	for am.warmBytes()+e.size > am.warmBudg {
		v := am.victim(func(x *adapterEntry) bool { return x.data != nil && x != e })
		if v == nil {
			return
		}
		v.data = nil
	}
	e.data = data
}

// victim is the version with the lowest expected reload cost among those ok
// accepts. Caller holds mu.
func (am *adapterManager) victim(ok func(*adapterEntry) bool) *adapterEntry {
	now := am.now()
	var best *adapterEntry
	am.all(func(e *adapterEntry) {
		if ok(e) && (best == nil || e.reloadCost(now) < best.reloadCost(now)) {
			best = e
		}
	})
	return best
}

// demote frees e's llama.cpp tensors; it stays warm if its bytes are kept.
// Caller holds mu; scheduler goroutine only.
func (am *adapterManager) demote(e *adapterEntry) {
	if e.hot != nil {
		e.hot.Close()
		e.hot = nil
	}
}

// collect frees retired versions no request uses and returns them, so that
// the engine drops KV cached under them. Scheduler goroutine only.
func (am *adapterManager) collect() []*adapterEntry {
	am.mu.Lock()
	defer am.mu.Unlock()
	var gone []*adapterEntry
	kept := am.retired[:0]
	for _, e := range am.retired {
		if e.pins == 0 {
			am.demote(e)
			e.data = nil
			gone = append(gone, e)
			continue
		}
		kept = append(kept, e)
	}
	clear(am.retired[len(kept):])
	am.retired = kept
	return gone
}

func (am *adapterManager) close() {
	am.mu.Lock()
	defer am.mu.Unlock()
	am.all(func(e *adapterEntry) { am.demote(e) })
	am.entries, am.retired = map[string]*adapterEntry{}, nil
}

// loadFromBytes initialises an adapter in llama.cpp from validated bytes via
// an anonymous memory file, so what is loaded is exactly what was validated
// and hashed; llama.cpp only loads adapters from a path.
func loadFromBytes(m *llama.Model, name string, data []byte) (*llama.Adapter, error) {
	fd, err := unix.MemfdCreate("molly-adapter-"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("adapter %s: memfd: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return nil, fmt.Errorf("adapter %s: %w", name, err)
	}
	return llama.LoadAdapter(m, fmt.Sprintf("/proc/self/fd/%d", fd))
}
