package serving

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/molly-gateway/molly/serving/gguf"
	"github.com/molly-gateway/molly/serving/llama"
)

// Benchmarks run on the "bench" model (~150M parameters, quantized to Q8_0
// with llama_model_quantize; MOLLY_BENCH_QUANT=f16 keeps F16,
// MOLLY_BENCH_SIZE=tiny|small picks a smaller model) so that decoding costs
// what it does with real models. The model and benchAdapters adapters are
// generated once per size under os.TempDir().
//
// BenchmarkVersusLlamaCpp is the comparison `make bench` prints: Molly's
// engine against llama.cpp itself (serving/llama's BatchedBench: libllama
// driven directly, batched-bench style, one llama_batch per step for all
// sequences of an adapter) on the same GGUF, adapters, prompt and thread
// count, in interleaved rounds, medians reported.
//
//	go test -run '^$' -bench VersusLlamaCpp -benchtime 1x ./serving/

var (
	benchOnce sync.Once
	benchDir  string
	benchErr  error
)

// benchAdapters is how many adapters the bench model gets: the 64-adapter
// hot-budget benchmark needs them all, the Zipf case the first 32.
const benchAdapters = 64

// benchModel generates (once) the bench model and adapters; it returns the
// directory WriteDemo's layout is in.
func benchModel(b *testing.B) string {
	b.Helper()
	size := os.Getenv("MOLLY_BENCH_SIZE")
	if size == "" {
		size = "bench"
	}
	benchOnce.Do(func() {
		benchDir = filepath.Join(os.TempDir(), fmt.Sprintf("molly-bench-%s-%s-%d", size, os.Getenv("MOLLY_BENCH_QUANT"), benchAdapters))
		if _, err := os.Stat(filepath.Join(benchDir, "done")); err == nil {
			return
		}
		if benchErr = WriteDemo(benchDir, 1, size); benchErr != nil {
			return
		}
		cfg, _ := gguf.SizeConfig(size, 1)
		for i := len(DemoAdapters); i < benchAdapters; i++ {
			p := filepath.Join(benchDir, DemoAdapterDir, fmt.Sprintf("extra%02d.gguf", i))
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
	return benchDir
}

func benchEngine(b *testing.B, mod func(*Config)) *Engine {
	b.Helper()
	cfg := DemoConfig(benchModel(b))
	cfg.NSeqMax = 16
	cfg.NCtx = 16 * 512
	if mod != nil {
		mod(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	return e
}

func benchAdapterNames(b *testing.B, e *Engine) []string {
	var names []string
	for _, a := range e.Adapters() {
		names = append(names, a.Name)
	}
	if len(names) < benchAdapters {
		b.Fatalf("need %d adapters, have %d", benchAdapters, len(names))
	}
	return names
}

// runConcurrent runs one greedy request per adapter name (""=base), each on
// prompt generating tokens tokens, and returns the tokens generated and every
// request's latency.
func runConcurrent(b *testing.B, e *Engine, adapters []string, prompt []int32, tokens int) (int, []time.Duration) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	lat := make([]time.Duration, len(adapters))
	for i, a := range adapters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			u, err := e.Generate(context.Background(), Request{Adapter: a, Prompt: prompt, Params: SamplingParams{MaxTokens: tokens}}, func(Event) error { return nil })
			lat[i] = time.Since(start)
			if err != nil {
				b.Error(err)
			}
			mu.Lock()
			total += u.CompletionTokens
			mu.Unlock()
		}()
	}
	wg.Wait()
	return total, lat
}

func benchPrompt(b *testing.B, tokenize func(string) ([]int32, error), n int) []int32 {
	p, err := tokenize(strings.Repeat("benchmark ", n/10+1))
	if err != nil {
		b.Fatal(err)
	}
	return p[:n]
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// versusCase is one workload of the comparison: sequence i runs on adapter
// seqs[i] (an index into the adapter list; -1: the base model).
type versusCase struct {
	name   string
	seqs   []int
	prompt int
	gen    int
}

func versusCases() []versusCase {
	same := func(n int) []int { return make([]int, n) }
	diff := make([]int, 8)
	for i := range diff {
		diff[i] = i
	}
	// 32 adapters, Zipf-distributed (s=1.1) over 16 sequences; fixed seed,
	// so every round and both engines see the same assignment.
	r := rand.New(rand.NewPCG(32, 16))
	z := rand.NewZipf(r, 1.1, 1, 31)
	zipf := make([]int, 16)
	for i := range zipf {
		zipf[i] = int(z.Uint64())
	}
	base := []int{-1, -1, -1, -1, -1, -1, -1, -1}
	return []versusCase{
		{"8 base model", base, 16, 32},
		{"1 seq", same(1), 16, 32},
		{"8 same", same(8), 16, 32},
		{"8 different", diff, 16, 32},
		{"16 same", same(16), 16, 32},
		{"32 Zipf/16", zipf, 16, 32},
		{"prefill 256", same(1), 256, 1},
	}
}

// BenchmarkVersusLlamaCpp prints the table of Molly against llama.cpp: tokens
// per second (generated tokens over wall time, prefill included; for the
// prefill case prompt tokens per second) for each case, at 1 thread and at
// runtime.NumCPU() threads, medians of MOLLY_BENCH_ROUNDS (default 3)
// interleaved rounds, each running both back to back in alternating order;
// the ratio columns are medians of the ratios within a round. Beside wall
// time it reports tokens per CPU-second of the process, which other work on
// the machine disturbs less (at more than one thread ggml's workers spin at
// barriers, which counts as CPU time too). Every ratio is
// also reported as a metric. MOLLY_BENCH_THREADS=1,4 picks the thread counts.
func BenchmarkVersusLlamaCpp(b *testing.B) {
	dir := benchModel(b)
	rounds := 3
	if v := os.Getenv("MOLLY_BENCH_ROUNDS"); v != "" {
		fmt.Sscan(v, &rounds)
	}
	threads := []int{1}
	if runtime.NumCPU() > 1 {
		threads = append(threads, runtime.NumCPU())
	}
	if v := os.Getenv("MOLLY_BENCH_THREADS"); v != "" {
		threads = nil
		for _, f := range strings.Split(v, ",") {
			var n int
			if _, err := fmt.Sscan(f, &n); err != nil || n < 1 {
				b.Fatalf("MOLLY_BENCH_THREADS=%q: want thread counts such as 1,4", v)
			}
			threads = append(threads, n)
		}
	}
	cases := versusCases()
	for range b.N {
		for _, th := range threads {
			e := benchEngine(b, func(c *Config) { c.Threads = th })
			names := benchAdapterNames(b, e)
			m, err := llama.LoadModel(filepath.Join(dir, DemoModelFile))
			if err != nil {
				b.Fatal(err)
			}
			var ads []*llama.Adapter
			for _, name := range names[:32] {
				a, err := llama.LoadAdapter(m, filepath.Join(dir, DemoAdapterDir, name+".gguf"))
				if err != nil {
					b.Fatal(err)
				}
				ads = append(ads, a)
			}
			lc, err := llama.NewContext(m, llama.ContextParams{NCtx: 16 * 512, NBatch: 512, NSeqMax: 16, Threads: th, Unified: true})
			if err != nil {
				b.Fatal(err)
			}
			molly := func(c versusCase) measure {
				adapters := make([]string, len(c.seqs))
				for i, a := range c.seqs {
					if a >= 0 {
						adapters[i] = names[a]
					}
				}
				prompt := benchPrompt(b, e.Tokenize, c.prompt)
				cpu, start := cpuTime(), time.Now()
				n, _ := runConcurrent(b, e, adapters, prompt, c.gen)
				wall, used := time.Since(start), cpuTime()-cpu
				if c.gen == 1 {
					n = c.prompt
				}
				return measure{float64(n) / wall.Seconds(), float64(n) / used.Seconds()}
			}
			llamacpp := func(c versusCase) measure {
				prompt := benchPrompt(b, func(s string) ([]int32, error) { return m.Tokenize(s, true, true) }, c.prompt)
				// Wall time around the call, as for Molly (request set in, all
				// answers out), not BatchedBench's own timers.
				cpu, start := cpuTime(), time.Now()
				res, err := llama.BatchedBench(lc, llama.BenchSpec{Prompt: prompt, NSeq: len(c.seqs), NGen: c.gen, Adapters: ads, SeqAdapter: c.seqs})
				wall, used := time.Since(start), cpuTime()-cpu
				if err != nil {
					b.Fatal(err)
				}
				n := res.Tokens
				if c.gen == 1 {
					n = c.prompt
				}
				return measure{float64(n) / wall.Seconds(), float64(n) / used.Seconds()}
			}
			load := loadAverage()
			// Warm up: every adapter hot in the engine, caches filled.
			for _, c := range cases {
				molly(c)
				llamacpp(c)
			}
			// Each round runs every case on both, back to back in alternating
			// order; ratios are taken within a round (the machine's load
			// drifts between rounds) and their medians reported.
			mt := make([][]measure, len(cases))
			lt := make([][]measure, len(cases))
			var diffSame, zipfSame []measure
			for r := range rounds {
				for i, c := range cases {
					var mm, ll measure
					if r%2 == 0 {
						mm, ll = molly(c), llamacpp(c)
					} else {
						ll, mm = llamacpp(c), molly(c)
					}
					mt[i], lt[i] = append(mt[i], mm), append(lt[i], ll)
				}
				at := func(name string) measure {
					return mt[slices.IndexFunc(cases, func(c versusCase) bool { return c.name == name })][r]
				}
				diffSame = append(diffSame, at("8 different").over(at("8 same")))
				zipfSame = append(zipfSame, at("32 Zipf/16").over(at("16 same")))
			}
			// Print each thread count's table when it is done.
			var out strings.Builder
			tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintf(tw, "threads\tcase\tmolly tok/s\tllama.cpp tok/s\tratio\tmolly tok/cpu-s\tllama.cpp tok/cpu-s\tratio\t\n")
			for i, c := range cases {
				ratios := make([]measure, len(mt[i]))
				for r := range ratios {
					ratios[r] = mt[i][r].over(lt[i][r])
				}
				mm, ll, rr := medians(mt[i]), medians(lt[i]), medians(ratios)
				fmt.Fprintf(tw, "%d\t%s\t%.1f\t%.1f\t%.3f\t%.1f\t%.1f\t%.3f\t\n", th, c.name, mm.tps, ll.tps, rr.tps, mm.tpc, ll.tpc, rr.tpc)
				b.ReportMetric(rr.tps, fmt.Sprintf("x-llama.cpp-%s-t%d", strings.ReplaceAll(c.name, " ", ""), th))
			}
			ds, zs := medians(diffSame), medians(zipfSame)
			fmt.Fprintf(tw, "%d\tMolly 8 different / 8 same\t\t\t%.3f\t\t\t%.3f\t\n", th, ds.tps, ds.tpc)
			fmt.Fprintf(tw, "%d\tMolly 32 Zipf/16 / 16 same\t\t\t%.3f\t\t\t%.3f\t\n", th, zs.tps, zs.tpc)
			tw.Flush()
			fmt.Printf("\nMolly vs llama.cpp at %d threads (%s, %d rounds, medians, ratios within a round; load average %s before, %s after)\n%s\n",
				th, filepath.Base(dir), rounds, load, loadAverage(), out.String())
			b.ReportMetric(ds.tps, fmt.Sprintf("ratio-8diff/8same-t%d", th))
			b.ReportMetric(zs.tps, fmt.Sprintf("ratio-zipf/16same-t%d", th))
			lc.Close()
			for _, a := range ads {
				a.Close()
			}
			m.Close()
			e.Close()
		}
	}
}

// measure is one run's throughput: tokens per second of wall time, and per
// second of the process's CPU time (user plus system, all threads), which a
// busy machine disturbs less.
type measure struct{ tps, tpc float64 }

func (m measure) over(o measure) measure { return measure{m.tps / o.tps, m.tpc / o.tpc} }

func medians(ms []measure) measure {
	var a, b []float64
	for _, m := range ms {
		a, b = append(a, m.tps), append(b, m.tpc)
	}
	return measure{median(a), median(b)}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// BenchmarkHotBudget reports how a working set larger than the hot budget
// degrades: 64 adapters requested uniformly at random by 8 concurrent
// clients, with a hot budget of 8 adapters against one that holds all 64
// (every adapter's file bytes stay warm in both). Throughput and p95
// latency are reported relative to all-hot, medians of interleaved rounds.
func BenchmarkHotBudget(b *testing.B) {
	dir := benchModel(b)
	st, err := os.Stat(filepath.Join(dir, DemoAdapterDir, DemoAdapters[0]+".gguf"))
	if err != nil {
		b.Fatal(err)
	}
	mk := func(hot int64) *Engine {
		return benchEngine(b, func(c *Config) {
			c.NSeqMax, c.NCtx = 8, 8*512
			c.HotBytes = hot
			c.WarmBytes = 80 * st.Size()
		})
	}
	all := mk(80 * st.Size())
	names := benchAdapterNames(b, all)
	prompt := benchPrompt(b, all.Tokenize, 16)
	runConcurrent(b, all, names[:1], prompt, 1)
	hb := all.Adapters()[0].HotBytes
	if hb <= 0 {
		b.Fatal("no resident size for a hot adapter")
	}
	small := mk(8*hb + hb/2) // room for 8 hot adapters, not 9
	const requests, clients, tokens = 96, 8, 16
	run := func(e *Engine, seed uint64) (float64, time.Duration) {
		r := rand.New(rand.NewPCG(seed, 64))
		work := make(chan string, requests)
		for range requests {
			work <- names[r.IntN(len(names))]
		}
		close(work)
		var mu sync.Mutex
		var lats []time.Duration
		total := 0
		start := time.Now()
		var wg sync.WaitGroup
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for a := range work {
					n, lat := runConcurrent(b, e, []string{a}, prompt, tokens)
					mu.Lock()
					total += n
					lats = append(lats, lat[0])
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		tps := float64(total) / time.Since(start).Seconds()
		slices.Sort(lats)
		return tps, lats[len(lats)*95/100]
	}
	run(all, 0) // all 64 hot
	run(small, 0)
	var tpsAll, tpsSmall, p95All, p95Small []float64
	for i := range 3 * b.N {
		seed := uint64(i + 1)
		if i%2 == 0 {
			t, p := run(all, seed)
			tpsAll, p95All = append(tpsAll, t), append(p95All, p.Seconds())
			t, p = run(small, seed)
			tpsSmall, p95Small = append(tpsSmall, t), append(p95Small, p.Seconds())
		} else {
			t, p := run(small, seed)
			tpsSmall, p95Small = append(tpsSmall, t), append(p95Small, p.Seconds())
			t, p = run(all, seed)
			tpsAll, p95All = append(tpsAll, t), append(p95All, p.Seconds())
		}
	}
	s := small.Stats().Memory
	b.ReportMetric(median(tpsSmall)/median(tpsAll), "throughput-hot8/all-hot")
	b.ReportMetric(median(p95Small)/median(p95All), "p95-hot8/all-hot")
	b.ReportMetric(median(tpsAll), "tok/s-all-hot")
	b.ReportMetric(median(tpsSmall), "tok/s-hot8")
	b.ReportMetric(median(p95All)*1000, "p95-ms-all-hot")
	b.ReportMetric(median(p95Small)*1000, "p95-ms-hot8")
	fmt.Printf("\n64 adapters uniform, 8 clients, %d threads: all hot %.1f tok/s p95 %.0f ms; hot budget 8: %.1f tok/s (%.2fx) p95 %.0f ms (%.2fx); %d loads, %d evictions\n",
		small.cfg.Threads, median(tpsAll), median(p95All)*1000, median(tpsSmall), median(tpsSmall)/median(tpsAll),
		median(p95Small)*1000, median(p95Small)/median(p95All), s.AdapterLoads, s.AdapterEvictions)
}

// BenchmarkAdapterPromotion reports cold→hot promotion time (read, hash,
// validate, initialise in llama.cpp; one 1-token request) and the resident
// bytes of a hot adapter.
func BenchmarkAdapterPromotion(b *testing.B) {
	dir := benchModel(b)
	e := benchEngine(b, func(c *Config) { c.AdapterDir = "" })
	src := filepath.Join(dir, DemoAdapterDir, DemoAdapters[0]+".gguf")
	prompt := benchPrompt(b, e.Tokenize, 4)
	var total time.Duration
	for i := range b.N {
		name := fmt.Sprintf("promo%d", i)
		start := time.Now()
		if err := e.AddAdapter(name, src); err != nil {
			b.Fatal(err)
		}
		runConcurrent(b, e, []string{name}, prompt, 1)
		total += time.Since(start)
		if i == 0 {
			for _, a := range e.Adapters() {
				if a.Name == name {
					b.ReportMetric(float64(a.HotBytes), "bytes/hot-adapter")
				}
			}
		}
		_ = e.RemoveAdapter(name)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/promotion")
}
