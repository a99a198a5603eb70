package llama

import (
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
// graph-reuse defect (DESIGN §9): changing adapters between two decodes of the
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
