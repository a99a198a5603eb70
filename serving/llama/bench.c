// The llama.cpp baseline: batched generation driven directly through
// libllama, in the style of llama.cpp's examples/batched-bench (one
// llama_batch for all sequences of an adapter, greedy sampling). llama.cpp
// applies adapters per context, so sequences on different adapters are
// decoded group by group, setting each group's adapter first, as a
// llama.cpp application has to.
#include "molly.h"

#include <stdlib.h>
#include <time.h>

static double molly_now_us(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec * 1e6 + (double) ts.tv_nsec / 1e3;
}

static llama_token molly_argmax(const float * l, int32_t n) {
	int32_t best = 0;
	for (int32_t i = 1; i < n; i++) {
		if (l[i] > l[best]) {
			best = i;
		}
	}
	return best;
}

static void molly_bench_set_adapter(struct llama_context * ctx, molly_bench * b, int32_t * cur, int32_t g) {
	if (*cur == g) {
		return;
	}
	llama_clear_adapter_lora(ctx);
	if (g >= 0) {
		llama_set_adapter_lora(ctx, b->adapters[g], 1.0f);
	}
	// llama.cpp would reuse the previous graph across this change.
	molly_graph_invalidate(ctx);
	*cur = g;
}

static void molly_batch_put(struct llama_batch * batch, llama_token tok, llama_pos pos, llama_seq_id seq, int8_t logits) {
	int32_t i = batch->n_tokens++;
	batch->token[i] = tok;
	batch->pos[i] = pos;
	batch->n_seq_id[i] = 1;
	batch->seq_id[i][0] = seq;
	batch->logits[i] = logits;
}

int32_t molly_batched_bench(struct llama_context * ctx, molly_bench * b) {
	const struct llama_vocab * vocab = llama_model_get_vocab(llama_get_model(ctx));
	const int32_t n_vocab = llama_vocab_n_tokens(vocab);
	const int32_t n_seq = b->n_seq;
	llama_memory_clear(llama_get_memory(ctx), true);

	int32_t cap = n_seq * b->n_prompt;
	if (cap < n_seq) {
		cap = n_seq;
	}
	struct llama_batch batch = llama_batch_init(cap, 0, 1);
	llama_token * last = malloc(sizeof(llama_token) * n_seq);
	int32_t * bidx = malloc(sizeof(int32_t) * n_seq);
	// Groups in order of first appearance.
	int32_t * groups = malloc(sizeof(int32_t) * n_seq);
	int32_t n_groups = 0;
	for (int32_t s = 0; s < n_seq; s++) {
		int32_t a = b->seq_adapter ? b->seq_adapter[s] : -1;
		int32_t seen = 0;
		for (int32_t g = 0; g < n_groups; g++) {
			seen |= groups[g] == a;
		}
		if (!seen) {
			groups[n_groups++] = a;
		}
	}
	int32_t cur = -2;
	int32_t rc = 0;
	b->n_decoded = 0;
	b->n_decode_calls = 0;

	double t0 = molly_now_us();
	for (int32_t g = 0; g < n_groups && rc == 0; g++) {
		molly_bench_set_adapter(ctx, b, &cur, groups[g]);
		batch.n_tokens = 0;
		for (int32_t s = 0; s < n_seq; s++) {
			if ((b->seq_adapter ? b->seq_adapter[s] : -1) != groups[g]) {
				continue;
			}
			for (int32_t i = 0; i < b->n_prompt; i++) {
				molly_batch_put(&batch, b->prompt[i], i, s, i == b->n_prompt - 1);
			}
			bidx[s] = batch.n_tokens - 1;
		}
		rc = llama_decode(ctx, batch);
		for (int32_t s = 0; s < n_seq && rc == 0; s++) {
			if ((b->seq_adapter ? b->seq_adapter[s] : -1) == groups[g]) {
				last[s] = molly_argmax(llama_get_logits_ith(ctx, bidx[s]), n_vocab);
				if (b->out) {
					b->out[s * b->n_gen] = last[s];
				}
				b->n_decoded++;
			}
		}
	}
	double t1 = molly_now_us();
	for (int32_t k = 1; k < b->n_gen && rc == 0; k++) {
		for (int32_t g = 0; g < n_groups && rc == 0; g++) {
			molly_bench_set_adapter(ctx, b, &cur, groups[g]);
			batch.n_tokens = 0;
			for (int32_t s = 0; s < n_seq; s++) {
				if ((b->seq_adapter ? b->seq_adapter[s] : -1) != groups[g]) {
					continue;
				}
				bidx[s] = batch.n_tokens;
				molly_batch_put(&batch, last[s], b->n_prompt + k - 1, s, 1);
			}
			rc = llama_decode(ctx, batch);
			b->n_decode_calls++;
			for (int32_t s = 0; s < n_seq && rc == 0; s++) {
				if ((b->seq_adapter ? b->seq_adapter[s] : -1) == groups[g]) {
					last[s] = molly_argmax(llama_get_logits_ith(ctx, bidx[s]), n_vocab);
					if (b->out) {
						b->out[s * b->n_gen + k] = last[s];
					}
					b->n_decoded++;
				}
			}
		}
	}
	double t2 = molly_now_us();
	b->t_prefill_us = t1 - t0;
	b->t_decode_us = t2 - t1;
	molly_bench_set_adapter(ctx, b, &cur, -1);
	llama_memory_clear(llama_get_memory(ctx), true);
	free(groups);
	free(bidx);
	free(last);
	llama_batch_free(batch);
	return rc;
}
