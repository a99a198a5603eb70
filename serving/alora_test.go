package serving

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/serving/gguf"
	"github.com/molly-gateway/molly/serving/llama"
)

// aloraDemo writes the tiny demo and an activated LoRA "checker" whose
// invocation sequence is the assistant turn's header.
func aloraDemo(t *testing.T) (string, []int32) {
	t.Helper()
	dir := t.TempDir()
	if err := WriteDemo(dir, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	m, err := llama.LoadModel(filepath.Join(dir, DemoModelFile))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	inv, err := m.Tokenize("<|im_start|>assistant\n", false, true)
	if err != nil {
		t.Fatal(err)
	}
	u := make([]uint32, len(inv))
	for i, x := range inv {
		u[i] = uint32(x)
	}
	cfg, _ := gguf.SizeConfig("tiny", 1)
	if err := gguf.WriteAdapter(filepath.Join(dir, DemoAdapterDir, "checker.gguf"), cfg, gguf.AdapterConfig{Name: "checker", Seed: 77, Invocation: u}); err != nil {
		t.Fatal(err)
	}
	return dir, inv
}

// libllamaGreedy is the reference path: llama.cpp's context-level adapter
// set, the base model for prompt[:split] and the adapter from there on (for
// every generated token too); split < 0 means the base model throughout.
func libllamaGreedy(t *testing.T, dir string, prompt []int32, split, n int) string {
	t.Helper()
	m, err := llama.LoadModel(filepath.Join(dir, DemoModelFile))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	a, err := llama.LoadAdapter(m, filepath.Join(dir, DemoAdapterDir, "checker.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	c, err := llama.NewContext(m, llama.ContextParams{NCtx: 512, NBatch: 256, NSeqMax: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := llama.NewBatch(256)
	defer b.Free()
	decode := func(toks []int32, pos int) []float32 {
		b.Clear()
		for i, tok := range toks {
			b.Add(tok, pos+i, 0, i == len(toks)-1)
		}
		if err := c.Decode(b); err != nil {
			t.Fatal(err)
		}
		return c.Logits(len(toks)-1, nil)
	}
	var logits []float32
	if split < 0 {
		logits = decode(prompt, 0)
	} else {
		if split > 0 {
			decode(prompt[:split], 0)
		}
		c.SetAdapters([]*llama.Adapter{a}, []float32{1})
		logits = decode(prompt[split:], split)
	}
	var sb strings.Builder
	for i := range n {
		tok := argmax(logits)
		if m.IsEOG(tok) {
			break
		}
		sb.Write(m.TokenPiece(tok))
		logits = decode([]int32{tok}, len(prompt)+i)
	}
	return sb.String()
}

func engineGreedy(t *testing.T, e *Engine, adapter string, prompt []int32, n int) (string, Usage) {
	t.Helper()
	var sb strings.Builder
	u, err := e.Generate(context.Background(), Request{Adapter: adapter, Prompt: prompt, Params: SamplingParams{MaxTokens: n}}, func(ev Event) error {
		sb.WriteString(ev.Text)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sb.String(), u
}

func TestALoRAAppliesFromItsInvocationAndReusesTheBasePrefix(t *testing.T) {
	dir, inv := aloraDemo(t)
	const n = 24
	e := newEngine(t, func(c *Config) {
		*c = DemoConfig(dir)
		c.NSeqMax, c.NCtx, c.NBatch, c.PrefillChunk, c.Threads, c.PrefixCache = 4, 4*512, 256, 16, 1, true
	})
	prompt, err := e.Tokenize("<|im_start|>user\n" + strings.Repeat("is this answer grounded in the sources? ", 3) + "<|im_end|>\n<|im_start|>assistant\n")
	if err != nil {
		t.Fatal(err)
	}
	split := len(prompt) - len(inv)
	want := libllamaGreedy(t, dir, prompt, split, n)
	if whole := libllamaGreedy(t, dir, prompt, 0, n); whole == want {
		t.Fatalf("the adapter on the whole prompt gives the same output %q; the test cannot tell the paths apart", want)
	}
	// A base request first: its prompt KV stays in the prefix cache.
	base, _ := engineGreedy(t, e, "", prompt, n)
	if ref := libllamaGreedy(t, dir, prompt, -1, n); base != ref {
		t.Fatalf("base output %q, libllama %q", base, ref)
	}
	got, u := engineGreedy(t, e, "checker", prompt, n)
	if got != want {
		t.Errorf("aLoRA output %q, reference (base before the invocation, adapter after) %q", got, want)
	}
	if wantCached := split / 16 * 16; u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens != wantCached || wantCached == 0 {
		t.Errorf("usage %+v, want the base request's %d cached prompt tokens reused", u.PromptTokensDetails, wantCached)
	}
	// Without the invocation sequence the adapter stays off.
	other, _ := e.Tokenize("<|im_start|>user\nno assistant header here")
	off, _ := engineGreedy(t, e, "checker", other, n)
	if ref := libllamaGreedy(t, dir, other, -1, n); off != ref {
		t.Errorf("without the invocation: %q, base %q", off, ref)
	}
}
