package serving

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ollama/ollama/fs/ggml"
	"golang.org/x/sys/unix"

	"github.com/molly-gateway/molly/serving/gguf"
	"github.com/molly-gateway/molly/serving/llama"
)

// AdapterState is where an adapter lives (DESIGN §5).
type AdapterState string

const (
	// Cold: only on disk.
	Cold AdapterState = "cold"
	// Warm: file bytes in host memory, header validated against the base.
	Warm AdapterState = "warm"
	// Hot: initialised in llama.cpp, tensors resident, ready to apply.
	Hot AdapterState = "hot"
)

// AdapterInfo describes one registered adapter.
type AdapterInfo struct {
	Name     string        `json:"name"`
	Path     string        `json:"path"`
	State    AdapterState  `json:"state"`
	Bytes    int64         `json:"bytes"` // file size
	Uses     int           `json:"uses"`  // requests served
	LoadTime time.Duration `json:"load_time_ns"`
}

// ErrAdapterRefused wraps every refusal of an adapter that does not fit the
// loaded base model (architecture, tensor shapes or base checksum).
var ErrAdapterRefused = errors.New("adapter refused")

type adapterEntry struct {
	name, path string
	size       int64
	data       []byte         // warm bytes (validated), nil when cold
	hot        *llama.Adapter // nil unless hot
	uses       int
	lastUsed   time.Time
	loadTime   time.Duration // last cold→hot (or warm→hot) time
	pins       int           // active requests using it
	removed    bool
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
// GreedyDual-style cost-aware caching). Lower scores are evicted first.
func (a *adapterEntry) reloadCost(now time.Time) float64 {
	age := now.Sub(a.lastUsed).Seconds()
	lt := math.Max(a.loadTime.Seconds(), 1e-4)
	return float64(a.uses+1) / (1 + age) * lt
}

// adapterManager keeps the adapter catalogue and the hot/warm/cold states
// within byte budgets. Metadata is guarded by mu; llama.cpp load and free run
// only on the scheduler goroutine (promote, evict, collect), because an
// adapter may be in use by a decode.
type adapterManager struct {
	mu        sync.Mutex
	model     *llama.Model
	arch      string
	checksum  string
	shapes    map[string][]uint64
	hotBudget int64
	warmBudg  int64
	entries   map[string]*adapterEntry
	dir       string
	refused   map[string]error // last refusal per name, for clear errors
	// refusedStamp is the size and mtime of a refused file in dir.
	refusedStamp map[string]string
	now          func() time.Time
}

func newAdapterManager(m *llama.Model, modelPath string, hot, warm int64) (*adapterManager, error) {
	f, err := os.Open(modelPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	g, err := ggml.Decode(f, 0)
	if err != nil {
		return nil, fmt.Errorf("reading model header %s: %w", modelPath, err)
	}
	shapes := map[string][]uint64{}
	for _, t := range g.Tensors().Items() {
		shapes[t.Name] = t.Shape
	}
	sum, _ := m.Meta(gguf.KeyBaseChecksum)
	return &adapterManager{
		model: m, arch: g.KV().Architecture(), checksum: sum, shapes: shapes,
		hotBudget: hot, warmBudg: warm, entries: map[string]*adapterEntry{}, refused: map[string]error{}, refusedStamp: map[string]string{}, now: time.Now,
	}, nil
}

// validate checks an adapter file's header against the base model: GGUF,
// general.type=adapter, adapter.type=lora, same architecture, same base
// checksum when both record one, and for every X.lora_a [n_in, r] /
// X.lora_b [r, n_out] pair a base tensor X of shape [n_in, n_out].
func (am *adapterManager) validate(name string, data []byte) error {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrAdapterRefused, name, fmt.Sprintf(format, args...))
	}
	g, err := ggml.Decode(bytes.NewReader(data), 0)
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
	if sum, _ := kv[gguf.KeyAdapterBaseChecksum].(string); sum != "" && am.checksum != "" && sum != am.checksum {
		return refuse("made for base checksum %.12s…, the loaded base is %.12s…", sum, am.checksum)
	}
	pairs := map[string][2][]uint64{}
	for _, t := range g.Tensors().Items() {
		switch {
		case strings.HasSuffix(t.Name, ".lora_a"):
			p := pairs[strings.TrimSuffix(t.Name, ".lora_a")]
			p[0] = t.Shape
			pairs[strings.TrimSuffix(t.Name, ".lora_a")] = p
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
	return nil
}

// add registers (or replaces) the adapter name from path after validating it;
// its bytes stay warm if the warm budget allows. Errors: unreadable file or
// ErrAdapterRefused.
func (am *adapterManager) add(name, path string) error {
	if name == "" || strings.ContainsAny(name, ":/ ") {
		return fmt.Errorf("adapter name %q must be non-empty without ':', '/' or spaces", name)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading adapter %s: %w", name, err)
	}
	if err := am.validate(name, data); err != nil {
		am.mu.Lock()
		am.refused[name] = err
		am.mu.Unlock()
		return err
	}
	am.mu.Lock()
	defer am.mu.Unlock()
	delete(am.refused, name)
	if old, ok := am.entries[name]; ok {
		old.removed = true
		// Keep the old entry reachable for collect under a hidden key.
		am.entries["\x00"+name+fmt.Sprint(am.now().UnixNano())] = old
	}
	e := &adapterEntry{name: name, path: path, size: int64(len(data)), lastUsed: am.now()}
	am.entries[name] = e
	if am.warmBytes()+e.size <= am.warmBudg {
		e.data = data
	}
	return nil
}

// remove unregisters name; a hot adapter is freed once no request uses it.
func (am *adapterManager) remove(name string) error {
	am.mu.Lock()
	defer am.mu.Unlock()
	e, ok := am.entries[name]
	if !ok {
		return fmt.Errorf("no adapter %q", name)
	}
	e.removed = true
	return nil
}

// scan registers every *.gguf in dir not yet known (name = file name without
// extension) and removes adapters whose file left dir: together with the
// engine's periodic call this is the directory watch. A refused file is not
// read again until its size or modification time changes. Refusals are
// returned joined.
func (am *adapterManager) scan(dir string) error {
	if dir == "" {
		return nil
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.gguf"))
	if err != nil {
		return err
	}
	present := map[string]bool{}
	var errs []error
	for _, f := range files {
		present[f] = true
		name := strings.TrimSuffix(filepath.Base(f), ".gguf")
		st, err := os.Stat(f)
		if err != nil {
			continue
		}
		stamp := fmt.Sprint(st.Size(), st.ModTime().UnixNano())
		am.mu.Lock()
		_, known := am.entries[name]
		seen := am.refusedStamp[name] == stamp
		am.mu.Unlock()
		if known || seen {
			continue
		}
		if err := am.add(name, f); err != nil {
			am.mu.Lock()
			am.refusedStamp[name] = stamp
			am.mu.Unlock()
			errs = append(errs, err)
		}
	}
	am.mu.Lock()
	for name, e := range am.entries {
		if !e.removed && filepath.Dir(e.path) == filepath.Clean(dir) && !present[e.path] {
			e.removed = true
			_ = name
		}
	}
	am.mu.Unlock()
	return errors.Join(errs...)
}

func (am *adapterManager) refusal(name string) error {
	am.mu.Lock()
	defer am.mu.Unlock()
	return am.refused[name]
}

func (am *adapterManager) lookup(name string) (*adapterEntry, bool) {
	am.mu.Lock()
	defer am.mu.Unlock()
	e, ok := am.entries[name]
	if !ok || e.removed {
		return nil, false
	}
	return e, true
}

func (am *adapterManager) list() []AdapterInfo {
	am.mu.Lock()
	defer am.mu.Unlock()
	var out []AdapterInfo
	for _, e := range am.entries {
		if e.removed {
			continue
		}
		out = append(out, AdapterInfo{Name: e.name, Path: e.path, State: e.state(), Bytes: e.size, Uses: e.uses, LoadTime: e.loadTime})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// hotBytes and warmBytes sum the budgeted bytes; callers hold mu. A hot
// adapter's resident tensors are counted as its file size (the file is almost
// all tensor data).
func (am *adapterManager) hotBytes() (n int64) {
	for _, e := range am.entries {
		if e.hot != nil {
			n += e.size
		}
	}
	return n
}

func (am *adapterManager) warmBytes() (n int64) {
	for _, e := range am.entries {
		if e.data != nil {
			n += e.size
		}
	}
	return n
}

// errBusy means the hot budget is full of adapters in use; the request waits.
var errBusy = errors.New("hot adapter budget full of adapters in use")

// pin makes e hot and marks it in use. It evicts unpinned hot adapters with
// the lowest expected reload cost until e fits the hot budget. Errors: errBusy
// (retry later), an adapter larger than the hot budget, load failures.
// Scheduler goroutine only.
func (am *adapterManager) pin(e *adapterEntry) error {
	am.mu.Lock()
	defer am.mu.Unlock()
	if e.removed {
		return fmt.Errorf("adapter %s was removed", e.name)
	}
	if e.hot == nil {
		if e.size > am.hotBudget {
			return fmt.Errorf("adapter %s (%d bytes) is larger than the hot budget (%d bytes)", e.name, e.size, am.hotBudget)
		}
		for am.hotBytes()+e.size > am.hotBudget {
			v := am.victim(func(x *adapterEntry) bool { return x.hot != nil && x.pins == 0 })
			if v == nil {
				return errBusy
			}
			am.demote(v)
		}
		start := am.now()
		data := e.data
		if data == nil {
			b, err := os.ReadFile(e.path)
			if err != nil {
				return fmt.Errorf("reading adapter %s: %w", e.name, err)
			}
			if err := am.validate(e.name, b); err != nil {
				return err
			}
			data = b
		}
		a, err := loadFromBytes(am.model, e.name, data)
		if err != nil {
			return err
		}
		e.hot = a
		e.loadTime = am.now().Sub(start)
		if e.data == nil {
			am.makeWarm(e, data)
		}
	}
	e.pins++
	e.uses++
	e.lastUsed = am.now()
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

func (am *adapterManager) victim(ok func(*adapterEntry) bool) *adapterEntry {
	now := am.now()
	var best *adapterEntry
	for _, e := range am.entries {
		if ok(e) && (best == nil || e.reloadCost(now) < best.reloadCost(now)) {
			best = e
		}
	}
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

// collect frees removed, unused adapters. Scheduler goroutine only.
func (am *adapterManager) collect() {
	am.mu.Lock()
	defer am.mu.Unlock()
	for k, e := range am.entries {
		if e.removed && e.pins == 0 {
			am.demote(e)
			delete(am.entries, k)
		}
	}
}

func (am *adapterManager) close() {
	am.mu.Lock()
	defer am.mu.Unlock()
	for k, e := range am.entries {
		am.demote(e)
		delete(am.entries, k)
	}
}

// loadFromBytes initialises an adapter in llama.cpp from validated bytes via
// an anonymous memory file, so what is loaded is exactly what was validated;
// llama.cpp only loads adapters from a path.
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
