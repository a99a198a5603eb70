package serving

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/molly-gateway/molly/serving/gguf"
	"github.com/molly-gateway/molly/serving/llama"
)

// Demo layout written by WriteDemo: the base model at
// <dir>/DemoModelFile and one adapter per DemoAdapters name at
// <dir>/DemoAdapterDir/<name>.gguf. The served names are "molly-demo" and
// "molly-demo:<name>".
const (
	DemoModelFile  = "molly-demo.gguf"
	DemoAdapterDir = "adapters"
)

// DemoAdapters are the demo adapters' names (one per demo domain).
var DemoAdapters = []string{"support", "billing", "payments", "legal"}

// WriteDemo writes the demo model and adapters to dir, deterministically from
// seed: the same (seed, size) gives byte-identical files. size is "tiny",
// "small" (the default demo) or "bench" (~150M parameters, F16). The weights
// are random: the output is not language, but the engine, adapters, batching
// and API behave as with a real model. Errors: unknown size, write failures.
func WriteDemo(dir string, seed int64, size string) error {
	if size == "" {
		size = "small"
	}
	cfg, err := gguf.SizeConfig(size, seed)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, DemoAdapterDir), 0o755); err != nil {
		return err
	}
	if err := gguf.WriteModel(filepath.Join(dir, DemoModelFile), cfg); err != nil {
		return fmt.Errorf("writing demo model: %w", err)
	}
	for i, name := range DemoAdapters {
		a := gguf.AdapterConfig{Name: name, Rank: 8, Seed: seed*1000 + int64(i) + 1}
		if err := gguf.WriteAdapter(filepath.Join(dir, DemoAdapterDir, name+".gguf"), cfg, a); err != nil {
			return fmt.Errorf("writing demo adapter %s: %w", name, err)
		}
	}
	return nil
}

// DemoConfig is the engine configuration for a directory written by
// WriteDemo.
func DemoConfig(dir string) Config {
	return Config{
		ModelPath:  filepath.Join(dir, DemoModelFile),
		AdapterDir: filepath.Join(dir, DemoAdapterDir),
	}
}

// QuantizeModel rewrites the GGUF model at path with its weights converted to
// ftype ("q8_0", "q4_0", "q4_k_m", "q4_k_s" or "f16", any case) by
// llama_model_quantize; K-quants need rows of 256 values (llama.cpp falls
// back to another type for smaller tensors); metadata, including
// the base checksum adapters are checked against, is kept. Before llama.cpp
// is called, the file is checked (CheckQuantizable). Errors: those of
// CheckQuantizable, llama.cpp failure, file replacement failure.
func QuantizeModel(path, ftype string) error {
	if err := CheckQuantizable(path, ftype); err != nil {
		return err
	}
	tmp := path + ".quantizing"
	if err := llama.Quantize(path, tmp, ftype); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// quantTargets maps QuantizeModel's types to the GGUF file type
// (general.file_type, llama_ftype) llama.cpp writes and the tensor type it
// converts the weights to.
var quantTargets = map[string]struct {
	file   ggml.FileType
	tensor ggml.TensorType
}{
	"q8_0":   {ggml.FileTypeQ8_0, ggml.TensorTypeQ8_0},
	"q4_0":   {ggml.FileType(2), ggml.TensorTypeQ4_0}, // LLAMA_FTYPE_MOSTLY_Q4_0
	"q4_k_m": {ggml.FileTypeQ4_K_M, ggml.TensorTypeQ4_K},
	"q4_k":   {ggml.FileTypeQ4_K_M, ggml.TensorTypeQ4_K},
	"q4_k_s": {ggml.FileTypeQ4_K_S, ggml.TensorTypeQ4_K},
	"f16":    {ggml.FileTypeF16, ggml.TensorTypeF16},
}

// CheckQuantizable reports, without calling llama.cpp, why
// QuantizeModel(path, ftype) cannot succeed, or nil: ftype is not one of
// its types; path does not exist, is a directory or cannot be read; it is
// not a GGUF file (GGUF's magic), or its header does not decode; it is a
// LoRA adapter (general.type "adapter"), not a model; it is already of
// type ftype (general.file_type); or a weight is of a quantized type other
// than ftype's — llama_model_quantize converts only F32, F16 and BF16
// weights (it does not requantize: allow_requantize is off, as in
// llama.cpp's quantize tool by default), so such a model has to be
// quantized from its unquantized original.
func CheckQuantizable(path, ftype string) error {
	want, ok := quantTargets[strings.ToLower(ftype)]
	if !ok {
		return fmt.Errorf("quantize: unknown type %q (want q8_0, q4_0, q4_k_m, q4_k_s or f16)", ftype)
	}
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("quantize: the model file %s does not exist", path)
	case err != nil:
		return fmt.Errorf("quantize: %w", err)
	case st.IsDir():
		return fmt.Errorf("quantize: %s is a directory, not a GGUF model file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("quantize: %w", err)
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil || string(magic[:]) != "GGUF" {
		return fmt.Errorf("quantize: %s is not a GGUF file (it does not start with GGUF's magic)", path)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("quantize: %w", err)
	}
	g, err := ggml.Decode(f, 0)
	if err != nil {
		return fmt.Errorf("quantize: %s is not a valid GGUF file: %v", path, err)
	}
	kv := g.KV()
	if kv.String("general.type") == "adapter" {
		return fmt.Errorf("quantize: %s is a LoRA adapter, not a model", path)
	}
	if ft, ok := kv["general.file_type"].(uint32); ok && ggml.FileType(ft) == want.file {
		return fmt.Errorf("quantize: %s is already %s", path, want.file)
	}
	for _, t := range g.Tensors().Items() {
		if tt := ggml.TensorType(t.Kind); tt.IsQuantized() && tt != want.tensor {
			from := tt.String()
			if ft, ok := kv["general.file_type"].(uint32); ok && ggml.FileType(ft).String() != "unknown" {
				from = ggml.FileType(ft).String()
			}
			return fmt.Errorf("quantize: %s cannot be converted to %s from %s (tensor %s is %s): llama.cpp quantizes only F32, F16 and BF16 weights and does not requantize; quantize the unquantized model instead",
				path, want.file, from, t.Name, tt)
		}
	}
	return nil
}
