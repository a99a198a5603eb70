package adapters

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/molly-gateway/molly/learning/lora"
	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/serving"
)

type fixture struct {
	dir, model string
	reg        *registry.Registry
	store      *Store
	m          *lora.Model
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	if err := serving.WriteDemo(dir, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	model := filepath.Join(dir, serving.DemoModelFile)
	reg, err := registry.Open(filepath.Join(dir, "molly.db"), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	base, err := BaseOf(model)
	if err != nil {
		t.Fatal(err)
	}
	m, err := lora.LoadModel(model)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{dir: dir, model: model, reg: reg, store: &Store{Registry: reg, Dir: filepath.Join(dir, "versions"), Base: base}, m: m}
}

// trained writes a briefly trained adapter (seed makes it distinct) and
// adds it to the store as a version of name.
func (f *fixture) trained(t *testing.T, name string, seed uint64) registry.AdapterVersion {
	t.Helper()
	toks := []int32{1}
	for i := range 24 {
		toks = append(toks, int32(40+(i*int(seed))%50))
	}
	res, err := lora.Train(context.Background(), f.m, []lora.Example{{Tokens: toks, Start: 4}}, lora.Options{Rank: 2, Steps: 2, BatchSize: 1, Seed: seed, LR: 1e-2})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "a.gguf")
	if err := res.Adapter.WriteGGUF(path, f.m, name); err != nil {
		t.Fatal(err)
	}
	v, err := f.store.Add(context.Background(), name, path, "trained", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	sum := sha256.Sum256(data)
	if v.Version != hex.EncodeToString(sum[:]) {
		t.Fatalf("version %s is not the file's SHA-256 %x", v.Version, sum)
	}
	return v
}

// TestPromotionUnderLoad: 8 streams running on an adapter while another
// version is promoted all complete, each on one version (the one it
// started on); the next request gets the new version, and the pinned
// name of the old one still serves it.
func TestPromotionUnderLoad(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a, b := f.trained(t, "math", 1), f.trained(t, "math", 2)
	if a.Version == b.Version {
		t.Fatal("two trainings gave one file")
	}
	eng, err := serving.New(serving.Config{ModelPath: f.model, NSeqMax: 8, NCtx: 8 * 256, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	p := Promotion{Engine: eng}
	if _, err := f.store.Promote(ctx, p, "math", a.Version, "promote", "first"); err != nil {
		t.Fatal(err)
	}
	prompt, err := eng.Tokenize("<|im_start|>user\nhow many apples<|im_end|>\n<|im_start|>assistant\n")
	if err != nil {
		t.Fatal(err)
	}
	const streams, tokens = 8, 40
	var started sync.WaitGroup
	started.Add(streams)
	promoted := make(chan struct{})
	type result struct {
		versions map[string]int
		text     string
		usage    serving.Usage
		err      error
	}
	results := make([]result, streams)
	var done sync.WaitGroup
	for i := range streams {
		done.Add(1)
		go func() {
			defer done.Done()
			r := result{versions: map[string]int{}}
			first := true
			r.usage, r.err = eng.Generate(ctx, serving.Request{Adapter: "math", Prompt: prompt, Params: serving.SamplingParams{MaxTokens: tokens}},
				func(ev serving.Event) error {
					if ev.Version != "" { // the engine names the version on a choice's first event
						r.versions[ev.Version]++
					}
					r.text += ev.Text
					if first {
						first = false
						started.Done()
						<-promoted // hold this stream open across the promotion
					}
					return nil
				})
			results[i] = r
		}()
	}
	waitOrFail(t, &started, "the streams' first tokens")
	if _, err := f.store.Promote(ctx, p, "math", b.Version, "promote", "second"); err != nil {
		t.Fatal(err)
	}
	close(promoted)
	waitOrFail(t, &done, "the streams to complete")
	for i, r := range results {
		if r.err != nil || r.usage.CompletionTokens != tokens {
			t.Fatalf("stream %d: %v, usage %+v", i, r.err, r.usage)
		}
		if len(r.versions) != 1 || r.versions["sha256:"+a.Version] == 0 {
			t.Fatalf("stream %d ran on versions %v, want only the one it started on, %s", i, r.versions, Short(a.Version))
		}
	}
	generate := func(adapter string) (version, text string) {
		if _, err := eng.Generate(ctx, serving.Request{Adapter: adapter, Prompt: prompt, Params: serving.SamplingParams{MaxTokens: tokens}},
			func(ev serving.Event) error {
				if ev.Version != "" {
					version = ev.Version
				}
				text += ev.Text
				return nil
			}); err != nil {
			t.Fatal(err)
		}
		return version, text
	}
	versionOf := func(adapter string) string { v, _ := generate(adapter); return v }
	vb, textB := generate("math")
	if vb != "sha256:"+b.Version {
		t.Fatalf("after promotion math serves %s, want %s", vb, b.Version)
	}
	va, textA := generate(Pinned("math", a.Version))
	if va != "sha256:"+a.Version {
		t.Fatalf("the pinned name of the first version serves %s", va)
	}
	// Greedy decoding is deterministic: a stream that had switched to the
	// second version part way would differ from the first version's text.
	if textA == textB {
		t.Fatalf("the two versions write the same greedy text %q: the test cannot tell them apart", textA)
	}
	for i, r := range results {
		if r.text != textA {
			t.Fatalf("stream %d wrote %q, the first version writes %q", i, r.text, textA)
		}
	}
	// Rollback goes back to the first version, and says so in the history.
	if v, err := f.store.Rollback(ctx, p, "math", "bad answers"); err != nil || v.Version != a.Version {
		t.Fatalf("rollback: %v %v", v.Version, err)
	}
	if v := versionOf("math"); v != "sha256:"+a.Version {
		t.Fatalf("after rollback math serves %s", v)
	}
	list, err := f.store.List(ctx)
	if err != nil || len(list) != 1 || list[0].Serving != a.Version || len(list[0].Versions) != 2 {
		t.Fatalf("list %+v %v", list, err)
	}
	var actions []string
	for _, e := range list[0].History {
		actions = append(actions, e.Action+":"+Short(e.Version))
	}
	want := []string{"promote:" + Short(a.Version), "promote:" + Short(b.Version), "rollback:" + Short(a.Version)}
	if len(actions) != 3 || actions[0] != want[0] || actions[1] != want[1] || actions[2] != want[2] {
		t.Fatalf("history %v, want %v", actions, want)
	}
}

func waitOrFail(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(60 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestAnAdapterForAnotherBaseIsRefused: a version made for another base
// model is refused at Add with ErrOtherBase, and nothing is stored.
func TestAnAdapterForAnotherBaseIsRefused(t *testing.T) {
	f := newFixture(t)
	other := t.TempDir()
	if err := serving.WriteDemo(other, 2, "tiny"); err != nil {
		t.Fatal(err)
	}
	om, err := lora.LoadModel(filepath.Join(other, serving.DemoModelFile))
	if err != nil {
		t.Fatal(err)
	}
	res, err := lora.Train(context.Background(), om, []lora.Example{{Tokens: []int32{1, 50, 51, 52, 53, 54}, Start: 2}}, lora.Options{Rank: 2, Steps: 1, BatchSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "alien.gguf")
	if err := res.Adapter.WriteGGUF(path, om, "math"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Add(context.Background(), "math", path, "import", "", nil); !errors.Is(err, ErrOtherBase) {
		t.Fatalf("adding an adapter of another base: %v, want ErrOtherBase", err)
	}
	if vs, _ := f.reg.AdapterVersions(context.Background(), ""); len(vs) != 0 {
		t.Fatalf("%d versions stored", len(vs))
	}
}
