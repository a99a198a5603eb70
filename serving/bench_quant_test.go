package serving

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/molly-gateway/molly/serving/llama"
)

// BenchmarkQuantization measures, on the bench model (MOLLY_BENCH_SIZE=small
// for a quick run; tiny's heads are too small for a quantized cache), every
// combination of weights F16, Q8_0, Q4_0, Q4_K_M and KV cache F16, Q8_0:
// the memory of one sequence holding 512 tokens (llama_state_seq_get_size,
// measured from the cache) and greedy decode tokens/s of 4 concurrent
// sequences, in interleaved rounds (MOLLY_BENCH_ROUNDS, default 3), medians,
// relative to F16 weights with an F16 cache measured in the same run.
//
//	go test -run '^$' -bench Quantization -benchtime 1x ./serving/
func BenchmarkQuantization(b *testing.B) {
	size := os.Getenv("MOLLY_BENCH_SIZE")
	if size == "" || size == "tiny" {
		size = "bench"
	}
	dir := filepath.Join(os.TempDir(), "molly-bench-quant-"+size)
	weights := []string{"f16", "q8_0", "q4_0", "q4_k_m"}
	if _, err := os.Stat(filepath.Join(dir, "done")); err != nil {
		if err := WriteDemo(dir, 1, size); err != nil {
			b.Fatal(err)
		}
		src := filepath.Join(dir, DemoModelFile)
		for _, w := range weights {
			p := filepath.Join(dir, w+".gguf")
			if err := os.Link(src, p); err != nil {
				b.Fatal(err)
			}
			if w != "f16" || size != "bench" { // bench is written as F16
				if err := QuantizeModel(p, w); err != nil {
					b.Fatal(err)
				}
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	rounds := 3
	if v := os.Getenv("MOLLY_BENCH_ROUNDS"); v != "" {
		fmt.Sscan(v, &rounds)
	}
	threads := max(1, runtime.NumCPU()-1)
	type key struct{ w, kv string }
	tps := map[key][]float64{}
	mem := map[key]int64{}
	var bytes = map[string]uint64{}
	kvs := []string{"f16", "q8_0"}
	for range b.N {
		for r := 0; r < rounds; r++ {
			for _, w := range weights {
				for _, kv := range kvs {
					k := key{w, kv}
					cfg := Config{ModelPath: filepath.Join(dir, w+".gguf"), ModelName: "molly-demo", NSeqMax: 4, NCtx: 4 * 1024, Threads: threads, KVCacheType: kv}
					e, err := New(cfg)
					if err != nil {
						b.Fatal(err)
					}
					_, _, wb, _ := e.ModelInfo()
					bytes[w] = wb
					if r == 0 {
						mem[k] = seqMemory(b, e, kv)
					}
					prompt := benchPrompt(b, e.Tokenize, 128)
					start := time.Now()
					n, _ := runConcurrent(b, e, []string{"", "", "", ""}, prompt, 32)
					tps[k] = append(tps[k], float64(n)/time.Since(start).Seconds())
					e.Close()
				}
			}
		}
	}
	base := median(tps[key{"f16", "f16"}])
	tw := tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "weights\tKV\tweight MiB\tKV per seq (512 tok) KiB\ttok/s (4 seqs)\tvs F16/F16\t\n")
	for _, w := range weights {
		for _, kv := range kvs {
			k := key{w, kv}
			t := median(tps[k])
			fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.1f\t%.2fx\t\n", w, kv, float64(bytes[w])/(1<<20), float64(mem[k])/1024, t, t/base)
			b.ReportMetric(t, "tok/s_"+w+"_kv_"+kv)
		}
	}
	tw.Flush()
	fmt.Printf("model %s, %d threads, %d rounds, medians\n", size, threads, rounds)
}

// seqMemory prefills 512 tokens in a context of the engine's model and KV
// type and returns llama_state_seq_get_size of that sequence.
func seqMemory(b *testing.B, e *Engine, kv string) int64 {
	c, err := llama.NewContext(e.model, llama.ContextParams{NCtx: 1024, NBatch: 512, NSeqMax: 1, Threads: e.cfg.Threads, TypeK: kv, TypeV: kv})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	bt := llama.NewBatch(512)
	defer bt.Free()
	for i, t := range benchPrompt(b, e.Tokenize, 512) {
		bt.Add(t, i, 0, i == 511)
	}
	if err := c.Decode(bt); err != nil {
		b.Fatal(err)
	}
	return c.SeqStateBytes(0)
}
