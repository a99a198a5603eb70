package lora

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/molly-gateway/molly/serving"
	"github.com/molly-gateway/molly/serving/gguf"
	"github.com/molly-gateway/molly/serving/llama"
)

// demo writes the tiny demo model and its adapters to a temporary folder.
func demo(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := serving.WriteDemo(dir, 7, "tiny"); err != nil {
		t.Fatal(err)
	}
	return dir
}

// llamaLogits is the oracle: llama.cpp's logits for every position of
// tokens, with the adapter file at adapter ("" for none).
func llamaLogits(t *testing.T, model, adapter string, tokens []int32) []float32 {
	t.Helper()
	m, err := llama.LoadModel(model)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx, err := llama.NewContext(m, llama.ContextParams{NCtx: 256, NBatch: 256, NSeqMax: 1, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	if adapter != "" {
		a, err := llama.LoadAdapter(m, adapter)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		ctx.SetAdapters([]*llama.Adapter{a}, nil)
		defer ctx.SetAdapters(nil, nil)
	}
	b := llama.NewBatch(len(tokens))
	defer b.Free()
	for i, tok := range tokens {
		b.Add(tok, i, 0, true)
	}
	if err := ctx.Decode(b); err != nil {
		t.Fatal(err)
	}
	var out []float32
	for i := range tokens {
		out = append(out, ctx.Logits(i, nil)...)
	}
	return out
}

func sampleTokens(n int) []int32 {
	text := "Order #4417 was refunded; the customer will see it in 3 days."
	out := []int32{gguf.TokenBOS}
	for i := 0; len(out) < n; i++ {
		c := text[i%len(text)]
		if c == ' ' {
			out = append(out, gguf.TokenSpace)
		} else {
			out = append(out, int32(gguf.TokenByte0)+int32(c))
		}
	}
	return out
}

func TestForwardMatchesLlamaCpp(t *testing.T) {
	dir := demo(t)
	model := filepath.Join(dir, serving.DemoModelFile)
	m, err := LoadModel(model)
	if err != nil {
		t.Fatal(err)
	}
	if m.FileType != "F32" || m.Checksum == "" {
		t.Fatalf("file type %q checksum %q", m.FileType, m.Checksum)
	}
	toks := sampleTokens(48)
	for _, adapter := range []string{"", filepath.Join(dir, serving.DemoAdapterDir, "support.gguf")} {
		var a *Adapter
		if adapter != "" {
			if a, err = ReadAdapter(adapter, m); err != nil {
				t.Fatal(err)
			}
		}
		want := llamaLogits(t, model, adapter, toks)
		got := m.Logits(toks, a)
		var worst float64
		for i := range want {
			worst = max(worst, math.Abs(float64(got[i]-want[i])))
		}
		// F32 weights on both sides, but llama.cpp keeps K and V in an F16
		// cache (about 1e-3 relative error on logits of size ~10); a
		// structural mistake (a RoPE sign, a norm) moves logits by ~1.
		if worst > 0.05 {
			t.Errorf("adapter %q: largest logit difference from llama.cpp %g", adapter, worst)
		}
	}
}

// TestGradientMatchesFiniteDifferences checks the backward pass against
// central differences of the loss for a sample of A and B entries.
func TestGradientMatchesFiniteDifferences(t *testing.T) {
	m, err := LoadModel(filepath.Join(demo(t), serving.DemoModelFile))
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAdapter(m, 4, 8, Targets, 3)
	if err != nil {
		t.Fatal(err)
	}
	// Non-zero B so every path carries gradient.
	r := newRand(11)
	for _, p := range a.Pairs {
		for i := range p.B {
			p.B[i] = float32(r.norm() * 0.05)
		}
	}
	toks := sampleTokens(24)
	in := toks[:len(toks)-1]
	target := make([]int32, len(in))
	for i := range target {
		target[i] = -1
		if i >= 10 {
			target[i] = toks[i+1]
		}
	}
	g := newGrads(a)
	m.lossGrad(in, target, a, g, 1)
	loss := func() float64 {
		l, _ := m.lossGrad(in, target, a, newGrads(a), 1)
		return l
	}
	checked := 0
	for pi, p := range a.Pairs {
		for which, v := range [][]float32{p.A, p.B} {
			for _, i := range []int{0, len(v) / 3, len(v) - 1} {
				old := v[i]
				const h = 1e-2
				v[i] = old + h
				up := loss()
				v[i] = old - h
				down := loss()
				v[i] = old
				num := (up - down) / (2 * h)
				ana := float64(g[2*pi+which][i])
				if math.Abs(num-ana) > 2e-2*math.Max(1, math.Abs(num)) {
					t.Errorf("%s %c[%d]: analytic %g, numeric %g", p.Name, "AB"[which], i, ana, num)
				}
				checked++
			}
		}
	}
	if checked != 6*len(a.Pairs) {
		t.Fatalf("checked %d entries", checked)
	}
}

func examples(n int) []Example {
	var out []Example
	for i := range n {
		toks := sampleTokens(30 + i%5)
		out = append(out, Example{Tokens: toks, Start: 12})
	}
	return out
}

// TestResumeIsExact: a run interrupted and resumed from its checkpoint
// ends with the same adapter, bit for bit, as an uninterrupted run.
func TestResumeIsExact(t *testing.T) {
	m, err := LoadModel(filepath.Join(demo(t), serving.DemoModelFile))
	if err != nil {
		t.Fatal(err)
	}
	data := examples(6)
	o := Options{Rank: 4, Steps: 6, BatchSize: 3, Seed: 5, LR: 5e-3}
	whole, err := Train(context.Background(), m, data, o)
	if err != nil {
		t.Fatal(err)
	}
	ck := filepath.Join(t.TempDir(), "run.ckpt")
	o.Checkpoint, o.CheckpointEvery = ck, 100
	ctx, cancel := context.WithCancel(context.Background())
	o.Progress = func(p Progress) {
		if p.Step == 2 {
			cancel()
		}
	}
	if _, err := Train(ctx, m, data, o); !errors.Is(err, ErrInterrupted) {
		t.Fatalf("interrupted run: %v", err)
	}
	o.Progress = nil
	res, err := Train(context.Background(), m, data, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != 2 || res.Steps != 6 {
		t.Fatalf("resumed at %d, ended at %d", res.Resumed, res.Steps)
	}
	for i, p := range res.Adapter.Pairs {
		q := whole.Adapter.Pairs[i]
		if !slices.Equal(p.A, q.A) || !slices.Equal(p.B, q.B) {
			t.Fatalf("pair %s differs after resume", p.Name)
		}
	}
	// A checkpoint of another run is refused, never silently reused.
	o.Seed = 6
	if _, err := Train(context.Background(), m, data, o); !errors.Is(err, ErrOtherRun) {
		t.Fatalf("other run: %v", err)
	}
}

// TestTrainedAdapterLowersLlamaCppNLL trains briefly and checks, with
// llama.cpp's logits as the judge, that the written GGUF lowers the
// answer NLL of the training text.
func TestTrainedAdapterLowersLlamaCppNLL(t *testing.T) {
	dir := demo(t)
	model := filepath.Join(dir, serving.DemoModelFile)
	m, err := LoadModel(model)
	if err != nil {
		t.Fatal(err)
	}
	data := examples(4)
	res, err := Train(context.Background(), m, data, Options{Rank: 4, Steps: 30, BatchSize: 4, LR: 1e-2})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "trained.gguf")
	if err := res.Adapter.WriteGGUF(path, m, "trained"); err != nil {
		t.Fatal(err)
	}
	nll := func(adapter string) float64 {
		ex := data[0]
		lg := llamaLogits(t, model, adapter, ex.Tokens)
		V := m.Cfg.Vocab
		var s float64
		for i := ex.Start; i < len(ex.Tokens); i++ {
			row := lg[(i-1)*V : i*V]
			mx := slices.Max(row)
			var z float64
			for _, v := range row {
				z += math.Exp(float64(v - mx))
			}
			s += float64(mx) + math.Log(z) - float64(row[ex.Tokens[i]])
		}
		return s / float64(len(ex.Tokens)-ex.Start)
	}
	base, tuned := nll(""), nll(path)
	if !(tuned < 0.5*base) {
		t.Fatalf("answer NLL %.3f with the adapter, %.3f without", tuned, base)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
}
