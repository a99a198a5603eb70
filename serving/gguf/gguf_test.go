package gguf

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ollama/ollama/fs/ggml"
)

func params(c Config) uint64 {
	var n uint64
	for _, s := range c.TensorShapes() {
		p := uint64(1)
		for _, d := range s {
			p *= d
		}
		n += p
	}
	return n
}

func TestSizesHaveTheAdvertisedParameterCounts(t *testing.T) {
	cases := []struct {
		size     string
		min, max uint64
	}{
		{"tiny", 50e3, 200e3},
		{"small", 1e6, 5e6},
		{"bench", 100e6, 300e6},
	}
	for _, tc := range cases {
		c, err := SizeConfig(tc.size, 1)
		if err != nil {
			t.Fatal(err)
		}
		if n := params(c); n < tc.min || n > tc.max {
			t.Errorf("%s has %d parameters, want %d..%d", tc.size, n, tc.min, tc.max)
		}
	}
	if _, err := SizeConfig("huge", 1); err == nil {
		t.Error("unknown size accepted")
	}
}

func TestWrittenFilesDecodeWithTheirShapesAndKeys(t *testing.T) {
	dir := t.TempDir()
	c, _ := SizeConfig("tiny", 4)
	mp, ap := filepath.Join(dir, "m.gguf"), filepath.Join(dir, "a.gguf")
	if err := WriteModel(mp, c); err != nil {
		t.Fatal(err)
	}
	if err := WriteAdapter(ap, c, AdapterConfig{Name: "a", Rank: 4, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	decode := func(p string) *ggml.GGML {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		g, err := ggml.Decode(f, -1)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	m := decode(mp)
	shapes := c.TensorShapes()
	if got := len(m.Tensors().Items()); got != len(shapes) {
		t.Errorf("model has %d tensors, want %d", got, len(shapes))
	}
	for _, tt := range m.Tensors().Items() {
		if want := shapes[tt.Name]; len(want) != len(tt.Shape) || want[0] != tt.Shape[0] {
			t.Errorf("%s shape %v, want %v", tt.Name, tt.Shape, want)
		}
	}
	if m.KV().String(KeyBaseChecksum) != c.Checksum() || m.KV().String("tokenizer.ggml.model") != "llama" {
		t.Errorf("model keys: %v", m.KV())
	}
	a := decode(ap)
	if a.KV().String("general.type") != "adapter" || a.KV()["adapter.type"] != "lora" || a.KV()[KeyAdapterBaseChecksum] != c.Checksum() {
		t.Errorf("adapter keys: %v", a.KV())
	}
	want := map[string][]uint64{
		"blk.0.attn_q.weight.lora_a": {64, 4}, "blk.0.attn_q.weight.lora_b": {4, 64},
		"blk.1.attn_v.weight.lora_a": {64, 4}, "blk.1.attn_v.weight.lora_b": {4, 32},
		"blk.0.ffn_down.weight.lora_a": {128, 4}, "blk.0.ffn_down.weight.lora_b": {4, 64},
	}
	got := map[string][]uint64{}
	for _, tt := range a.Tensors().Items() {
		got[tt.Name] = tt.Shape
	}
	for name, w := range want {
		if g := got[name]; len(g) != 2 || g[0] != w[0] || g[1] != w[1] {
			t.Errorf("%s shape %v, want %v", name, g, w)
		}
	}
	if len(got) != 2*len(DefaultTargets)*c.Layers {
		t.Errorf("adapter has %d tensors", len(got))
	}
}
