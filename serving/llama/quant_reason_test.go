package llama

import (
	"path/filepath"
	"testing"

	"github.com/molly-gateway/molly/serving/gguf"
)

func loadSize(t *testing.T, size string) (*Model, gguf.Config) {
	t.Helper()
	cfg, err := gguf.SizeConfig(size, 3)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), size+".gguf")
	if err := gguf.WriteModel(p, cfg); err != nil {
		t.Fatal(err)
	}
	m, err := LoadModel(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m, cfg
}

// TestQuantizedKVCellsHaveTheirBlockSize measures one sequence's KV state
// for each cache type against the block formats' sizes (F16: 2 bytes a
// value; Q8_0: 34 bytes per 32 values; Q4_0: 18 per 32). The small model's
// head size, 32, is one block; a quantized V also exercises flash attention.
func TestQuantizedKVCellsHaveTheirBlockSize(t *testing.T) {
	m, cfg := loadSize(t, "small")
	embdKV := int64(cfg.Embd / cfg.Heads * cfg.HeadsKV)
	for _, tc := range []struct {
		typ        string
		num, denom int64
	}{{"f16", 2, 1}, {"q8_0", 34, 32}, {"q4_0", 18, 32}} {
		c, err := NewContext(m, ContextParams{NCtx: 256, NBatch: 128, NSeqMax: 1, Threads: 1, TypeK: tc.typ, TypeV: tc.typ})
		if err != nil {
			t.Fatalf("%s: %v", tc.typ, err)
		}
		b := NewBatch(128)
		size := func(n int) int64 {
			c.SeqRm(0, 0, -1)
			b.Clear()
			for i := range n {
				b.Add(int32(gguf.TokenByte0+'a'+i%26), i, 0, i == n-1)
			}
			if err := c.Decode(b); err != nil {
				t.Fatalf("%s: %v", tc.typ, err)
			}
			return c.SeqStateBytes(0)
		}
		got := size(100) - size(36)
		// Each saved cell also carries its position, seq-id count and one
		// seq id (llama_kv_cache's state_write_meta): 12 bytes.
		want := 64 * (int64(cfg.Layers)*2*embdKV*tc.num/tc.denom + 12)
		if got != want {
			t.Errorf("%s: 64 cells take %d bytes, want %d", tc.typ, got, want)
		}
		b.Free()
		c.Close()
	}
	if _, err := NewContext(m, ContextParams{NCtx: 64, NBatch: 64, NSeqMax: 1, TypeK: "q5_9"}); err == nil {
		t.Error("an unknown cache type was accepted")
	}
	// The tiny model's heads have 16 values, half a block: refused, where
	// ggml would abort the process.
	tiny, _ := loadSize(t, "tiny")
	if _, err := NewContext(tiny, ContextParams{NCtx: 64, NBatch: 64, NSeqMax: 1, TypeK: "q8_0", TypeV: "q8_0"}); err == nil {
		t.Error("a quantized cache was accepted for 16-value heads")
	}
}
