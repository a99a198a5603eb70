package serving

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/serving/gguf"
)

// smallDemo writes the small demo model (heads of 32 values: one block of
// the quantized KV types) into a temp dir.
func smallDemo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := WriteDemo(dir, 1, "small"); err != nil {
		t.Fatal(err)
	}
	return dir
}

func greedyOutputs(t *testing.T, cfg Config) []string {
	t.Helper()
	cfg.NSeqMax, cfg.NCtx, cfg.Threads = 2, 1024, 1
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var out []string
	for _, p := range []string{"hello", "the quick brown fox", strings.Repeat("a longer prompt ", 12)} {
		s, _ := mustText(t, e, greedy("molly-demo", p, 24))
		out = append(out, s)
	}
	return out
}

func TestQ8_0KVCacheIsDeterministicAndCountedAtItsSize(t *testing.T) {
	dir := smallDemo(t)
	base, _ := gguf.SizeConfig("small", 1)
	embdKV := int64(base.Embd / base.Heads * base.HeadsKV)
	ref := map[string][]string{}
	for _, tc := range []struct {
		typ        string
		num, denom int64
	}{{"f16", 2, 1}, {"q8_0", 34, 32}} {
		cfg := DemoConfig(dir)
		cfg.KVCacheType = tc.typ
		a, b := greedyOutputs(t, cfg), greedyOutputs(t, cfg)
		for i := range a {
			if a[i] != b[i] {
				t.Errorf("%s: prompt %d gave %q, then %q", tc.typ, i, a[i], b[i])
			}
		}
		ref[tc.typ] = a
		cfg.NSeqMax, cfg.NCtx, cfg.Threads = 1, 256, 1
		e, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(base.Layers) * 2 * embdKV * tc.num / tc.denom; e.cellBytes != want {
			t.Errorf("%s: a KV cell counts %d bytes in the budget, want %d", tc.typ, e.cellBytes, want)
		}
		e.Close()
	}
	same := 0
	for i := range ref["f16"] {
		if ref["f16"][i] == ref["q8_0"][i] {
			same++
		}
	}
	t.Logf("greedy outputs equal between F16 and Q8_0 KV: %d of %d", same, len(ref["f16"]))
	if _, err := New(Config{ModelPath: filepath.Join(demoDir, DemoModelFile), KVCacheType: "q8_0", Threads: 1}); err == nil {
		t.Error("the tiny model's 16-value heads were accepted with a Q8_0 cache")
	}
}

func TestQuantizedBasesLoadAndDecodeDeterministically(t *testing.T) {
	dir := smallDemo(t)
	src := filepath.Join(dir, DemoModelFile)
	var q8 uint64 // Q8_0 weight bytes: both 4-bit types are smaller
	for _, tc := range []struct{ ftype, desc string }{{"q8_0", "Q8_0"}, {"q4_0", "Q4_0"}, {"Q4_K_M", "Q4_K - Medium"}} {
		p := filepath.Join(dir, "copy-"+tc.ftype+".gguf")
		copyFile(t, src, p)
		if err := QuantizeModel(p, tc.ftype); err != nil {
			t.Fatalf("%s: %v", tc.ftype, err)
		}
		cfg := Config{ModelPath: p, ModelName: "molly-demo", AdapterDir: filepath.Join(dir, DemoAdapterDir), NSeqMax: 1, NCtx: 256, Threads: 1}
		e, err := New(cfg)
		if err != nil {
			t.Fatalf("%s: %v", tc.ftype, err)
		}
		desc, _, bytes, _ := e.ModelInfo()
		e.Close()
		if !strings.Contains(desc, tc.desc) || q8 != 0 && bytes >= q8 {
			t.Errorf("%s: %q, %d weight bytes (Q8_0: %d)", tc.ftype, desc, bytes, q8)
		}
		if q8 == 0 {
			q8 = bytes
		}
		a, b := greedyOutputs(t, cfg), greedyOutputs(t, cfg)
		for i := range a {
			if a[i] != b[i] || a[i] == "" {
				t.Errorf("%s: prompt %d gave %q, then %q", tc.ftype, i, a[i], b[i])
			}
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
