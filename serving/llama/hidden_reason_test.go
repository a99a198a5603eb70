package llama

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/ollama/ollama/fs/ggml"
)

// outputWeight reads output.weight (F32, vocab rows of n_embd) from the
// GGUF file itself.
func outputWeight(t *testing.T, path string) []float32 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := ggml.Decode(f, -1)
	if err != nil {
		t.Fatal(err)
	}
	ts := g.Tensors()
	for _, x := range ts.Items() {
		if x.Name != "output.weight" {
			continue
		}
		if x.Kind != 0 {
			t.Fatalf("output.weight kind %d, want F32", x.Kind)
		}
		buf := make([]byte, x.Size())
		if _, err := f.ReadAt(buf, int64(ts.Offset+x.Offset)); err != nil {
			t.Fatal(err)
		}
		out := make([]float32, len(buf)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
		}
		return out
	}
	t.Fatal("no output.weight")
	return nil
}

func TestHiddenStatesAreWhatTheOutputProjectionReads(t *testing.T) {
	m, ap, _, _ := fixture(t)
	w := outputWeight(t, filepath.Join(filepath.Dir(ap), "base.gguf"))
	h, err := NewHiddenContext(m, 256, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	c, err := NewContext(m, ContextParams{NCtx: 256, NBatch: 64, NSeqMax: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := NewBatch(64)
	defer b.Free()
	prefix, _ := m.Tokenize("the prefix of every chain", true, false)
	conts := [][]int32{{}, nil, nil}
	conts[1], _ = m.Tokenize(" first", false, false)
	conts[2], _ = m.Tokenize(" a second, longer continuation", false, false)
	states, err := h.LastStates(prefix, conts)
	if err != nil {
		t.Fatal(err)
	}
	e, nv := m.NEmbd(), m.NVocab()
	for i, cont := range conts {
		// Oracle: the logits of the generating context are W·h.
		logits := lastLogits(t, c, b, append(append([]int32(nil), prefix...), cont...))
		var worst float64
		for v := range nv {
			var dot float64
			for k := range e {
				dot += float64(w[v*e+k]) * float64(states[i][k])
			}
			worst = math.Max(worst, math.Abs(dot-float64(logits[v])))
		}
		if worst > 1e-3 {
			t.Errorf("continuation %d: W·h differs from the logits by %g", i, worst)
		}
	}
	// The mean state of the prefix is the mean of its per-token last states.
	mean, err := h.MeanState(prefix)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]float64, e)
	for n := 1; n <= len(prefix); n++ {
		s, err := h.LastStates(prefix[:n], [][]int32{{}})
		if err != nil {
			t.Fatal(err)
		}
		for k := range e {
			want[k] += float64(s[0][k]) / float64(len(prefix))
		}
	}
	for k := range e {
		if math.Abs(want[k]-float64(mean[k])) > 1e-4 {
			t.Fatalf("mean state [%d] = %g, want %g", k, mean[k], want[k])
		}
	}
	if _, err := h.LastStates(prefix, [][]int32{make([]int32, 300)}); err == nil {
		t.Error("a continuation beyond the context was accepted")
	}
}
