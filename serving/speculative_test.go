package serving

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/serving/gguf"
)

// writeModel writes the generated model of size with seed to dir/name,
// keeping only the first layers layers when layers > 0 (a truncated-layer
// draft: the generator seeds each tensor by name, so the kept layers, the
// embeddings and the output head are the full model's).
func writeModel(t testing.TB, dir, name, size string, seed int64, layers int) string {
	t.Helper()
	cfg, err := gguf.SizeConfig(size, seed)
	if err != nil {
		t.Fatal(err)
	}
	if layers > 0 {
		cfg.Layers = layers
	}
	p := filepath.Join(dir, name)
	if err := gguf.WriteModel(p, cfg); err != nil {
		t.Fatal(err)
	}
	return p
}

// quantizedCopy writes src quantized to ftype at dst (a smaller draft that
// agrees with its target far more often than a truncated random model).
func quantizedCopy(t testing.TB, src, dst, ftype string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := QuantizeModel(dst, ftype); err != nil {
		t.Fatal(err)
	}
	return dst
}

type genResult struct {
	text   string
	finish string
	usage  Usage
}

func generateText(t testing.TB, e *Engine, prompt []int32, maxTokens int) genResult {
	t.Helper()
	var r genResult
	u, err := e.Generate(context.Background(), Request{Prompt: prompt, Params: SamplingParams{MaxTokens: maxTokens}}, func(ev Event) error {
		r.text += ev.Text
		if ev.Finish != "" {
			r.finish = ev.Finish
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r.usage = u
	return r
}

func TestSpeculativeGreedyEqualsPlainGreedy(t *testing.T) {
	dir := t.TempDir()
	target := writeModel(t, dir, "target.gguf", "small", 7, 0)
	drafts := []struct {
		name      string
		path      string
		identical bool
	}{
		{"identical", target, true},
		{"truncated-2-of-4-layers", writeModel(t, dir, "trunc.gguf", "small", 7, 2), false},
		{"q4_0-copy", quantizedCopy(t, target, filepath.Join(dir, "q4.gguf"), "q4_0"), false},
		{"other-seed-tiny", writeModel(t, dir, "other.gguf", "tiny", 99, 0), false},
	}
	mk := func(draft string, k int) *Engine {
		return newEngine(t, func(c *Config) {
			c.ModelPath, c.AdapterDir = target, ""
			c.NSeqMax, c.NCtx = 2, 2*512
			c.DraftModel, c.DraftTokens = draft, k
		})
	}
	plain := mk("", 0)
	var prompts [][]int32
	for _, s := range []string{"The quick brown fox", "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n", strings.Repeat("abc ", 40)} {
		p, err := plain.Tokenize(s)
		if err != nil {
			t.Fatal(err)
		}
		prompts = append(prompts, p)
	}
	const maxTokens = 128
	want := make([]genResult, len(prompts))
	for i, p := range prompts {
		want[i] = generateText(t, plain, p, maxTokens)
		if want[i].usage.CompletionTokens == 0 {
			t.Fatalf("prompt %d: the plain engine generated nothing", i)
		}
	}
	for _, d := range drafts {
		for _, k := range []int{1, 5} {
			e := mk(d.path, k)
			for i, p := range prompts {
				got := generateText(t, e, p, maxTokens)
				if got != want[i] {
					t.Errorf("draft %s k=%d prompt %d:\n got %+v\nwant %+v", d.name, k, i, got, want[i])
				}
			}
			st := e.SpeculativeStats()
			if st.Proposed == 0 {
				t.Fatalf("draft %s k=%d: nothing went through the speculative path", d.name, k)
			}
			// The draft computes each token alone, as plain decoding does:
			// an identical draft is never rejected by a trusted choice (a
			// top-two gap of at least tieMargin).
			if d.identical && st.Mismatches != 0 {
				t.Errorf("draft %s k=%d: identical draft rejected by a trusted choice: %+v", d.name, k, st)
			}
			t.Logf("draft %s k=%d: acceptance %d/%d = %.2f, %d verify rounds, %d near-tie redecodes for %d prompts",
				d.name, k, st.Accepted, st.Proposed, float64(st.Accepted)/float64(st.Proposed), st.Rounds, st.Redecodes, len(prompts))
			e.Close()
		}
	}
}

func TestSpeculativePathServesHTTPChat(t *testing.T) {
	e := newEngine(t, func(c *Config) { c.DraftModel = c.ModelPath })
	plain := newEngine(t, nil)
	body := greedy("molly-demo", "say something", 24)
	got, _ := mustText(t, e, body)
	want, _ := mustText(t, plain, body)
	if got != want {
		t.Fatalf("speculative chat %q, plain %q", got, want)
	}
	if e.SpeculativeStats().Proposed == 0 {
		t.Fatal("a greedy n=1 chat request did not take the speculative path")
	}
}

func TestDraftModelThatCannotLoadIsAnError(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.gguf")
	if err := os.WriteFile(bad, []byte("not a gguf"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DemoConfig(demoDir)
	cfg.NSeqMax, cfg.NCtx, cfg.Threads = 1, 512, 1
	cfg.DraftModel = bad
	e, err := New(cfg)
	if err == nil {
		e.Close()
		t.Fatal("New accepted an unloadable draft model")
	}
	if !strings.Contains(err.Error(), "draft model") {
		t.Fatalf("error %q does not name the draft model", err)
	}
}

func TestDraftWithAnotherTokenizerIsRefused(t *testing.T) {
	// The demo model with one token's text changed in place: GGUF strings
	// are a uint64 length and bytes, so "<think>" in the token list is
	// preceded by its length (the chat template holds it inside a longer
	// string).
	b, err := os.ReadFile(DemoConfig(demoDir).ModelPath)
	if err != nil {
		t.Fatal(err)
	}
	old := append([]byte{7, 0, 0, 0, 0, 0, 0, 0}, "<think>"...)
	if bytes.Count(b, old) != 1 {
		t.Fatalf("the demo model holds %d length-prefixed <think> strings, want 1", bytes.Count(b, old))
	}
	draft := filepath.Join(t.TempDir(), "other-vocab.gguf")
	if err := os.WriteFile(draft, bytes.Replace(b, old, append(old[:8:8], "<thonk>"...), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DemoConfig(demoDir)
	cfg.NSeqMax, cfg.NCtx, cfg.Threads = 1, 512, 1
	cfg.DraftModel = draft
	e, err := New(cfg)
	if err == nil {
		e.Close()
		t.Fatal("New accepted a draft with another tokenizer")
	}
	if !errors.Is(err, ErrDraftVocab) || !strings.Contains(err.Error(), "<thonk>") {
		t.Fatalf("error %v, want ErrDraftVocab naming the token", err)
	}
}

func TestCloseStopsASpeculativeRequest(t *testing.T) {
	e := newEngine(t, func(c *Config) { c.DraftModel = c.ModelPath })
	prompt, err := e.Tokenize("close me")
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	first := true
	_, err = e.Generate(context.Background(), Request{Prompt: prompt, Params: SamplingParams{MaxTokens: 200}}, func(ev Event) error {
		if first {
			first = false
			go func() { closed <- e.Close() }()
			<-e.quit // Close has begun; it waits for this request
		}
		return nil
	})
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("Generate returned %v, want ErrClosed", err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if e.SpeculativeStats().Rounds == 0 {
		t.Fatal("the request did not run on the speculative path")
	}
}

// TestSpeculativeSamplingMatchesPlainSampling compares, over the same seeds,
// the completions a plain engine samples with those of speculative engines
// (the target itself, a Q4_0 copy and an unrelated model as drafts) by a
// two-sample chi-square test: speculative sampling must draw from the
// target's distribution whatever the draft. An identical draft must be
// accepted almost always (Σ min(p, q) = 1 up to rounding).
func TestSpeculativeSamplingMatchesPlainSampling(t *testing.T) {
	dir := t.TempDir()
	target := writeModel(t, dir, "target.gguf", "small", 7, 0)
	mk := func(draft string) *Engine {
		return newEngine(t, func(c *Config) {
			c.ModelPath, c.AdapterDir = target, ""
			c.NSeqMax, c.NCtx = 1, 256
			c.DraftModel, c.DraftTokens = draft, 2
		})
	}
	plain := mk("")
	prompt, err := plain.Tokenize("The quick brown fox")
	if err != nil {
		t.Fatal(err)
	}
	// top_k 2 and 4 tokens: at most 16 completions; temperature 1.5
	// flattens the random model's distribution so that most occur.
	const n = 500
	sample := func(e *Engine) map[string]float64 {
		out := map[string]float64{}
		for i := range n {
			seed := int64(i)
			text := ""
			_, err := e.Generate(context.Background(), Request{Prompt: prompt, Params: SamplingParams{Temperature: 1.5, TopK: 2, Seed: &seed, MaxTokens: 4}}, func(ev Event) error {
				text += ev.Text
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			out[text]++
		}
		return out
	}
	want := sample(plain)
	if len(want) < 4 {
		t.Fatalf("plain sampling drew only %d distinct completions: the test cannot tell distributions apart", len(want))
	}
	for _, d := range []struct{ name, path string }{
		{"identical", target},
		{"q4_0-copy", quantizedCopy(t, target, filepath.Join(dir, "q4.gguf"), "q4_0")},
		{"unrelated", writeModel(t, dir, "other.gguf", "small", 99, 0)},
	} {
		e := mk(d.path)
		got := sample(e)
		keys := map[string]bool{}
		for k := range want {
			keys[k] = true
		}
		for k := range got {
			keys[k] = true
		}
		var chi2 float64
		for k := range keys {
			if a, b := want[k], got[k]; a+b > 0 {
				chi2 += (a - b) * (a - b) / (a + b)
			}
		}
		// Equal sample sizes: Σ (a−b)²/(a+b) is chi-square with
		// categories−1 degrees of freedom; df + 4·sqrt(2·df) is beyond the
		// 0.9999 quantile for these df (Wilson–Hilferty).
		df := float64(len(keys) - 1)
		if crit := df + 4*math.Sqrt(2*df); chi2 > crit {
			t.Errorf("draft %s: chi-square %.1f over %d completions exceeds %.1f: speculative sampling does not draw from the target's distribution\nplain %v\nspeculative %v", d.name, chi2, len(keys), crit, want, got)
		}
		st := e.SpeculativeStats()
		if st.Proposed == 0 {
			t.Fatalf("draft %s: no sampled request took the speculative path", d.name)
		}
		acc := float64(st.Accepted) / float64(st.Proposed)
		if d.name == "identical" && acc < 0.95 {
			t.Errorf("identical draft: acceptance %.3f, want about 1", acc)
		}
		t.Logf("draft %s: chi-square %.1f (df %.0f), acceptance %.3f over %d proposals", d.name, chi2, df, acc, st.Proposed)
	}
}
