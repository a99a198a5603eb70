package serving

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/molly-gateway/molly/serving/gguf"
)

// BenchmarkSpeculative measures speculative decoding (speculative.go)
// on the bench model (F16; MOLLY_BENCH_SIZE=small for a quick run): one
// request of 128 tokens after a 32-token prompt, tokens/s against plain
// greedy decoding on the same target measured in the same run, in
// interleaved rounds (MOLLY_BENCH_ROUNDS, default 3), medians, and the
// acceptance rate (accepted / proposed draft tokens). Drafts: the target
// itself (the upper bound: everything accepted, but the draft costs a
// target), a Q4_0 copy of the target (smaller, close to it), and the
// target's first quarter of layers (a truncated-layer draft; on random
// weights it agrees with its target about as often as chance). Greedy
// outputs are checked equal to plain greedy. Speculative sampling
// (temperature 0.7, top_k 40) with the Q4_0 draft is measured against plain
// sampling on the same target.
//
//	go test -run '^$' -bench Speculative -benchtime 1x ./serving/
func BenchmarkSpeculative(b *testing.B) {
	size := os.Getenv("MOLLY_BENCH_SIZE")
	if size == "" || size == "tiny" {
		size = "bench"
	}
	target, q4, trunc := specModels(b, size)
	rounds := 3
	if v := os.Getenv("MOLLY_BENCH_ROUNDS"); v != "" {
		fmt.Sscan(v, &rounds)
	}
	const tokens, k = 128, 4
	threads := max(1, runtime.NumCPU()-1)
	mk := func(draft string) *Engine {
		e, err := New(Config{ModelPath: target, NSeqMax: 1, NCtx: 512, Threads: threads, DraftModel: draft, DraftTokens: k})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { e.Close() })
		return e
	}
	// The sampled cases (temperature 0.7, top_k 40, a seed per round) are
	// speculative sampling against plain sampling on the plain engine; their
	// outputs are draws, not compared.
	cases := []struct {
		name, draft string
		temp        float64
	}{{"plain greedy", "", 0}, {"draft = target", target, 0}, {"draft = Q4_0 copy", q4, 0}, {"draft = truncated layers", trunc, 0},
		{"plain sampling T=0.7", "", 0.7}, {"sampling, draft = Q4_0 copy", q4, 0.7}}
	engines := make([]*Engine, len(cases))
	for i, c := range cases {
		if c.draft == "" && i > 0 {
			engines[i] = engines[0]
			continue
		}
		engines[i] = mk(c.draft)
	}
	prompt := benchPrompt(b, engines[0].Tokenize, 32)
	tps := make([][]float64, len(cases))
	want := ""
	for b.Loop() {
		for round := range rounds {
			for i, e := range engines {
				text := ""
				seed := int64(round)
				p := SamplingParams{MaxTokens: tokens}
				if cases[i].temp > 0 {
					p.Temperature, p.TopK, p.Seed = cases[i].temp, 40, &seed
				}
				start := time.Now()
				u, err := e.Generate(context.Background(), Request{Prompt: prompt, Params: p}, func(ev Event) error {
					text += ev.Text
					return nil
				})
				d := time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				if i == 0 && want == "" {
					want = text
				} else if cases[i].temp == 0 && text != want {
					n := 0
					for n < len(text) && n < len(want) && text[n] == want[n] {
						n++
					}
					b.Fatalf("%s: output differs from plain greedy at byte %d of %d/%d; stats %+v", cases[i].name, n, len(text), len(want), e.SpeculativeStats())
				}
				tps[i] = append(tps[i], float64(u.CompletionTokens)/d.Seconds())
			}
		}
	}
	greedyBase, sampledBase := median(tps[0]), median(tps[4])
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "speculative decoding, %s model, k=%d, %d tokens, %d threads, %d rounds (medians)\n", size, k, tokens, threads, rounds)
	fmt.Fprintln(w, "case\ttokens/s\tspeed-up\tacceptance\ttokens/verify")
	for i, c := range cases {
		st := engines[i].SpeculativeStats()
		acc, per := "-", "-"
		base := greedyBase
		if c.temp > 0 {
			base = sampledBase
		}
		if st.Proposed > 0 {
			acc = fmt.Sprintf("%.2f", float64(st.Accepted)/float64(st.Proposed))
			per = fmt.Sprintf("%.2f", float64(st.Accepted+st.Rounds)/float64(st.Rounds))
			b.ReportMetric(float64(st.Accepted)/float64(st.Proposed), "accept/"+fmt.Sprint(i))
		}
		fmt.Fprintf(w, "%s\t%.1f\t%.2fx\t%s\t%s\n", c.name, median(tps[i]), median(tps[i])/base, acc, per)
		b.ReportMetric(median(tps[i])/base, "speedup/"+fmt.Sprint(i))
	}
	w.Flush()
}

// specModels writes (once per size, under $TMPDIR) the speculative
// benchmarks' models: the target (seed 1), a Q4_0 copy of it and its first
// quarter of layers.
func specModels(b *testing.B, size string) (target, q4, trunc string) {
	dir := filepath.Join(os.TempDir(), "molly-bench-spec-"+size)
	target = filepath.Join(dir, "target.gguf")
	q4 = filepath.Join(dir, "q4_0.gguf")
	trunc = filepath.Join(dir, "truncated.gguf")
	if _, err := os.Stat(filepath.Join(dir, "done")); err != nil {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		writeModel(b, dir, "target.gguf", size, 1, 0)
		quantizedCopy(b, target, q4, "q4_0")
		c, err := gguf.SizeConfig(size, 1)
		if err != nil {
			b.Fatal(err)
		}
		writeModel(b, dir, "truncated.gguf", size, 1, max(1, c.Layers/4))
		if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return target, q4, trunc
}
