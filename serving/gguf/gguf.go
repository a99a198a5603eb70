// Package gguf generates small llama-architecture GGUF models and LoRA
// adapters with random weights, deterministically from a seed.
//
// No model can be downloaded where Molly is built and tested, so tests,
// benchmarks and `molly model demo` generate what they need. The files are
// written with github.com/ollama/ollama/fs/ggml WriteGGUF, which llama.cpp
// loads. Tensor shapes follow ggml order (ne0 first), as stored in GGUF.
//
// The vocabulary is byte level: <unk>, <s>, </s>, the 256 byte tokens
// <0x00>..<0xFF>, the SentencePiece space "▁" and the ChatML control tokens
// <|im_start|> and <|im_end|>, then the reasoning delimiters <think> and
// </think> as user-defined tokens (as Qwen3 and DeepSeek-R1 define them: they
// render as their text and tokenize whole); tokenizer.ggml.model is "llama"
// (SPM with byte fallback), so any text tokenizes. The chat template is
// ChatML, which llama_chat_apply_template recognises, with Qwen3's
// enable_thinking switch (an empty <think></think> block when off), which
// names the template's reasoning delimiters.
//
// Random weights would make every byte equally likely, including control
// tokens; to make demo output readable and finish_reason "length" the common
// case, every token embedding carries a constant on dimension 0 and the
// output projection reads that dimension with +Bias for printable ASCII and
// the space token and -Bias for every other token (Bias = 1.5). The output row
// of </think> is that of the byte ':', so that sampling ends a reasoning block
// by itself now and then, and greedy decoding never does.
package gguf

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"

	"github.com/ollama/ollama/fs/ggml"
	"github.com/x448/float16"
)

// Token ids of the generated vocabulary.
const (
	TokenUnk      = 0
	TokenBOS      = 1
	TokenEOS      = 2
	TokenByte0    = 3 // <0x00>; byte b is TokenByte0+b
	TokenSpace    = TokenByte0 + 256
	TokenImStart  = TokenSpace + 1
	TokenImEnd    = TokenSpace + 2
	TokenThink    = TokenSpace + 3 // <think>
	TokenThinkEnd = TokenSpace + 4 // </think>
	VocabSize     = TokenThinkEnd + 1
	chatMLJinja   = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}"
	printableBias = 1.5
	thinkEndBias  = 2.5
)

// KeyBaseChecksum is the metadata key under which a generated base model
// records its identity (hex SHA-256 of the generation parameters and seed);
// quantized copies keep it. KeyAdapterBaseChecksum is the adapter-side key:
// an adapter whose value differs from the base model's is refused by the
// engine.
const (
	KeyBaseChecksum        = "general.base_checksum"
	KeyAdapterBaseChecksum = "adapter.base_checksum"
	// KeyALoRAInvocation is llama.cpp's key of an activated LoRA's
	// invocation tokens (array of uint32).
	KeyALoRAInvocation = "adapter.alora.invocation_tokens"
)

// Config is the shape of a generated llama model.
type Config struct {
	Name       string
	Embd       int // n_embd, model width
	Layers     int // n_layer
	Heads      int // n_head; Embd must be a multiple of it
	HeadsKV    int // n_head_kv; Heads must be a multiple of it
	FFN        int // n_ff, feed-forward width
	ContextLen int // llama.context_length, tokens
	F16        bool
	Seed       int64
}

// Sizes are the named configurations: "tiny" for tests (about 0.1M
// parameters, F32), "small" for the demo (about 3M, F32) and "bench" for
// benchmarks (about 150M, F16, so that decoding is memory bound as with real
// models).
var Sizes = map[string]Config{
	"tiny":  {Name: "tiny", Embd: 64, Layers: 2, Heads: 4, HeadsKV: 2, FFN: 128, ContextLen: 4096},
	"small": {Name: "small", Embd: 256, Layers: 4, Heads: 8, HeadsKV: 4, FFN: 768, ContextLen: 4096},
	"bench": {Name: "bench", Embd: 1024, Layers: 12, Heads: 16, HeadsKV: 8, FFN: 2816, ContextLen: 4096, F16: true},
}

