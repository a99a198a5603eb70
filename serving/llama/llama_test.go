package llama

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/serving/gguf"
)

// fixture writes the tiny model and two adapters into a temp dir and loads
// the model.
func fixture(t testing.TB) (*Model, string, string, gguf.Config) {
	t.Helper()
	dir := t.TempDir()
	cfg, err := gguf.SizeConfig("tiny", 7)
	if err != nil {
		t.Fatal(err)
	}
	mp := filepath.Join(dir, "base.gguf")
	if err := gguf.WriteModel(mp, cfg); err != nil {
		t.Fatal(err)
	}
	ap := filepath.Join(dir, "a.gguf")
	bp := filepath.Join(dir, "b.gguf")
	if err := gguf.WriteAdapter(ap, cfg, gguf.AdapterConfig{Name: "a", Seed: 1}); err != nil {
		t.Fatal(err)
	}
	if err := gguf.WriteAdapter(bp, cfg, gguf.AdapterConfig{Name: "b", Seed: 2}); err != nil {
		t.Fatal(err)
	}
	m, err := LoadModel(mp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m, ap, bp, cfg
}

func TestGeneratedModelLoadsWithItsVocabularyAndTemplate(t *testing.T) {
	m, _, _, _ := fixture(t)
	if got := m.NVocab(); got != gguf.VocabSize {
		t.Errorf("NVocab = %d, want %d", got, gguf.VocabSize)
	}
	toks, err := m.Tokenize("hi there", true, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []int32{gguf.TokenBOS, gguf.TokenByte0 + 'h', gguf.TokenByte0 + 'i', gguf.TokenSpace,
		gguf.TokenByte0 + 't', gguf.TokenByte0 + 'h', gguf.TokenByte0 + 'e', gguf.TokenByte0 + 'r', gguf.TokenByte0 + 'e'}
	if len(toks) != len(want) {
		t.Fatalf("Tokenize = %v, want %v", toks, want)
	}
	for i := range want {
		if toks[i] != want[i] {
			t.Fatalf("Tokenize = %v, want %v", toks, want)
		}
	}
	var sb strings.Builder
	for _, tok := range toks[1:] {
		sb.Write(m.TokenPiece(tok))
	}
	if sb.String() != "hi there" {
		t.Errorf("detokenized %q, want %q", sb.String(), "hi there")
	}
	s, err := ApplyChatTemplate(m.ChatTemplate(), []ChatMessage{{"user", "hello"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"; s != want {
		t.Errorf("chat template gave %q, want %q", s, want)
	}
	special, _ := m.Tokenize("<|im_start|>", false, true)
	if len(special) != 1 || special[0] != gguf.TokenImStart {
		t.Errorf("special token parsed as %v", special)
	}
	if !m.IsEOG(gguf.TokenImEnd) || !m.IsEOG(gguf.TokenEOS) {
		t.Errorf("<|im_end|> and </s> must end generation")
	}
}

// lastLogits decodes toks on seq 0 from position 0 and returns the logits of
// the last token.
func lastLogits(t *testing.T, c *Context, b *Batch, toks []int32) []float32 {
	t.Helper()
	c.SeqRm(0, 0, -1)
	b.Clear()
	for i, tok := range toks {
		b.Add(tok, i, 0, i == len(toks)-1)
	}
	if err := c.Decode(b); err != nil {
		t.Fatal(err)
	}
	return c.Logits(len(toks)-1, nil)
}

func maxAbsDiff(a, b []float32) float32 {
	var d float32
	for i := range a {
		x := a[i] - b[i]
		if x < 0 {
			x = -x
		}
		d = max(d, x)
	}
	return d
}

// TestAdapterSwitchBetweenSameShapeDecodes is the regression test for the
// graph-reuse defect (docs/architecture.md): changing adapters between two decodes of the
// same shape must change the logits.
func TestAdapterSwitchBetweenSameShapeDecodes(t *testing.T) {
	m, ap, bp, _ := fixture(t)
	a, err := LoadAdapter(m, ap)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b2, err := LoadAdapter(m, bp)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	c, err := NewContext(m, ContextParams{NCtx: 512, NBatch: 64, NSeqMax: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	batch := NewBatch(64)
	defer batch.Free()
	toks, _ := m.Tokenize("the same prompt", true, false)

	base := lastLogits(t, c, batch, toks)
	c.SetAdapters([]*Adapter{a}, nil)
	withA := lastLogits(t, c, batch, toks)
	c.SetAdapters([]*Adapter{b2}, nil)
	withB := lastLogits(t, c, batch, toks)
	c.SetAdapters(nil, nil)
	baseAgain := lastLogits(t, c, batch, toks)

	cases := []struct {
		name   string
		x, y   []float32
		differ bool
	}{
		{"adapter a changes the base logits", base, withA, true},
		{"switching from a to b changes the logits", withA, withB, true},
		{"removing adapters restores the base logits exactly", base, baseAgain, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := maxAbsDiff(tc.x, tc.y)
			if tc.differ && d < 1e-3 {
				t.Errorf("max |Δlogit| = %g, want a visible change", d)
			}
			if !tc.differ && d != 0 {
				t.Errorf("max |Δlogit| = %g, want 0", d)
			}
		})
	}
}

func TestAdapterForAnotherShapeIsRefusedByLlamaCpp(t *testing.T) {
	m, _, _, _ := fixture(t)
	other, _ := gguf.SizeConfig("small", 7)
	p := filepath.Join(t.TempDir(), "wrong.gguf")
	if err := gguf.WriteAdapter(p, other, gguf.AdapterConfig{Name: "wrong", Seed: 3}); err != nil {
		t.Fatal(err)
	}
	if a, err := LoadAdapter(m, p); err == nil {
		a.Close()
		t.Fatal("adapter for a wider model was accepted")
	}
}

func TestQuantizedCopyLoadsAndDecodes(t *testing.T) {
	dir := t.TempDir()
	cfg, _ := gguf.SizeConfig("tiny", 7)
	in, out := filepath.Join(dir, "f32.gguf"), filepath.Join(dir, "q8.gguf")
	if err := gguf.WriteModel(in, cfg); err != nil {
		t.Fatal(err)
	}
	if err := Quantize(in, out, "q8_0"); err != nil {
		t.Fatal(err)
	}
	m, err := LoadModel(out)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if v, _ := m.Meta(gguf.KeyBaseChecksum); v != cfg.Checksum() {
		t.Errorf("quantized copy lost the base checksum: %q", v)
	}
	c, err := NewContext(m, ContextParams{NCtx: 256, NBatch: 32, NSeqMax: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := NewBatch(32)
	defer b.Free()
	if l := lastLogits(t, c, b, []int32{1, 10, 11}); len(l) != gguf.VocabSize {
		t.Fatalf("got %d logits", len(l))
	}
}

// decodeSeqs decodes each prompt on its own sequence in one batch, token
// adapters as given (nil: base), and returns each prompt's last logits.
// Every prompt asks for the logits of its last two tokens: ggml multiplies a
// single column with another kernel than two or more (llamafile's sgemm only
// runs for n >= 2), which rounds differently, so comparisons between batches
// keep every product at two columns or more.
func decodeSeqs(t *testing.T, c *Context, b *Batch, prompts [][]int32, ads []*Adapter) [][]float32 {
	t.Helper()
	c.Clear()
	b.Clear()
	var last []int
	for s, p := range prompts {
		for i, tok := range p {
			b.AddAdapted(tok, i, s, i >= len(p)-2, ads[s], 1)
		}
		last = append(last, b.Len()-1)
	}
	if err := c.Decode(b); err != nil {
		t.Fatal(err)
	}
	var out [][]float32
	for _, i := range last {
		out = append(out, c.Logits(i, nil))
	}
	return out
}

func argmaxOf(l []float32) int {
	best := 0
	for i, x := range l {
		if x > l[best] {
			best = i
		}
	}
	return best
}

// TestTokenAdaptersEqualContextAdapters checks the per-token path against
// llama.cpp's own context-level adapter path, which is the oracle: each
// sequence of a batch mixing adapters gets the logits llama.cpp computes for
// it alone with its adapter set on the context. With ExactTokenAdapters
// (ggml's operations) they are bitwise equal; Molly's kernel sums in another
// order, so its logits agree to rounding and pick the same greedy token.
func TestTokenAdaptersEqualContextAdapters(t *testing.T) {
	m, ap, bp, _ := fixture(t)
	a, err := LoadAdapter(m, ap)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b2, err := LoadAdapter(m, bp)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if a.Bytes() <= 0 {
		t.Errorf("adapter bytes %d", a.Bytes())
	}
	params := ContextParams{NCtx: 1024, NBatch: 128, NSeqMax: 4, Threads: 1, Unified: true}
	ref, err := NewContext(m, params)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	batch := NewBatch(128)
	defer batch.Free()
	prompts := make([][]int32, 3)
	for i, s := range []string{"first prompt here", "a second, other one", "third of them"} {
		prompts[i], _ = m.Tokenize(s, true, false)
	}
	// The oracle: each prompt alone, its adapter set on the context.
	var want [][]float32
	for s, ad := range []*Adapter{a, b2, nil} {
		if ad != nil {
			ref.SetAdapters([]*Adapter{ad}, nil)
		} else {
			ref.SetAdapters(nil, nil)
		}
		want = append(want, decodeSeqs(t, ref, batch, prompts[s:s+1], []*Adapter{nil})[0])
	}
	for _, mode := range []struct {
		name  string
		exact bool
		tol   float32
	}{{"ggml operations", true, 0}, {"Molly's kernel", false, 1e-4}} {
		params.TokenAdapters, params.ExactTokenAdapters = true, mode.exact
		c, err := NewContext(m, params)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cases := []struct {
			name string
			ads  []*Adapter
			seqs []int // which oracle each sequence must equal
		}{
			{"three sequences on adapter a, adapter b and the base in one decode", []*Adapter{a, b2, nil}, []int{0, 1, 2}},
			{"the same adapters in another order", []*Adapter{nil, a, b2}, []int{2, 0, 1}},
		}
		for _, tc := range cases {
			t.Run(mode.name+": "+tc.name, func(t *testing.T) {
				ps := make([][]int32, len(tc.seqs))
				for i, s := range tc.seqs {
					ps[i] = prompts[s]
				}
				got := decodeSeqs(t, c, batch, ps, tc.ads)
				for i, s := range tc.seqs {
					if d := maxAbsDiff(got[i], want[s]); d > mode.tol || argmaxOf(got[i]) != argmaxOf(want[s]) {
						t.Errorf("sequence %d: max |Δlogit| = %g (allowed %g), argmax %d vs %d against llama.cpp's context-level adapter",
							i, d, mode.tol, argmaxOf(got[i]), argmaxOf(want[s]))
					}
				}
				if c.AdaptedProducts() == 0 || (c.KernelSpans() > 0) == mode.exact {
					t.Errorf("%d products adapted, %d runs by the kernel", c.AdaptedProducts(), c.KernelSpans())
				}
			})
		}
		// Same-shape decodes with different per-token adapters reuse the
		// graph and still follow the adapters.
		reuses := c.GraphReuses()
		x := decodeSeqs(t, c, batch, prompts[:1], []*Adapter{a})[0]
		y := decodeSeqs(t, c, batch, prompts[:1], []*Adapter{b2})[0]
		if c.GraphReuses() <= reuses {
			t.Errorf("%s: graph reuses %d → %d: same-shape decodes did not reuse the graph", mode.name, reuses, c.GraphReuses())
		}
		if maxAbsDiff(x, want[0]) > mode.tol || maxAbsDiff(y, want[0]) < 1e-3 {
			t.Errorf("%s: after graph reuse, adapter a differs from its oracle by %g, adapter b by %g", mode.name, maxAbsDiff(x, want[0]), maxAbsDiff(y, want[0]))
		}
	}
}

func TestTokenAdaptersNeedAUnifiedContext(t *testing.T) {
	m, ap, _, _ := fixture(t)
	a, err := LoadAdapter(m, ap)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	c, err := NewContext(m, ContextParams{NCtx: 512, NBatch: 64, NSeqMax: 2, Threads: 1, TokenAdapters: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := NewBatch(8)
	defer b.Free()
	b.AddAdapted(1, 0, 0, true, a, 1)
	if err := c.Decode(b); !errors.Is(err, ErrTokenAdapters) {
		t.Errorf("Decode on a per-sequence KV context = %v, want ErrTokenAdapters", err)
	}
}
