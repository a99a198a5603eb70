package serving

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/molly-gateway/molly/serving/gguf"
	"github.com/molly-gateway/molly/serving/llama"
)

// BenchmarkALoRAPrefixReuse measures the prefill an activated LoRA saves:
// after a base request on a 1,000-token prompt (prefix cache on), the time
// to the first token of a request on an aLoRA whose invocation sequence ends
// the prompt (the base part's KV is reused) against the same request on a
// plain LoRA of the same shape (the whole prompt is prefilled again), in
// interleaved rounds (MOLLY_BENCH_ROUNDS, default 3), medians. Bench model
// by default (MOLLY_BENCH_SIZE=tiny|small for a quick run).
//
//	go test -run '^$' -bench ALoRAPrefixReuse -benchtime 1x ./serving/
func BenchmarkALoRAPrefixReuse(b *testing.B) {
	size := os.Getenv("MOLLY_BENCH_SIZE")
	if size == "" {
		size = "bench"
	}
	dir := filepath.Join(os.TempDir(), "molly-bench-alora-"+size)
	if _, err := os.Stat(filepath.Join(dir, "done")); err != nil {
		if err := WriteDemo(dir, 1, size); err != nil {
			b.Fatal(err)
		}
		m, err := llama.LoadModel(filepath.Join(dir, DemoModelFile))
		if err != nil {
			b.Fatal(err)
		}
		inv, _ := m.Tokenize("<|im_start|>assistant\n", false, true)
		m.Close()
		u := make([]uint32, len(inv))
		for i, x := range inv {
			u[i] = uint32(x)
		}
		cfg, _ := gguf.SizeConfig(size, 1)
		if err := gguf.WriteAdapter(filepath.Join(dir, DemoAdapterDir, "alora.gguf"), cfg, gguf.AdapterConfig{Name: "alora", Seed: 5, Invocation: u}); err != nil {
			b.Fatal(err)
		}
		if err := gguf.WriteAdapter(filepath.Join(dir, DemoAdapterDir, "plain.gguf"), cfg, gguf.AdapterConfig{Name: "plain", Seed: 5}); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	rounds := 3
	if v := os.Getenv("MOLLY_BENCH_ROUNDS"); v != "" {
		fmt.Sscan(v, &rounds)
	}
	cfg := DemoConfig(dir)
	cfg.NSeqMax, cfg.NCtx, cfg.NBatch, cfg.PrefillChunk, cfg.PrefixCache = 2, 2*2048, 512, 32, true
	cfg.Threads = max(1, runtime.NumCPU()-1)
	e, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	tail, err := e.model.Tokenize("<|im_end|>\n<|im_start|>assistant\n", false, true)
	if err != nil {
		b.Fatal(err)
	}
	// Every measurement gets a prompt of its own (its first words differ),
	// so the only KV to reuse is the base request's just before it.
	promptFor := func(round int, kind string) []int32 {
		head, err := e.Tokenize(fmt.Sprintf("<|im_start|>user\nround %d, %s: ", round, kind) + strings.Repeat("the sources say the answer is grounded ", 200))
		if err != nil {
			b.Fatal(err)
		}
		return append(head[:1000-len(tail)], tail...)
	}
	first := func(adapter string, prompt []int32) time.Duration {
		start := time.Now()
		if _, err := e.Generate(context.Background(), Request{Adapter: adapter, Prompt: prompt, Params: SamplingParams{MaxTokens: 1}}, func(Event) error { return nil }); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var alora, plain []float64
	for range b.N {
		for r := range rounds {
			p := promptFor(r, "alora")
			first("", p) // the base prompt KV into the prefix cache
			alora = append(alora, first("alora", p).Seconds())
			p = promptFor(r, "plain")
			first("", p)
			plain = append(plain, first("plain", p).Seconds())
		}
	}
	a, p := median(alora), median(plain)
	fmt.Printf("aLoRA after a base request on a %d-token prompt: first token %.1f ms; plain LoRA %.1f ms; prefill saved %.1f ms (%.0f%%); model %s, %d threads, %d rounds\n",
		1000, a*1e3, p*1e3, (p-a)*1e3, 100*(p-a)/p, size, cfg.Threads, rounds)
	b.ReportMetric(a*1e3, "ms_first_token_alora")
	b.ReportMetric(p*1e3, "ms_first_token_plain")
}