// SizeConfig returns the named configuration with the seed set.
// Errors: unknown size.
func SizeConfig(size string, seed int64) (Config, error) {
	c, ok := Sizes[size]
	if !ok {
		return Config{}, fmt.Errorf("unknown model size %q (want tiny, small or bench)", size)
	}
	c.Seed = seed
	return c, nil
}

// Checksum is the base identity recorded under KeyBaseChecksum: hex SHA-256
// of the configuration (which includes the seed).
func (c Config) Checksum() string {
	h := sha256.Sum256(fmt.Appendf(nil, "molly-gguf-v1 %+v", c))
	return hex.EncodeToString(h[:])
}

func (c Config) embdKV() int { return c.Embd / c.Heads * c.HeadsKV }

// TensorShapes lists the base model's tensors and their ggml shapes.
func (c Config) TensorShapes() map[string][]uint64 {
	e, kv, ff, v := uint64(c.Embd), uint64(c.embdKV()), uint64(c.FFN), uint64(VocabSize)
	m := map[string][]uint64{
		"token_embd.weight":  {e, v},
		"output_norm.weight": {e},
		"output.weight":      {e, v},
	}
	for i := range c.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		m[p+"attn_norm.weight"] = []uint64{e}
		m[p+"attn_q.weight"] = []uint64{e, e}
		m[p+"attn_k.weight"] = []uint64{e, kv}
		m[p+"attn_v.weight"] = []uint64{e, kv}
		m[p+"attn_output.weight"] = []uint64{e, e}
		m[p+"ffn_norm.weight"] = []uint64{e}
		m[p+"ffn_gate.weight"] = []uint64{e, ff}
		m[p+"ffn_up.weight"] = []uint64{e, ff}
		m[p+"ffn_down.weight"] = []uint64{ff, e}
	}
	return m
}

// Vocab returns the token texts, scores and types (1 normal, 2 unknown,
// 3 control, 4 user-defined, 6 byte) of the generated vocabulary.
func Vocab() (tokens []string, scores []float32, types []int32) {
	tokens = []string{"<unk>", "<s>", "</s>"}
	types = []int32{2, 3, 3}
	for b := range 256 {
		tokens = append(tokens, fmt.Sprintf("<0x%02X>", b))
		types = append(types, 6)
	}
	tokens = append(tokens, "▁", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
	types = append(types, 1, 3, 3, 4, 4)
	scores = make([]float32, len(tokens))
	scores[TokenSpace] = -1
	return tokens, scores, types
}

func printable(tok int) bool {
	if tok == TokenSpace {
		return true
	}
	b := tok - TokenByte0
	return b >= 0x20 && b < 0x7f || b == '\n'
}

// rng derives a per-tensor generator so that each tensor's values depend only
// on (seed, name), not on generation order.
func rng(seed int64, name string) *rand.Rand {
	h := sha256.Sum256([]byte(name))
	return rand.New(rand.NewPCG(uint64(seed), binary.LittleEndian.Uint64(h[:8])))
}

func normal(r *rand.Rand, n int, std float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(r.NormFloat64() * std)
	}
	return out
}

