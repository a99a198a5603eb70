package serving

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/molly-gateway/molly/serving/llama"
)

// TestMixedAdaptersInOneStepMatchLibllama runs sequences on every demo
// adapter and the base at once, which the engine decodes in one llama_decode
// per step (per-token adapters), and compares each greedy output token for
// token with libllama itself: serving/llama's BatchedBench, which sets each
// adapter on the context (llama.cpp's own adapter path) and decodes the
// adapters' groups one after another.
func TestMixedAdaptersInOneStepMatchLibllama(t *testing.T) {
	const n = 24
	adapters := append([]string{""}, DemoAdapters...)
	m, err := llama.LoadModel(filepath.Join(demoDir, DemoModelFile))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var ads []*llama.Adapter
	seqAdapter := []int{-1}
	for i, name := range DemoAdapters {
		a, err := llama.LoadAdapter(m, filepath.Join(demoDir, DemoAdapterDir, name+".gguf"))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		ads = append(ads, a)
		seqAdapter = append(seqAdapter, i)
	}
	lc, err := llama.NewContext(m, llama.ContextParams{NCtx: 8 * 512, NBatch: 256, NSeqMax: 8, Threads: 1, Unified: true})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	for _, text := range []string{"Where is my parcel?", "A question for every adapter at once, please."} {
		prompt, err := m.Tokenize("<|im_start|>user\n"+text+"<|im_end|>\n<|im_start|>assistant\n", true, true)
		if err != nil {
			t.Fatal(err)
		}
		res, err := llama.BatchedBench(lc, llama.BenchSpec{Prompt: prompt, NSeq: len(adapters), NGen: n, Adapters: ads, SeqAdapter: seqAdapter})
		if err != nil {
			t.Fatal(err)
		}
		want := make([]string, len(adapters))
		for s, toks := range res.Out {
			var sb strings.Builder
			for _, tok := range toks {
				if m.IsEOG(tok) {
					break
				}
				sb.Write(m.TokenPiece(tok))
			}
			want[s] = sb.String()
		}
		e := newEngine(t, nil)
		got := make([]string, len(adapters))
		steps := e.Stats().Steps
		// Hold the scheduler until all five requests are pending, so that
		// they are admitted into the same first step as libllama's batch:
		// requests admitted a step apart are computed in batches of other
		// sizes, which ggml rounds differently (another kernel for one
		// column than for several), and near ties of the random demo
		// model then decide otherwise.
		started, release, held := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		go func() { held <- e.onScheduler(func() { close(started); <-release }) }()
		<-started
		var wg sync.WaitGroup
		for s, a := range adapters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var sb strings.Builder
				_, err := e.Generate(context.Background(), Request{Adapter: a, Prompt: prompt, Params: SamplingParams{MaxTokens: n}}, func(ev Event) error {
					sb.WriteString(ev.Text)
					return nil
				})
				if err != nil {
					t.Error(err)
				}
				got[s] = sb.String()
			}()
		}
		for {
			e.mu.Lock()
			n := len(e.pending)
			e.mu.Unlock()
			if n == len(adapters) {
				break
			}
			runtime.Gosched()
		}
		close(release)
		if err := <-held; err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		for s, a := range adapters {
			if got[s] != want[s] {
				t.Errorf("%q on adapter %q: engine %q, libllama %q", text, a, got[s], want[s])
			}
		}
		// One step per token for all five together (not one per adapter).
		if d := e.Stats().Steps - steps; d > 2*n {
			t.Errorf("%d steps for %d tokens on %d adapters: the adapters were not decoded together", d, n, len(adapters))
		}
		e.Close()
	}
}

