package lora

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/ollama/ollama/fs/ggml"
	"github.com/x448/float16"
)

// Metadata keys shared with serving/gguf: the identity a generated base
// records and the key an adapter pins it under.
const (
	KeyBaseChecksum        = "general.base_checksum"
	KeyAdapterBaseChecksum = "adapter.base_checksum"
)

// ErrUnsupported is returned for a base model this trainer cannot train:
// an architecture other than llama, or a weight type other than F32, F16
// and Q8_0 (train those with an external trainer).
var ErrUnsupported = errors.New("unsupported base model")

// Config is a llama-architecture model's shape, read from its GGUF
// metadata.
type Config struct {
	Embd, Layers, Heads, HeadsKV, FFN, Vocab int
	HeadDim                                  int     // Embd / Heads
	RopeDims                                 int     // rotated dimensions per head (llama.rope.dimension_count)
	Eps                                      float32 // RMSNorm epsilon
	RopeBase                                 float32 // RoPE frequency base
}

// KVDim is the width of one token's keys (and values): HeadDim × HeadsKV.
func (c Config) KVDim() int { return c.HeadDim * c.HeadsKV }

// Layer is one transformer block's frozen weights. Matrices are row-major
// [n_out][n_in], as GGUF stores a tensor of ggml shape [n_in, n_out].
type Layer struct {
	AttnNorm, FFNNorm          []float32 // [Embd]
	Wq, Wk, Wv, Wo, Wg, Wu, Wd []float32
}

// Model is a base model's weights in float32 (dequantised), frozen during
// training.
type Model struct {
	Cfg      Config
	TokEmbd  []float32 // [Vocab][Embd]
	Layers   []Layer
	OutNorm  []float32 // [Embd]
	Out      []float32 // [Vocab][Embd]
	Arch     string
	Checksum string // general.base_checksum, "" when the base records none
	FileType string // the weights' storage type as loaded: F32, F16, Q8_0, or mixed
}

