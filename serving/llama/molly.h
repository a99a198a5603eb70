// Molly's C side of the llama.cpp binding: per-token LoRA adapters applied
// inside one llama_decode, graph-reuse control, and the batched-bench style
// baseline used by the benchmarks. See lora.cpp and bench.c.
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

// A run of consecutive batch tokens that use one adapter at one scale.
// tok0/ntok index the batch's tokens; out0/nout index the tokens of the run
// that asked for logits (llama.cpp drops the other rows before the last
// layer's feed-forward block).
typedef struct molly_span {
	int32_t tok0, ntok;
	int32_t out0, nout;
	struct llama_adapter_lora * adapter;
	float scale;
} molly_span;

// Per-context state of the per-token adapter path (the eval callback's user
// data).
typedef struct molly_lora molly_lora;

molly_lora * molly_lora_new(int32_t n_threads);
void molly_lora_free(molly_lora * s);

// molly_lora_attach records the context the state belongs to and attaches
// the state's thread pool to it.
void molly_lora_attach(molly_lora * s, struct llama_context * ctx);

// molly_lora_pause puts the state's thread pool to sleep until the next
// decode (its workers otherwise spin for a while after each graph).
void molly_lora_pause(molly_lora * s);

// molly_lora_set sets the spans of the next decode: n_tokens and n_outputs of
// the batch, n spans copied from spans (n may be 0: base model only).
void molly_lora_set(molly_lora * s, int32_t n_tokens, int32_t n_outputs, const molly_span * spans, int32_t n);

// molly_lora_error returns and clears the last error of the callback (0: none;
// 1: a LoRA target whose input does not have one column per token or output).
int32_t molly_lora_error(molly_lora * s);

// molly_lora_targets counts the matrix products the last decode adapted.
int64_t molly_lora_targets(molly_lora * s);

// molly_lora_kernel_spans counts the (product, span) pairs of the last
// decode that Molly's F32 kernel computed instead of ggml operations.
int64_t molly_lora_kernel_spans(molly_lora * s);

// molly_lora_exact makes every delta use ggml's operations (bitwise what
// llama.cpp's context-level path computes for a span of the same shape).
void molly_lora_exact(molly_lora * s, bool exact);

// molly_eval_cb is the ggml scheduler eval callback installed on contexts.
bool molly_eval_cb(struct ggml_tensor * t, bool ask, void * user_data);

// molly_graph_invalidate makes the next llama_decode build its compute graph
// instead of reusing the previous one.
void molly_graph_invalidate(struct llama_context * ctx);

// molly_graph_reuses is how many decodes reused the previous graph.
int32_t molly_graph_reuses(struct llama_context * ctx);

// molly_adapter_bytes is the size of an adapter's resident tensors.
size_t molly_adapter_bytes(struct llama_adapter_lora * a);

// molly_bench describes one batched generation run of the llama.cpp
// baseline (bench.c).
typedef struct molly_bench {
	int32_t n_seq;            // sequences 0..n_seq-1
	int32_t n_prompt;         // prompt tokens per sequence
	const llama_token * prompt;
	int32_t n_gen;            // tokens generated per sequence
	int32_t n_adapters;       // adapters[0..n_adapters-1]
	struct llama_adapter_lora ** adapters;
	const int32_t * seq_adapter; // per sequence: index into adapters, -1 = base
	// results
	double t_prefill_us;
	double t_decode_us;
	int64_t n_decoded;        // generated tokens
	int32_t n_decode_calls;   // llama_decode calls in the generation phase
	llama_token * out;        // optional: n_seq*n_gen greedy tokens
} molly_bench;

// molly_batched_bench runs b on ctx; 0 on success, the failing
// llama_decode's code otherwise.
int32_t molly_batched_bench(struct llama_context * ctx, molly_bench * b);

#ifdef __cplusplus
}
#endif
