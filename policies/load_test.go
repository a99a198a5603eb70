package policies

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/open-policy-agent/opa/v1/bundle"
)

// watched starts an engine on dir whose reloads are reported on the
// returned channel.
func watched(t *testing.T, dir string) (*Engine, <-chan Status) {
	t.Helper()
	ch := make(chan Status, 64)
	e, err := New(context.Background(), Options{Dir: dir, Debounce: 20e6, OnReload: func(s Status) {
		select {
		case ch <- s:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e, ch
}

func reasonsOf(e *Engine) []string {
	return e.Decide(context.Background(), routeIn("public", nil)).Decision().Reasons()
}

// allow returns a policy allowing T0 with one reason.
func allow(reason string) string {
	return fmt.Sprintf("package molly.policy\nimport rego.v1\ndecision := {\"allow\": true, \"tiers\": [\"T0\"], \"reasons\": [%q]}\n", reason)
}

// contentHash computes the revision of files (path → content) as Status
// documents it, independently of the engine.
func contentHash(files map[string]string) string {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	h := sha256.New()
	for _, n := range names {
		h.Write([]byte(n + "\x00"))
		_ = binary.Write(h, binary.BigEndian, uint64(len(files[n])))
		h.Write([]byte(files[n]))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestDataDocumentsSubfoldersAndBundlesAreLoaded(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		// A rule in a subfolder, reading data from a data.json in another
		// subfolder (loaded at data.molly.config) and a data.yaml at the root.
		"rules/p.rego": `package molly.policy
import rego.v1
decision := {"allow": true, "tiers": data.molly.config.tiers, "reasons": [data.banner, data.extra.note]}
`,
		"molly/config/data.json": `{"tiers": ["T0", "T1"]}`,
		"data.yaml":              "banner: from yaml\n",
		// Tests and dot-folders are not served: this one would not compile.
		"rules/p_test.rego":    "package molly.policy\ndecision := 1\n",
		".hidden/broken.rego":  "package molly.policy\nthis is not rego\n",
		"notes.txt":            "ignored: not a type OPA's loader knows",
		"rules/README.md":      "ignored",
		"extra/sub/data.jsonx": "ignored",
	}
	for n, c := range files {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(n)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// An OPA bundle written by OPA's own bundle writer, in a subfolder:
	// its data lands below that folder's path, like any data document.
	var buf bytes.Buffer
	b := bundle.Bundle{Data: map[string]any{"note": "from the bundle"}, Manifest: bundle.Manifest{Revision: "b1"}}
	if err := bundle.NewWriter(&buf).Write(b); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "extra"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "extra", "b.tar.gz"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	e, _ := watched(t, dir)
	d := e.Decide(context.Background(), routeIn("public", nil)).Decision()
	if !slices.Equal(d.Tiers(), []string{"T0", "T1"}) || !slices.Equal(d.Reasons(), []string{"from yaml", "from the bundle"}) {
		t.Fatalf("tiers %v reasons %v (detail %q)", d.Tiers(), d.Reasons(), d.detail)
	}
	st := e.Status()
	want := []string{"data.yaml", "extra/b.tar.gz", "molly/config/data.json", "rules/p.rego"}
	if !slices.Equal(st.Files, want) || st.Source != dir || !st.Healthy {
		t.Fatalf("status %+v, want files %v", st, want)
	}
	served := map[string]string{}
	for _, n := range want {
		c, _ := os.ReadFile(filepath.Join(dir, n))
		served[n] = string(c)
	}
	if st.Revision != contentHash(served) {
		t.Fatalf("revision %s is not the documented content hash %s", st.Revision, contentHash(served))
	}
}

func TestEmbeddedStatus(t *testing.T) {
	st := defaultEngine(t).Status()
	if st.Source != "embedded" || !st.Healthy || slices.ContainsFunc(st.Files, func(f string) bool { return strings.HasSuffix(f, "_test.rego") }) ||
		!slices.Contains(st.Files, "escalation.rego") || len(st.Revision) != 64 {
		t.Fatalf("status %+v", st)
	}
}

func TestSameSizeEditsAreSeen(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, allow("v1"))
	e, reloads := watched(t, dir)
	if got := reasonsOf(e); !slices.Equal(got, []string{"v1"}) {
		t.Fatalf("reasons %v", got)
	}
	// Same size, same second: only the content tells them apart.
	for _, v := range []string{"v2", "v3", "v4"} {
		writePolicy(t, dir, allow(v))
		waitFor(t, reloads, v, func() bool { return slices.Equal(reasonsOf(e), []string{v}) })
	}
}

func TestAnEditorSavingByRenameIsSeen(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, allow("before"))
	e, reloads := watched(t, dir)
	// vim's and most editors' safe save: write a temporary file, rename it
	// over the original.
	tmp := filepath.Join(dir, ".p.rego.swp")
	if err := os.WriteFile(tmp, []byte(allow("after")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "p.rego")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, reloads, "the renamed file", func() bool { return slices.Equal(reasonsOf(e), []string{"after"}) })
}

func TestNewSubfoldersAreWatched(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, "package molly.policy\nimport rego.v1\ndefault v := \"none\"\nv := data.x.v\ndecision := {\"allow\": true, \"tiers\": [\"T0\"], \"reasons\": [v]}\n")
	e, reloads := watched(t, dir)
	if err := os.Mkdir(filepath.Join(dir, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Written at once, before the new folder can be watched: the reload
	// that adds the watch reads again. Later edits arrive through it.
	for _, v := range []string{"one", "two", "three"} {
		if err := os.WriteFile(filepath.Join(dir, "x", "data.json"), []byte(`{"v": "`+v+`"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		waitFor(t, reloads, v, func() bool { return slices.Equal(reasonsOf(e), []string{v}) })
	}
}

// configMap lays dir out as the kubelet's AtomicWriter does for a
// ConfigMap volume: the files in a timestamped folder, "..data" a symlink
// to it, and each file a symlink through "..data". swap installs a new
// version atomically (rename of a new "..data" symlink) and removes the
// old folder.
type configMap struct {
	t   *testing.T
	dir string
	n   int
	cur string
}

func (c *configMap) swap(files map[string]string) {
	c.t.Helper()
	c.n++
	ts := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", c.n%60, c.n)
	if err := os.Mkdir(filepath.Join(c.dir, ts), 0o755); err != nil {
		c.t.Fatal(err)
	}
	for n, s := range files {
		if err := os.WriteFile(filepath.Join(c.dir, ts, n), []byte(s), 0o644); err != nil {
			c.t.Fatal(err)
		}
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		c.t.Fatal(err)
	}
	for n := range files {
		link := filepath.Join(c.dir, n)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(filepath.Join("..data", n), link); err != nil {
				c.t.Fatal(err)
			}
		}
	}
	if c.cur != "" {
		if err := os.RemoveAll(filepath.Join(c.dir, c.cur)); err != nil {
			c.t.Fatal(err)
		}
	}
	c.cur = ts
}

func TestConfigMapSwapsAreSeen(t *testing.T) {
	cm := &configMap{t: t, dir: t.TempDir()}
	cm.swap(map[string]string{"p.rego": allow("first")})
	e, reloads := watched(t, cm.dir)
	if got := reasonsOf(e); !slices.Equal(got, []string{"first"}) {
		t.Fatalf("reasons %v", got)
	}
	if f := e.Status().Files; !slices.Equal(f, []string{"p.rego"}) {
		t.Fatalf("files %v: the ..data and ..<timestamp> copies must not be loaded", f)
	}
	for _, v := range []string{"second", "third"} {
		cm.swap(map[string]string{"p.rego": allow(v)})
		waitFor(t, reloads, v, func() bool { return slices.Equal(reasonsOf(e), []string{v}) })
	}
}

func TestASymlinkedPolicyDirSwapIsSeen(t *testing.T) {
	base := t.TempDir()
	for _, v := range []string{"v1", "v2"} {
		if err := os.Mkdir(filepath.Join(base, v), 0o755); err != nil {
			t.Fatal(err)
		}
		writePolicy(t, filepath.Join(base, v), allow(v))
	}
	link := filepath.Join(base, "current")
	if err := os.Symlink("v1", link); err != nil {
		t.Fatal(err)
	}
	e, reloads := watched(t, link)
	if got := reasonsOf(e); !slices.Equal(got, []string{"v1"}) {
		t.Fatalf("reasons %v", got)
	}
	if err := os.Symlink("v2", link+".tmp"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(link+".tmp", link); err != nil {
		t.Fatal(err)
	}
	waitFor(t, reloads, "v2", func() bool { return slices.Equal(reasonsOf(e), []string{"v2"}) })
}

func TestABrokenRevisionKeepsTheLastGoodOneServing(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, allow("good"))
	e, reloads := watched(t, dir)
	good := e.Status()
	writePolicy(t, dir, "package molly.policy\nthis is not rego")
	waitFor(t, reloads, "the failure", func() bool { return !e.Status().Healthy })
	st := e.Status()
	if st.Revision != good.Revision || !strings.Contains(st.LastError, "p.rego") || st.LastErrorAt.IsZero() {
		t.Fatalf("status %+v, want revision %s serving and the compile error", st, good.Revision)
	}
	d := e.Decide(context.Background(), routeIn("public", nil)).Decision()
	if !d.Allowed() || d.Revision() != good.Revision || !slices.Equal(d.Reasons(), []string{"good"}) {
		t.Fatalf("decision %v %v from %s", d.Tiers(), d.Reasons(), d.Revision())
	}
	// Back to the content serving: healthy again, nothing recompiled.
	writePolicy(t, dir, allow("good"))
	waitFor(t, reloads, "health", func() bool { return e.Status().Healthy })
	if st := e.Status(); st.Revision != good.Revision || st.LoadedAt != good.LoadedAt {
		t.Fatalf("status %+v, want the same revision as before", st)
	}
	// The directory vanishing is a failure too, and the revision keeps serving.
	if err := os.Remove(filepath.Join(dir, "p.rego")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, reloads, "the failure", func() bool { return !e.Status().Healthy })
	if d := e.Decide(context.Background(), routeIn("public", nil)).Decision(); !d.Allowed() {
		t.Fatalf("denied after the files vanished: %v", d.Reasons())
	}
}

// TestRequestsSeeOneRevision swaps a two-file ConfigMap between versions
// while deciders run: every decision must come from one version (both
// files from the same one) and one revision id must always mean the same
// version.
func TestRequestsSeeOneRevision(t *testing.T) {
	version := func(v int) map[string]string {
		return map[string]string{
			"a.rego": fmt.Sprintf("package molly.policy\nimport rego.v1\na := \"%d\"\n", v),
			"b.rego": fmt.Sprintf("package molly.policy\nimport rego.v1\nb := \"%d\"\ndecision := {\"allow\": true, \"tiers\": [\"T0\"], \"reasons\": [a, b]}\n", v),
		}
	}
	cm := &configMap{t: t, dir: t.TempDir()}
	cm.swap(version(0))
	ch := make(chan Status, 1024)
	e, err := New(context.Background(), Options{Dir: cm.dir, Debounce: 1e6, OnReload: func(s Status) { ch <- s }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })

	var (
		mu      sync.Mutex
		byRev   = map[string]string{}
		mixed   atomic.Value
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		decided atomic.Int64
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				d := e.Decide(context.Background(), routeIn("public", nil)).Decision()
				r := d.Reasons()
				decided.Add(1)
				if len(r) != 2 || r[0] != r[1] {
					mixed.Store(fmt.Sprintf("decision %v from revision %s", r, d.Revision()))
					continue
				}
				mu.Lock()
				if prev, ok := byRev[d.Revision()]; ok && prev != r[0] {
					mixed.Store(fmt.Sprintf("revision %s meant version %s and then %s", d.Revision(), prev, r[0]))
				}
				byRev[d.Revision()] = r[0]
				mu.Unlock()
			}
		}()
	}
	const last = 30
	for v := 1; v <= last; v++ {
		cm.swap(version(v))
	}
	want := fmt.Sprint(last)
	waitFor(t, ch, "the last version", func() bool { return reasonsOf(e)[0] == want })
	close(stop)
	wg.Wait()
	if m := mixed.Load(); m != nil {
		t.Fatal(m)
	}
	if decided.Load() == 0 || len(byRev) < 2 {
		t.Fatalf("%d decisions over %d revisions: the test saw no reload", decided.Load(), len(byRev))
	}
}