// TestMemoryIsOneBudget checks that KV cells held by requests and the prefix
// cache and hot adapter tensors stay within one budget: as adapters and
// cached prompts compete, the lowest reload cost goes, answers do not change,
// and a request that can never fit is refused with a 400.
func TestMemoryIsOneBudget(t *testing.T) {
	ref := newEngine(t, nil)
	probe := newEngine(t, nil)
	mustText(t, probe, greedy("molly-demo:support", "x", 1))
	hot := probe.Adapters()[len(probe.Adapters())-1].HotBytes // support sorts last
	cell := probe.Stats().Memory.KVCellBytes
	if hot <= 0 || cell <= 0 {
		t.Fatalf("hot adapter %d bytes, KV cell %d bytes", hot, cell)
	}
	probe.Close()
	// Two hot adapters and 200 cells: one request (about 70 prompt cells
	// plus 16) with one cached prompt beside it, not two.
	budget := 2*hot + 200*cell
	e := newEngine(t, func(c *Config) {
		c.PrefixCache = true
		c.PrefillChunk = 16
		c.MemoryBytes = budget
	})
	long := strings.Repeat("A question that fills the cache. ", 2)
	for i, a := range []string{"support", "billing", "support", "payments", "legal", "billing", "support"} {
		body := greedy("molly-demo:"+a, fmt.Sprint(long, i%3), 16)
		want, _ := mustText(t, ref, body)
		got, _ := mustText(t, e, body)
		if got != want {
			t.Errorf("request %d on %s: %q, want %q", i, a, got, want)
		}
		m := e.Stats().Memory
		if m.KVBytes+m.HotAdapterBytes > budget || m.BudgetBytes != budget {
			t.Errorf("after request %d: %d KV bytes + %d adapter bytes > budget %d (stats budget %d)", i, m.KVBytes, m.HotAdapterBytes, budget, m.BudgetBytes)
		}
	}
	m := e.Stats().Memory
	if m.AdapterEvictions == 0 || m.PrefixEvictions == 0 || m.HotAdapters > 2 {
		t.Errorf("memory %+v: want adapters and prefixes evicted, at most 2 hot", m)
	}
	// Three choices of 300 tokens hold 900 cells, more than the whole
	// budget even with every adapter and cached prompt evicted.
	if budget/cell >= 900 {
		t.Fatalf("budget of %d cells: the test needs less than 900", budget/cell)
	}
	big := greedy("molly-demo", "x", 300)
	big["n"] = 3
	code, r := chat(t, e, big)
	if code != http.StatusBadRequest || r.Error == nil || !strings.Contains(r.Error.Message, "memory budget") {
		t.Errorf("a request beyond the budget: %d %+v", code, r.Error)
	}
	prompt, _ := e.Tokenize("x")
	if _, err := e.Generate(context.Background(), Request{Prompt: prompt, N: 3, Params: SamplingParams{MaxTokens: 300}}, func(Event) error { return nil }); !errors.Is(err, ErrMemoryBudget) {
		t.Errorf("Generate beyond the budget: %v, want ErrMemoryBudget", err)
	}
}

// TestMetricsReportMemoryAndAdapters scrapes the engine's collector after
// one request on an adapter.
func TestMetricsReportMemoryAndAdapters(t *testing.T) {
	e := newEngine(t, nil)
	reg := prometheus.NewRegistry()
	if err := reg.Register(e.Collector()); err != nil {
		t.Fatal(err)
	}
	mustText(t, e, greedy("molly-demo:legal", "metrics", 4))
	var hot int64
	for _, a := range e.Adapters() {
		if a.Name == "legal" {
			hot = a.HotBytes
		}
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			got[key] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"molly_engine_hot_adapters":                  1,
		"molly_engine_adapter_bytes{state=hot}":      float64(hot),
		"molly_engine_adapter_loads_total":           1,
		"molly_engine_kv_bytes{kind=reserved}":       0,
		"molly_engine_sequences{state=busy}":         0,
		"molly_engine_sequences{state=free}":         8,
		"molly_engine_memory_budget_bytes":           float64(e.Stats().Memory.BudgetBytes),
		"molly_engine_evictions_total{kind=adapter}": 0,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %g, want %g", k, got[k], v)
		}
	}
	if got["molly_engine_steps_total"] < 4 || hot <= 0 {
		t.Errorf("steps %g, hot bytes %d", got["molly_engine_steps_total"], hot)
	}
}
