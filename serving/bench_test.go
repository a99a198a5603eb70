package serving

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/molly-gateway/molly/serving/gguf"
)

// Benchmarks run on the "bench" model (~150M parameters, F16) so that decoding
// is memory bound as with real models; MOLLY_BENCH_SIZE=tiny|small picks a
// smaller one. The base is quantized to Q8_0 with llama_model_quantize
// (MOLLY_BENCH_QUANT=f16 keeps F16), as served models are. The model is
// generated once per size under os.TempDir().
//
//	go test -run '^$' -bench . -benchtime 3x ./serving/

var (
	benchOnce sync.Once
	benchDir  string
	benchErr  error
)

const benchAdapters = 8

func benchEngine(b *testing.B) *Engine {
	b.Helper()
	size := os.Getenv("MOLLY_BENCH_SIZE")
	if size == "" {
		size = "bench"
	}
	benchOnce.Do(func() {
		benchDir = filepath.Join(os.TempDir(), "molly-bench-"+size+"-"+os.Getenv("MOLLY_BENCH_QUANT"))
		if _, err := os.Stat(filepath.Join(benchDir, "done")); err == nil {
			return
		}
		if benchErr = WriteDemo(benchDir, 1, size); benchErr != nil {
			return
		}
		cfg, _ := gguf.SizeConfig(size, 1)
		for i := len(DemoAdapters); i < benchAdapters; i++ {
			p := filepath.Join(benchDir, DemoAdapterDir, fmt.Sprintf("extra%d.gguf", i))
			if benchErr = gguf.WriteAdapter(p, cfg, gguf.AdapterConfig{Name: "x", Seed: int64(100 + i)}); benchErr != nil {
				return
			}
		}
		if q := os.Getenv("MOLLY_BENCH_QUANT"); q != "f16" {
			if q == "" {
				q = "q8_0"
			}
			if benchErr = QuantizeModel(filepath.Join(benchDir, DemoModelFile), q); benchErr != nil {
				return
			}
		}
		benchErr = os.WriteFile(filepath.Join(benchDir, "done"), nil, 0o644)
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	cfg := DemoConfig(benchDir)
	cfg.NSeqMax = 8
	cfg.NCtx = 8 * 1024
	e, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	return e
}

func benchAdapterNames(e *Engine) []string {
	var names []string
	for _, a := range e.Adapters() {
		names = append(names, a.Name)
	}
	return names
}

// runConcurrent runs one greedy request per adapter name (""=base), each
// generating tokens tokens, and returns the tokens generated.
func runConcurrent(b *testing.B, e *Engine, adapters []string, prompt []int32, tokens int) int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for _, a := range adapters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u, err := e.Generate(context.Background(), Request{Adapter: a, Prompt: prompt, Params: SamplingParams{MaxTokens: tokens}}, func(Event) error { return nil })
			if err != nil {
				b.Error(err)
			}
			mu.Lock()
			total += u.CompletionTokens
			mu.Unlock()
		}()
	}
	wg.Wait()
	return total
}

func benchPrompt(b *testing.B, e *Engine, n int) []int32 {
	p, err := e.Tokenize(strings.Repeat("benchmark ", n/10+1))
	if err != nil {
		b.Fatal(err)
	}
	return p[:n]
}

// BenchmarkDecode reports decode tokens/s for one sequence, 8 sequences on one
// adapter and 8 sequences on 8 different adapters, and the ratio of the last
// two (1 would mean adapter diversity costs nothing).
func BenchmarkDecode(b *testing.B) {
	e := benchEngine(b)
	names := benchAdapterNames(e)
	if len(names) < benchAdapters {
		b.Fatalf("need %d adapters, have %d", benchAdapters, len(names))
	}
	prompt := benchPrompt(b, e, 16)
	same := make([]string, benchAdapters)
	for i := range same {
		same[i] = names[0]
	}
	// Warm every adapter up (cold→hot) outside the timings.
	runConcurrent(b, e, names[:benchAdapters], prompt, 1)
	const tokens = 32
	measure := func(adapters []string) float64 {
		start := time.Now()
		n := runConcurrent(b, e, adapters, prompt, tokens)
		return float64(n) / time.Since(start).Seconds()
	}
	var single, sameTPS, diffTPS float64
	b.ResetTimer()
	for range b.N {
		single += measure(names[:1])
		sameTPS += measure(same)
		diffTPS += measure(names[:benchAdapters])
	}
	b.ReportMetric(single/float64(b.N), "tok/s-1seq")
	b.ReportMetric(sameTPS/float64(b.N), "tok/s-8same")
	b.ReportMetric(diffTPS/float64(b.N), "tok/s-8diff")
	b.ReportMetric(diffTPS/sameTPS, "ratio-diff/same")
}

// BenchmarkPrefill reports prompt-processing tokens/s for a 256-token prompt.
func BenchmarkPrefill(b *testing.B) {
	e := benchEngine(b)
	prompt := benchPrompt(b, e, 256)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		runConcurrent(b, e, []string{""}, prompt, 1)
	}
	b.ReportMetric(float64(len(prompt)*b.N)/time.Since(start).Seconds(), "prompt-tok/s")
}

// BenchmarkAdapterPromotion reports cold→hot promotion time (read, validate,
// initialise in llama.cpp; one 1-token request) and bytes per hot adapter.
func BenchmarkAdapterPromotion(b *testing.B) {
	e := benchEngine(b)
	src := filepath.Join(benchDir, DemoAdapterDir, DemoAdapters[0]+".gguf")
	st, err := os.Stat(src)
	if err != nil {
		b.Fatal(err)
	}
	prompt := benchPrompt(b, e, 4)
	var total time.Duration
	for i := range b.N {
		name := fmt.Sprintf("promo%d", i)
		start := time.Now()
		if err := e.AddAdapter(name, src); err != nil {
			b.Fatal(err)
		}
		runConcurrent(b, e, []string{name}, prompt, 1)
		total += time.Since(start)
		_ = e.RemoveAdapter(name)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/promotion")
	b.ReportMetric(float64(st.Size()), "bytes/hot-adapter")
}
