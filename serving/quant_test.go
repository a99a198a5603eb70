package serving

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/serving/gguf"
	"github.com/molly-gateway/molly/serving/llama"
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

// TestQuantizeSaysWhyBeforeLlamaCpp: what llama_model_quantize would fail
// on with only a status is refused first with the reason — a missing file,
// a directory, a file that is not GGUF or is cut short, a LoRA adapter, a
// model already of the type, and quantized weights llama.cpp does not
// requantize (the oracle: llama.Quantize itself fails on that file) — and
// the file is left as it was.
func TestQuantizeSaysWhyBeforeLlamaCpp(t *testing.T) {
	dir := smallDemo(t)
	src := filepath.Join(dir, DemoModelFile)
	q8 := filepath.Join(dir, "q8.gguf")
	copyFile(t, src, q8)
	if err := QuantizeModel(q8, "q8_0"); err != nil {
		t.Fatal(err)
	}
	text := filepath.Join(dir, "notes.gguf")
	if err := os.WriteFile(text, []byte("not a model at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	whole, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(dir, "cut.gguf")
	if err := os.WriteFile(cut, whole[:64], 0o644); err != nil {
		t.Fatal(err)
	}
	adapter := filepath.Join(dir, DemoAdapterDir, DemoAdapters[0]+".gguf")
	for _, tc := range []struct{ path, ftype, want string }{
		{filepath.Join(dir, "missing.gguf"), "q8_0", "does not exist"},
		{dir, "q8_0", "is a directory"},
		{text, "q8_0", "is not a GGUF file"},
		{cut, "q8_0", "is not a valid GGUF file"},
		{adapter, "q8_0", "is a LoRA adapter, not a model"},
		{q8, "q8_0", "is already Q8_0"},
		{q8, "Q8_0", "is already Q8_0"},
		{q8, "q4_0", "cannot be converted to Q4_0 from Q8_0"},
		{q8, "f16", "cannot be converted to F16 from Q8_0"},
		{q8, "q4_k_m", "cannot be converted to Q4_K_M from Q8_0"},
		{src, "q9_9", `unknown type "q9_9"`},
	} {
		before, _ := os.ReadFile(tc.path)
		err := QuantizeModel(tc.path, tc.ftype)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "llama.cpp error") {
			t.Errorf("%s to %s: %v, want %q", filepath.Base(tc.path), tc.ftype, err, tc.want)
		}
		if after, _ := os.ReadFile(tc.path); string(after) != string(before) {
			t.Errorf("%s to %s: the file changed", filepath.Base(tc.path), tc.ftype)
		}
		if _, err := os.Stat(tc.path + ".quantizing"); err == nil {
			t.Errorf("%s to %s: a temporary file was left", filepath.Base(tc.path), tc.ftype)
		}
	}
	// llama.cpp itself refuses to requantize: the check only says so first.
	if err := llama.Quantize(q8, filepath.Join(dir, "q4.gguf"), "q4_0"); err == nil {
		t.Fatal("llama.cpp requantized Q8_0 to Q4_0; CheckQuantizable refuses what llama.cpp allows")
	}
	// And the unquantized model still converts (the checks refuse nothing else).
	for _, ftype := range []string{"f16", "q4_0"} {
		p := filepath.Join(dir, ftype+".gguf")
		copyFile(t, src, p)
		if err := QuantizeModel(p, ftype); err != nil {
			t.Fatalf("%s: %v", ftype, err)
		}
	}
	if err := QuantizeModel(filepath.Join(dir, "f16.gguf"), "f16"); err == nil || !strings.Contains(err.Error(), "is already F16") {
		t.Errorf("F16 to f16: %v", err)
	}
}
