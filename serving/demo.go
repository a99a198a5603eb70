package serving

import (
	"fmt"
	"os"
	"path/filepath"

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
// the base checksum adapters are checked against, is kept. Errors: unknown
// ftype, llama.cpp failure, file replacement failure.
func QuantizeModel(path, ftype string) error {
	tmp := path + ".quantizing"
	if err := llama.Quantize(path, tmp, ftype); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
