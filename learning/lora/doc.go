// Package lora trains LoRA adapters (Hu et al., "LoRA: Low-Rank
// Adaptation of Large Language Models", 2021) for llama-architecture GGUF
// base models on this machine's CPU, and writes them as llama.cpp adapter
// GGUFs (general.type=adapter, <tensor>.lora_a/.lora_b, adapter.lora.alpha)
// that the T0 engine serves.
//
// Approach: it trains the A and B matrices directly, on a forward and
// backward pass of its own in Go (net.go) over the base weights read from
// the GGUF (F32, F16 or Q8_0, dequantised once to F32 and frozen), with
// Adam (Kingma & Ba, ICLR 2015) on the mean NLL of the answer tokens. The
// issue allowed two routes; this one was chosen over llama.cpp's
// llama_opt_* API plus truncated-SVD extraction because (1) llama_opt_*
// fine-tunes whole F32/F16 weight matrices, so extraction from the delta
// loses what the rank cannot hold and needs a full-rank copy of every
// trained matrix in memory, while training A/B optimises exactly the
// rank-r model that will be served; (2) the trainer stays independent of
// the vendored llama.cpp's training API, which changes between releases;
// (3) the small models this machine can train fit a plain CPU pass. The
// forward pass is checked against llama.cpp's logits and the backward pass
// against central finite differences (lora_test.go).
//
// Runs are interruptible (context) and resumable: Options.Checkpoint
// holds the step, the adapter and Adam's moments, and a run
// started with the checkpoint of the same run (base, data, options)
// resumes bit-exactly; one of another run is refused (ErrOtherRun).
// Models too large for CPU are trained by an external trainer
// (learning/specialise Config.ExternalTrainer).
package lora