// Targets are the matrices a LoRA may adapt, by GGUF tensor suffix.
var Targets = []string{"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}

// matrix returns layer l's matrix named by target suffix and its
// (n_out, n_in).
func (m *Model) matrix(l int, target string) ([]float32, int, int) {
	c, ly := m.Cfg, &m.Layers[l]
	switch target {
	case "attn_q":
		return ly.Wq, c.Embd, c.Embd
	case "attn_k":
		return ly.Wk, c.KVDim(), c.Embd
	case "attn_v":
		return ly.Wv, c.KVDim(), c.Embd
	case "attn_output":
		return ly.Wo, c.Embd, c.Embd
	case "ffn_gate":
		return ly.Wg, c.FFN, c.Embd
	case "ffn_up":
		return ly.Wu, c.FFN, c.Embd
	case "ffn_down":
		return ly.Wd, c.Embd, c.FFN
	}
	return nil, 0, 0
}

// LoadModel reads a llama-architecture GGUF base model from path with its
// weights converted to float32. Errors: unreadable or malformed file,
// ErrUnsupported (architecture, weight type), a missing tensor.
func LoadModel(path string) (*Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("loading base model: %w", err)
	}
	defer f.Close()
	g, err := ggml.Decode(f, -1)
	if err != nil {
		return nil, fmt.Errorf("reading base model %s: %w", path, err)
	}
	kv := g.KV()
	arch := kv.Architecture()
	if arch != "llama" {
		return nil, fmt.Errorf("%w: architecture %q (this trainer knows llama; use external_trainer)", ErrUnsupported, arch)
	}
	if kv.String("general.type") == "adapter" {
		return nil, fmt.Errorf("%w: %s is an adapter, not a base model", ErrUnsupported, path)
	}
	c := Config{
		Embd:     int(kv.Uint("embedding_length")),
		Layers:   int(kv.Uint("block_count")),
		Heads:    int(kv.Uint("attention.head_count")),
		HeadsKV:  int(kv.Uint("attention.head_count_kv")),
		FFN:      int(kv.Uint("feed_forward_length")),
		Eps:      kv.Float("attention.layer_norm_rms_epsilon", 1e-5),
		RopeBase: kv.Float("rope.freq_base", 10000),
	}
	if c.HeadsKV == 0 {
		c.HeadsKV = c.Heads
	}
	if c.Embd <= 0 || c.Heads <= 0 || c.Embd%c.Heads != 0 || c.Heads%c.HeadsKV != 0 || c.Layers <= 0 || c.FFN <= 0 {
		return nil, fmt.Errorf("%w: inconsistent shape %+v", ErrUnsupported, c)
	}
	c.HeadDim = c.Embd / c.Heads
	c.RopeDims = int(kv.Uint("rope.dimension_count", uint32(c.HeadDim)))
	if c.RopeDims > c.HeadDim || c.RopeDims%2 != 0 {
		return nil, fmt.Errorf("%w: rope dimension %d of head size %d", ErrUnsupported, c.RopeDims, c.HeadDim)
	}
	m := &Model{Arch: arch, Checksum: kv.String(KeyBaseChecksum)}
	byName := map[string]*ggml.Tensor{}
	for _, t := range g.Tensors().Items() {
		byName[t.Name] = t
	}
	base := int64(g.Tensors().Offset)
	types := map[string]bool{}
	read := func(name string, shape ...int) ([]float32, error) {
		t, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("base model has no tensor %s", name)
		}
		n := 1
		for i, d := range shape {
			if i >= len(t.Shape) || int(t.Shape[i]) != d {
				return nil, fmt.Errorf("tensor %s has shape %v, want %v", name, t.Shape, shape)
			}
			n *= d
		}
		v, typ, err := readTensor(f, base+int64(t.Offset), t.Kind, n)
		if err != nil {
			return nil, fmt.Errorf("tensor %s: %w", name, err)
		}
		if len(shape) > 1 {
			types[typ] = true
		}
		return v, nil
	}
	emb, ok := byName["token_embd.weight"]
	if !ok || len(emb.Shape) != 2 {
		return nil, errors.New("base model has no token_embd.weight matrix")
	}
	c.Vocab = int(emb.Shape[1])
	m.Cfg = c
	if m.TokEmbd, err = read("token_embd.weight", c.Embd, c.Vocab); err != nil {
		return nil, err
	}
	if m.OutNorm, err = read("output_norm.weight", c.Embd); err != nil {
		return nil, err
	}
	outName := "output.weight"
	if _, ok := byName[outName]; !ok {
		outName = "token_embd.weight" // tied embeddings
	}
	if m.Out, err = read(outName, c.Embd, c.Vocab); err != nil {
		return nil, err
	}
	kvd := c.KVDim()
	for i := range c.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		var ly Layer
		for _, r := range []struct {
			dst   *[]float32
			name  string
			shape []int
		}{
			{&ly.AttnNorm, "attn_norm", []int{c.Embd}},
			{&ly.Wq, "attn_q", []int{c.Embd, c.Embd}},
			{&ly.Wk, "attn_k", []int{c.Embd, kvd}},
			{&ly.Wv, "attn_v", []int{c.Embd, kvd}},
			{&ly.Wo, "attn_output", []int{c.Embd, c.Embd}},
			{&ly.FFNNorm, "ffn_norm", []int{c.Embd}},
			{&ly.Wg, "ffn_gate", []int{c.Embd, c.FFN}},
			{&ly.Wu, "ffn_up", []int{c.Embd, c.FFN}},
			{&ly.Wd, "ffn_down", []int{c.FFN, c.Embd}},
		} {
			if *r.dst, err = read(p+r.name+".weight", r.shape...); err != nil {
				return nil, err
			}
		}
		m.Layers = append(m.Layers, ly)
	}
	switch len(types) {
	case 1:
		for t := range types {
			m.FileType = t
		}
	default:
		m.FileType = "mixed"
	}
	return m, nil
}

// readTensor reads n values of GGML type kind at off and converts them to
// float32. Q8_0 is blocks of 32 int8 values with one F16 scale (ggml's
// block_q8_0).
func readTensor(f io.ReaderAt, off int64, kind uint32, n int) ([]float32, string, error) {
	out := make([]float32, n)
	switch ggml.TensorType(kind) {
	case ggml.TensorTypeF32:
		buf := make([]byte, 4*n)
		if _, err := f.ReadAt(buf, off); err != nil {
			return nil, "", err
		}
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
		}
		return out, "F32", nil
	case ggml.TensorTypeF16:
		buf := make([]byte, 2*n)
		if _, err := f.ReadAt(buf, off); err != nil {
			return nil, "", err
		}
		for i := range out {
			out[i] = float16.Frombits(binary.LittleEndian.Uint16(buf[2*i:])).Float32()
		}
		return out, "F16", nil
	case ggml.TensorTypeQ8_0:
		if n%32 != 0 {
			return nil, "", fmt.Errorf("Q8_0 tensor of %d values", n)
		}
		blocks := n / 32
		buf := make([]byte, 34*blocks)
		if _, err := f.ReadAt(buf, off); err != nil {
			return nil, "", err
		}
		for b := range blocks {
			blk := buf[34*b:]
			d := float16.Frombits(binary.LittleEndian.Uint16(blk)).Float32()
			for j := range 32 {
				out[32*b+j] = d * float32(int8(blk[2+j]))
			}
		}
		return out, "Q8_0", nil
	}
	return nil, "", fmt.Errorf("%w: weight type %s (train on the F16/F32 model or use external_trainer)", ErrUnsupported,
		strings.ToUpper(ggml.TensorType(kind).String()))
}
