package serving

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/molly-gateway/molly/serving/gguf"
)

// adapterFile writes a tiny-base adapter with seed to dir/name and returns
// its bytes and their content version ("sha256:<hex>", computed here).
func adapterFile(t *testing.T, dir, name string, seed int64) ([]byte, string) {
	t.Helper()
	base, _ := gguf.SizeConfig("tiny", 1)
	p := filepath.Join(dir, name)
	if err := gguf.WriteAdapter(p, base, gguf.AdapterConfig{Name: name, Seed: seed}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	return b, "sha256:" + hex.EncodeToString(h[:])
}

// freshOutput is the oracle for one adapter version: a new engine whose only
// adapter "x" holds data answers body.
func freshOutput(t *testing.T, data []byte, body map[string]any) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x.gguf"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, func(c *Config) { c.AdapterDir = dir })
	out, _ := mustText(t, e, body)
	e.Close()
	return out
}

// versionOf is the served version of adapter name ("" if not served).
func versionOf(e *Engine, name string) string {
	for _, a := range e.Adapters() {
		if a.Name == name {
			return a.Version
		}
	}
	return ""
}

// waitVersion waits, without rescanning, until the directory watch serves
// want under name.
func waitVersion(t *testing.T, e *Engine, name, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for versionOf(e, name) != want {
		if time.Now().After(deadline) {
			t.Fatalf("adapter %s still at version %q after 10 s, want %q (watch error %q)", name, versionOf(e, name), want, e.Stats().WatchError)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// replaceMethods put new content behind dir/x.gguf the ways deployments do.
var replaceMethods = []struct {
	name    string
	install func(t *testing.T, dir string, data []byte) // first version
	replace func(t *testing.T, dir string, data []byte)
}{
	{"written in place", func(t *testing.T, dir string, data []byte) {
		must(t, os.WriteFile(filepath.Join(dir, "x.gguf"), data, 0o644))
	}, func(t *testing.T, dir string, data []byte) {
		must(t, os.WriteFile(filepath.Join(dir, "x.gguf"), data, 0o644))
	}},
	{"renamed over", func(t *testing.T, dir string, data []byte) {
		must(t, os.WriteFile(filepath.Join(dir, "x.gguf"), data, 0o644))
	}, func(t *testing.T, dir string, data []byte) {
		tmp := filepath.Join(dir, "x.gguf.tmp")
		must(t, os.WriteFile(tmp, data, 0o644))
		must(t, os.Rename(tmp, filepath.Join(dir, "x.gguf")))
	}},
	{"symlink swapped", func(t *testing.T, dir string, data []byte) {
		store := filepath.Join(filepath.Dir(dir), filepath.Base(dir)+"-v1")
		must(t, os.MkdirAll(store, 0o755))
		must(t, os.WriteFile(filepath.Join(store, "x.gguf"), data, 0o644))
		must(t, os.Symlink(filepath.Join(store, "x.gguf"), filepath.Join(dir, "x.gguf")))
	}, func(t *testing.T, dir string, data []byte) {
		store := filepath.Join(filepath.Dir(dir), filepath.Base(dir)+"-v2")
		must(t, os.MkdirAll(store, 0o755))
		must(t, os.WriteFile(filepath.Join(store, "x.gguf"), data, 0o644))
		tmp := filepath.Join(dir, "x.gguf.next")
		must(t, os.Symlink(filepath.Join(store, "x.gguf"), tmp))
		must(t, os.Rename(tmp, filepath.Join(dir, "x.gguf")))
	}},
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestReplacedAdapterNeverMixesVersions reproduces the mixed-version case: a
// hot budget of one adapter and no warm bytes (so the adapter goes cold when
// another is used), the prefix cache on, the file replaced in place. Every
// answer must equal what a fresh engine on that version answers, and KV
// cached under the old version must not be reused under the new one.
func TestReplacedAdapterNeverMixesVersions(t *testing.T) {
	src := t.TempDir()
	v1, ver1 := adapterFile(t, src, "v1.gguf", 11)
	v2, ver2 := adapterFile(t, src, "v2.gguf", 12)
	other, _ := adapterFile(t, src, "other.gguf", 13)
	prompt := strings.Repeat("The same long question about an order. ", 3)
	body := greedy("molly-demo:x", prompt, 16)
	want1, want2 := freshOutput(t, v1, body), freshOutput(t, v2, body)
	if want1 == want2 {
		t.Fatalf("the two versions answer alike (%q): the test could not tell them apart", want1)
	}
	for _, m := range replaceMethods {
		t.Run(m.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "adapters")
			must(t, os.MkdirAll(dir, 0o755))
			m.install(t, dir, v1)
			must(t, os.WriteFile(filepath.Join(dir, "other.gguf"), other, 0o644))
			e := newEngine(t, func(c *Config) {
				c.AdapterDir = dir
				c.HotBytes = int64(len(v1)) + int64(len(v1))/2 // one hot adapter
				c.WarmBytes = 1                                // nothing stays warm
				c.PrefixCache = true
				c.PrefillChunk = 16
			})
			if got := versionOf(e, "x"); got != ver1 {
				t.Fatalf("version %q, want %q", got, ver1)
			}
			if got, _ := mustText(t, e, body); got != want1 {
				t.Fatalf("v1: %q, want %q", got, want1)
			}
			mustText(t, e, greedy("molly-demo:other", prompt, 4)) // evicts x: cold
			for _, a := range e.Adapters() {
				if a.Name == "x" && a.State != Cold {
					t.Fatalf("x is %s after the other adapter ran, want cold", a.State)
				}
			}
			m.replace(t, dir, v2)
			waitVersion(t, e, "x", ver2)
			got, r := mustText(t, e, body)
			if got != want2 {
				t.Errorf("after replacing: %q, want the new version's %q (old version's: %q)", got, want2, want1)
			}
			if d := r.Usage.PromptTokensDetails; d == nil || d.CachedTokens != 0 {
				t.Errorf("first request on the new version reused %+v cached tokens computed under the old one", d)
			}
			if r.SystemFingerprint != ver2 {
				t.Errorf("system_fingerprint %q, want %q", r.SystemFingerprint, ver2)
			}
			got, r = mustText(t, e, body)
			if got != want2 || r.Usage.PromptTokensDetails == nil || r.Usage.PromptTokensDetails.CachedTokens == 0 {
				t.Errorf("second request on the new version: %q with %+v, want %q from cached chunks", got, r.Usage.PromptTokensDetails, want2)
			}
		})
	}
}

// TestRunningRequestFinishesOnItsVersion replaces an adapter while a request
// on it is half done: the request finishes as the old version would have,
// the next one runs on the new version.
func TestRunningRequestFinishesOnItsVersion(t *testing.T) {
	src := t.TempDir()
	v1, ver1 := adapterFile(t, src, "v1.gguf", 21)
	v2, ver2 := adapterFile(t, src, "v2.gguf", 22)
	const n = 400
	body := greedy("molly-demo:x", "tell me a long story", n)
	want1, want2 := freshOutput(t, v1, body), freshOutput(t, v2, body)
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "x.gguf"), v1, 0o644))
	e := newEngine(t, func(c *Config) { c.AdapterDir = dir })
	prompt, err := tokenizeChat(e, "tell me a long story")
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	var version string
	events := 0
	running := false
	_, err = e.Generate(context.Background(), Request{Adapter: "x", Prompt: prompt, Params: SamplingParams{MaxTokens: n}}, func(ev Event) error {
		if ev.Version != "" {
			version = ev.Version
		}
		text.WriteString(ev.Text)
		if events++; events == 1 {
			// Hold the scheduler between two steps while the file is
			// replaced and the watch serves the new version.
			if err := e.onScheduler(func() {
				running = len(e.active) == 1 && e.active[0].key.version == ver1 && !e.active[0].isDone()
				must(t, os.WriteFile(filepath.Join(dir, "x.gguf"), v2, 0o644))
				waitVersion(t, e, "x", ver2)
			}); err != nil {
				return err
			}
			a := e.Adapters()[0]
			if a.Version != ver2 || len(a.Draining) != 1 || a.Draining[0] != ver1 {
				t.Errorf("while the old request runs: version %q draining %v, want %q draining [%q]", a.Version, a.Draining, ver2, ver1)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !running {
		t.Fatal("the request was not running on v1 when its file was replaced")
	}
	if text.String() != want1 || version != ver1 {
		t.Errorf("running request (%d events, version %q): %q, want v1's %q (%q)", events, version, text.String(), want1, ver1)
	}
	if got, _ := mustText(t, e, body); got != want2 {
		t.Errorf("next request: %q, want v2's %q", got, want2)
	}
	// The old version is freed once its request is done.
	deadline := time.Now().Add(5 * time.Second)
	for e.Stats().Memory.RetiredVersions != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d retired versions still held", e.Stats().Memory.RetiredVersions)
		}
		mustText(t, e, greedy("molly-demo", "tick", 1))
	}
}

// tokenizeChat templates one user message as the chat endpoint does.
func tokenizeChat(e *Engine, content string) ([]int32, error) {
	return e.Tokenize("<|im_start|>user\n" + content + "<|im_end|>\n<|im_start|>assistant\n")
}

// TestDeletedAdapterStaysDeletedUntilAddedAgain checks the DELETE rule: the
// folder scan does not bring back a deleted adapter, even when its file
// changes, until it is added through the API or its file leaves the folder
// and comes back.
func TestDeletedAdapterStaysDeletedUntilAddedAgain(t *testing.T) {
	src := t.TempDir()
	v1, _ := adapterFile(t, src, "v1.gguf", 31)
	v2, ver2 := adapterFile(t, src, "v2.gguf", 32)
	dir := t.TempDir()
	path := filepath.Join(dir, "x.gguf")
	must(t, os.WriteFile(path, v1, 0o644))
	e := newEngine(t, func(c *Config) { c.AdapterDir = dir })
	served := func() bool {
		code, _ := chat(t, e, greedy("molly-demo:x", "hi", 2))
		return code == http.StatusOK
	}
	steps := []struct {
		name string
		do   func()
		want bool
	}{
		{"a deleted adapter is not served", func() { must(t, e.RemoveAdapter("x")) }, false},
		{"a rescan does not bring it back", func() { must(t, e.Rescan()) }, false},
		{"a new file under its name does not bring it back", func() {
			must(t, os.WriteFile(path, v2, 0o644))
			must(t, e.Rescan())
		}, false},
		{"adding it through the API serves the file's content", func() { must(t, e.AddAdapter("x", path)) }, true},
		{"deleted again, its file removed and written back, it is a new adapter", func() {
			must(t, e.RemoveAdapter("x"))
			must(t, os.Remove(path))
			must(t, e.Rescan())
			must(t, os.WriteFile(path, v2, 0o644))
			waitVersion(t, e, "x", ver2)
		}, true},
	}
	for _, st := range steps {
		st.do()
		if got := served(); got != st.want {
			t.Errorf("%s: served=%v", st.name, got)
		}
	}
	if v := versionOf(e, "x"); v != ver2 {
		t.Errorf("version %q, want %q", v, ver2)
	}
}

// TestModelsShowVersions checks that /v1/models and Adapters name each
// adapter's content version, base checksum and quantization.
func TestModelsShowVersions(t *testing.T) {
	e := newEngine(t, nil)
	base, _ := gguf.SizeConfig("tiny", 1)
	w := call(t, e, context.Background(), http.MethodGet, "/v1/models", nil)
	var r struct {
		Data []struct {
			ID      string `json:"id"`
			Version string `json:"version"`
			Created int64  `json:"created"`
		} `json:"data"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Data) != 1+len(DemoAdapters) || r.Data[0].Version != base.Checksum() {
		t.Fatalf("models %+v, want the base (version %s) and %d adapters", r.Data, base.Checksum(), len(DemoAdapters))
	}
	for _, m := range r.Data[1:] {
		name := strings.TrimPrefix(m.ID, "molly-demo:")
		b, err := os.ReadFile(filepath.Join(demoDir, DemoAdapterDir, name+".gguf"))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		if want := "sha256:" + hex.EncodeToString(h[:]); m.Version != want || m.Created <= 0 {
			t.Errorf("%s: version %q created %d, want %q", m.ID, m.Version, m.Created, want)
		}
	}
	for _, a := range e.Adapters() {
		if a.BaseChecksum != base.Checksum() || a.Quantization != "f32" || a.Loaded.IsZero() {
			t.Errorf("%s: base checksum %q quantization %q loaded %v", a.Name, a.BaseChecksum, a.Quantization, a.Loaded)
		}
	}
}

// TestNewFilesAreServedWithoutARescan checks the directory watch: a file
// dropped in is served, and one deleted is not, without Rescan.
func TestNewFilesAreServedWithoutARescan(t *testing.T) {
	dir := t.TempDir()
	e := newEngine(t, func(c *Config) { c.AdapterDir = dir })
	_, ver := adapterFile(t, dir, "fresh.gguf", 41)
	waitVersion(t, e, "fresh", ver)
	must(t, os.Remove(filepath.Join(dir, "fresh.gguf")))
	waitVersion(t, e, "fresh", "")
	if e.Stats().WatchError != "" {
		t.Errorf("watch error %q", e.Stats().WatchError)
	}
}

// TestAnAdapterNamedByTheAPIGoesWithItsFile: a name given to a file of the
// folder through AddAdapter, and one given to a file outside any folder,
// stop being served once the file is deleted (as the folder's own names
// do), at the next rescan.
func TestAnAdapterNamedByTheAPIGoesWithItsFile(t *testing.T) {
	src := t.TempDir()
	data, _ := adapterFile(t, src, "a.gguf", 41)
	dir, elsewhere := t.TempDir(), t.TempDir()
	inDir, outside := filepath.Join(dir, "p4.gguf"), filepath.Join(elsewhere, "q.gguf")
	must(t, os.WriteFile(inDir, data, 0o644))
	must(t, os.WriteFile(outside, data, 0o644))
	e := newEngine(t, func(c *Config) { c.AdapterDir = dir })
	must(t, e.AddAdapter("p5", inDir))
	must(t, e.AddAdapter("q", outside))
	served := func(name string) bool {
		code, _ := chat(t, e, greedy("molly-demo:"+name, "hi", 2))
		return code == http.StatusOK
	}
	for _, n := range []string{"p4", "p5", "q"} {
		if !served(n) {
			t.Fatalf("%s is not served before its file is deleted", n)
		}
	}
	must(t, os.Remove(inDir))
	must(t, os.Remove(outside))
	must(t, e.Rescan())
	for _, n := range []string{"p4", "p5", "q"} {
		if served(n) {
			t.Errorf("%s is still served after its file was deleted", n)
		}
		if slices.Contains(e.Models(), "molly-demo:"+n) {
			t.Errorf("%s is still listed: %v", n, e.Models())
		}
	}
}