func fill(n int, v float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// data is a tensor payload: float32 values written as F32 or F16.
type data struct {
	v   []float32
	f16 bool
}

func (d data) WriteTo(w io.Writer) (int64, error) {
	var buf []byte
	if d.f16 {
		buf = make([]byte, 2*len(d.v))
		for i, x := range d.v {
			binary.LittleEndian.PutUint16(buf[2*i:], float16.Fromfloat32(x).Bits())
		}
	} else {
		buf = make([]byte, 4*len(d.v))
		for i, x := range d.v {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
		}
	}
	n, err := w.Write(buf)
	return int64(n), err
}

func tensor(name string, shape []uint64, v []float32, f16 bool) *ggml.Tensor {
	kind := uint32(ggml.TensorTypeF32)
	if f16 && len(shape) > 1 {
		kind = uint32(ggml.TensorTypeF16)
	} else {
		f16 = false
	}
	return &ggml.Tensor{Name: name, Kind: kind, Shape: shape, WriterTo: data{v: v, f16: f16}}
}

// WriteModel writes the base model described by c to path.
// Errors: invalid shape, file creation or write failure.
func WriteModel(path string, c Config) error {
	if c.Embd <= 0 || c.Heads <= 0 || c.HeadsKV <= 0 || c.Embd%c.Heads != 0 || c.Heads%c.HeadsKV != 0 || c.Layers <= 0 || c.FFN <= 0 {
		return fmt.Errorf("invalid model config %+v", c)
	}
	tokens, scores, types := Vocab()
	ftype := uint32(0)
	if c.F16 {
		ftype = 1
	}
	kv := ggml.KV{
		"general.architecture":                   "llama",
		"general.name":                           "molly-" + c.Name,
		"general.file_type":                      ftype,
		KeyBaseChecksum:                          c.Checksum(),
		"llama.context_length":                   uint32(c.ContextLen),
		"llama.embedding_length":                 uint32(c.Embd),
		"llama.block_count":                      uint32(c.Layers),
		"llama.feed_forward_length":              uint32(c.FFN),
		"llama.attention.head_count":             uint32(c.Heads),
		"llama.attention.head_count_kv":          uint32(c.HeadsKV),
		"llama.attention.layer_norm_rms_epsilon": float32(1e-5),
		"llama.rope.freq_base":                   float32(10000),
		"llama.rope.dimension_count":             uint32(c.Embd / c.Heads),
		"llama.vocab_size":                       uint32(VocabSize),
		"tokenizer.ggml.model":                   "llama",
		"tokenizer.ggml.tokens":                  tokens,
		"tokenizer.ggml.scores":                  scores,
		"tokenizer.ggml.token_type":              types,
		"tokenizer.ggml.bos_token_id":            uint32(TokenBOS),
		"tokenizer.ggml.eos_token_id":            uint32(TokenEOS),
		"tokenizer.ggml.unknown_token_id":        uint32(TokenUnk),
		"tokenizer.ggml.add_bos_token":           true,
		"tokenizer.ggml.add_eos_token":           false,
		"tokenizer.ggml.add_space_prefix":        false,
		"tokenizer.chat_template":                chatMLJinja,
	}
	shapes := c.TensorShapes()
	var ts []*ggml.Tensor
	for name, shape := range shapes {
		n := 1
		for _, d := range shape {
			n *= int(d)
		}
		r := rng(c.Seed, name)
		var v []float32
		switch {
		case len(shape) == 1:
			v = fill(n, 1)
		case name == "token_embd.weight":
			// Token-dependent part of unit scale; dimension 0 carries a
			// constant 2*sqrt(n_embd) that survives the layers, so that the
			// final norm keeps it large and positive.
			v = normal(r, n, 1)
			for t := range VocabSize {
				v[t*c.Embd] = float32(2 * math.Sqrt(float64(c.Embd)))
			}
		case name == "output.weight":
			v = normal(r, n, 1)
			for t := range VocabSize {
				if printable(t) {
					v[t*c.Embd] = printableBias
				} else {
					v[t*c.Embd] = -printableBias
				}
			}
			// </think> scores as the byte ':' does: sampling ends a
			// reasoning block as often as it writes a colon; greedy
			// never does (ties go to the lower id).
			sp := (TokenByte0 + ':') * c.Embd
			copy(v[TokenThinkEnd*c.Embd:(TokenThinkEnd+1)*c.Embd], v[sp:sp+c.Embd])
		default:
			// Fan-in scaled so activations keep their size through layers.
			v = normal(r, n, 1/math.Sqrt(float64(shape[0])))
		}
		ts = append(ts, tensor(name, shape, v, c.F16))
	}
	return writeFile(path, kv, ts)
}

func writeFile(path string, kv ggml.KV, ts []*ggml.Tensor) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := ggml.WriteGGUF(f, kv, ts); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

// AdapterConfig describes a generated LoRA adapter.
type AdapterConfig struct {
	Name    string
	Rank    int      // r: lora_a is [n_in, r], lora_b is [r, n_out] (ggml order)
	Alpha   float32  // adapter.lora.alpha; llama.cpp scales by alpha/r
	Targets []string // tensor suffixes, e.g. "attn_q", "attn_v", "ffn_up"
	Std     float64  // standard deviation of lora_b entries (effect size)
	Seed    int64
	// Architecture and BaseChecksum override general.architecture ("llama")
	// and the recorded base checksum (base.Checksum()); tests use them to
	// make mismatched adapters.
	Architecture string
	BaseChecksum string
	// Invocation, when set, makes an activated LoRA (aLoRA, Greenewald et
	// al. 2025): adapter.alora.invocation_tokens, the token sequence after
	// which the adapter applies (llama.cpp's key).
	Invocation []uint32
}

// DefaultTargets are the tensors adapted by default.
var DefaultTargets = []string{"attn_q", "attn_v", "ffn_up", "ffn_down"}

// WriteAdapter writes a LoRA adapter for base model c to path, in the
// llama.cpp adapter GGUF format: general.type=adapter, adapter.type=lora,
// adapter.lora.alpha, and for each target tensor X.weight of shape
// [n_in, n_out] the pair X.weight.lora_a [n_in, r] and X.weight.lora_b
// [r, n_out]. The adapter records the base's checksum under
// KeyAdapterBaseChecksum. Errors: unknown target, write failure.
func WriteAdapter(path string, base Config, a AdapterConfig) error {
	if a.Rank <= 0 {
		a.Rank = 8
	}
	if a.Alpha == 0 {
		a.Alpha = float32(a.Rank)
	}
	if len(a.Targets) == 0 {
		a.Targets = DefaultTargets
	}
	if a.Std == 0 {
		a.Std = 0.5
	}
	if a.Architecture == "" {
		a.Architecture = "llama"
	}
	if a.BaseChecksum == "" {
		a.BaseChecksum = base.Checksum()
	}
	kv := ggml.KV{
		"general.architecture": a.Architecture,
		"general.type":         "adapter",
		"general.name":         a.Name,
		"adapter.type":         "lora",
		"adapter.lora.alpha":   a.Alpha,
		KeyAdapterBaseChecksum: a.BaseChecksum,
	}
	if len(a.Invocation) > 0 {
		kv[KeyALoRAInvocation] = a.Invocation
	}
	shapes := base.TensorShapes()
	var ts []*ggml.Tensor
	for i := range base.Layers {
		for _, t := range a.Targets {
			name := fmt.Sprintf("blk.%d.%s.weight", i, t)
			shape, ok := shapes[name]
			if !ok || len(shape) != 2 {
				return fmt.Errorf("adapter %s: base model has no matrix %s", a.Name, name)
			}
			nIn, nOut, r := shape[0], shape[1], uint64(a.Rank)
			ra := rng(a.Seed, name+".lora_a")
			rb := rng(a.Seed, name+".lora_b")
			ts = append(ts,
				tensor(name+".lora_a", []uint64{nIn, r}, normal(ra, int(nIn*r), 1/math.Sqrt(float64(nIn))), false),
				tensor(name+".lora_b", []uint64{r, nOut}, normal(rb, int(r*nOut), a.Std/math.Sqrt(float64(r))), false),
			)
		}
	}
	return writeFile(path, kv, ts)
}
