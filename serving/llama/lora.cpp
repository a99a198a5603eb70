// Per-token LoRA adapters inside one llama_decode, for the llama.cpp vendored
// by github.com/ollama/ollama v0.17.4.
//
// llama.cpp applies adapters per context: every token of a decode gets the
// same set (llm_graph_context::build_lora_mm adds scale*B(A x) after each
// adapted matrix product). To share the base weights between sequences on
// different adapters in one decode (the S-LoRA/Punica property: Sheng et al.,
// MLSys'24; Chen et al., MLSys'24), Molly leaves the context's adapter set
// empty and installs a ggml scheduler eval callback. The callback asks for
// the result of every matrix product whose weight one of the decode's
// adapters targets; once ggml has computed y = W x for all tokens, it adds,
// for each span of consecutive tokens sharing an adapter, scale*B(A x_span)
// to the span's columns of y, with the same ggml operations llama.cpp's own
// path uses (mul_mat, mul_mat, scale, add), before any consumer of y runs.
// The base product is computed once for all tokens; only the low-rank deltas
// are per span.
//
// Because the graph no longer depends on the adapters, graph reuse stays
// correct when adapters change. The context-level path (llama_set_adapter_lora)
// still needs a rebuild after a change, which molly_graph_invalidate forces.
//
// Internal headers: llama-context.h and llama-adapter.h of the same pinned
// llama.cpp, reached through the public include folder.

#include "molly.h"

#include "../src/llama-adapter.h"
#include "../src/llama-context.h"

#include "ggml-cpu.h"
#include "ggml.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

// molly_job is one run of tokens for delta_f32.
struct molly_job {
	const ggml_tensor * a;
	const ggml_tensor * b;
	float scale;
	const float * x;
	size_t ldx;
	float * y;
	size_t ldy;
	int64_t n;
};

struct molly_lora {
	llama_context * ctx = nullptr;
	ggml_threadpool * tp = nullptr;
	int32_t n_threads = 1;
	int32_t n_tokens = 0;
	int32_t n_outputs = 0;
	std::vector<molly_span> spans;
	std::vector<uint8_t> mem;  // ggml context memory for the delta graph
	std::vector<uint8_t> work; // ggml work buffer
	alignas(64) uint8_t meta[16384]; // ggml context memory for small graphs
	std::vector<molly_job> jobs;
	int64_t job_work = 0; // multiply-adds in jobs
	// (adapter, weight) → LoRA pair for this decode: llama.cpp looks
	// weights up by name, a string hash per call.
	std::unordered_map<const void *, std::unordered_map<const ggml_tensor *, llama_adapter_lora_weight *>> lw_cache;
	int32_t err = 0;
	int64_t targets = 0; // adapted products in the last decode
	int64_t kernel = 0;  // of their spans, done by delta_f32
	bool exact = false;  // every span through ggml operations
};

molly_lora * molly_lora_new(int32_t n_threads) {
	auto * s = new molly_lora();
	s->n_threads = n_threads > 0 ? n_threads : 1;
	ggml_threadpool_params p = ggml_threadpool_params_default(s->n_threads);
	s->tp = ggml_threadpool_new(&p);
	return s;
}

void molly_lora_free(molly_lora * s) {
	if (s == nullptr) {
		return;
	}
	if (s->tp != nullptr) {
		ggml_threadpool_free(s->tp);
	}
	delete s;
}

void molly_lora_attach(molly_lora * s, llama_context * ctx) {
	s->ctx = ctx;
	llama_attach_threadpool(ctx, s->tp, s->tp);
}

void molly_lora_pause(molly_lora * s) {
	if (s->tp != nullptr && s->n_threads > 1) {
		ggml_threadpool_pause(s->tp);
	}
}

static void set_callback(molly_lora * s, bool on);

void molly_lora_set(molly_lora * s, int32_t n_tokens, int32_t n_outputs, const molly_span * spans, int32_t n) {
	set_callback(s, n > 0);
	s->n_tokens = n_tokens;
	s->n_outputs = n_outputs;
	s->spans.assign(spans, spans + n);
	s->lw_cache.clear();
	s->targets = 0;
	s->kernel = 0;
}

int32_t molly_lora_error(molly_lora * s) {
	int32_t e = s->err;
	s->err = 0;
	return e;
}

int64_t molly_lora_targets(molly_lora * s) { return s->targets; }

int64_t molly_lora_kernel_spans(molly_lora * s) { return s->kernel; }

void molly_lora_exact(molly_lora * s, bool exact) { s->exact = exact; }

// weight is adapter a's LoRA pair for base weight w, or nullptr.
static llama_adapter_lora_weight * weight(molly_lora * s, llama_adapter_lora * a, ggml_tensor * w) {
	auto & m = s->lw_cache[a];
	auto it = m.find(w);
	if (it != m.end()) {
		return it->second;
	}
	return m[w] = a->get_weight(w);
}

// adapted reports whether any span's adapter targets the weight of t.
static bool adapted(molly_lora * s, ggml_tensor * t) {
	if (t->op != GGML_OP_MUL_MAT || t->src[0] == nullptr) {
		return false;
	}
	llama_adapter_lora * last = nullptr;
	for (const auto & sp : s->spans) {
		if (sp.adapter == nullptr || sp.adapter == last) {
			continue;
		}
		last = sp.adapter;
		if (weight(s, sp.adapter, t->src[0]) != nullptr) {
			return true;
		}
	}
	return false;
}

// delta_f32 adds scale * B (A x) to y for each of n columns of X and Y, for
// F32 A [n_in, r] (ggml order: column j of A is contiguous) and B [r, n_out]
// (row o of B^T, r values, is contiguous). h = scale * A^T x uses ggml's own
// F32 dot product; y += B^T h takes eight outputs at a time with AVX2 (eight
// products of r values, reduced by a horizontal-add tree). It computes what
// llama.cpp's mul_mat, mul_mat, scale, add do, in another summation order.
static void delta_f32(const ggml_tensor * A, const ggml_tensor * B, float scale, const float * X, size_t ldx,
                      float * Y, size_t ldy, int64_t n) {
	const int64_t n_in = A->ne[0], r = A->ne[1], n_out = B->ne[1];
	const float * a = (const float *) A->data;
	const float * b = (const float *) B->data;
	const ggml_vec_dot_t dot = ggml_get_type_traits_cpu(GGML_TYPE_F32)->vec_dot;
	alignas(32) float h[64];
	for (int64_t t = 0; t < n; t++) {
		const float * x = X + t * ldx;
		float * y = Y + t * ldy;
		for (int64_t j = 0; j < r; j++) {
			float d;
			dot((int) n_in, &d, 0, a + j * n_in, 0, x, 0, 1);
			h[j] = d * scale;
		}
		int64_t o = 0;
#if defined(__AVX2__)
		if (r % 8 == 0) {
			for (; o + 8 <= n_out; o += 8) {
				__m256 p[8];
				for (int k = 0; k < 8; k++) {
					const float * row = b + (o + k) * r;
					__m256 acc = _mm256_mul_ps(_mm256_loadu_ps(row), _mm256_load_ps(h));
					for (int64_t j = 8; j < r; j += 8) {
						acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(row + j), _mm256_load_ps(h + j)));
					}
					p[k] = acc;
				}
				// Horizontal sums of p[0..7] into one vector: lane k = sum of p[k].
				__m256 s01 = _mm256_hadd_ps(p[0], p[1]);
				__m256 s23 = _mm256_hadd_ps(p[2], p[3]);
				__m256 s45 = _mm256_hadd_ps(p[4], p[5]);
				__m256 s67 = _mm256_hadd_ps(p[6], p[7]);
				__m256 s0123 = _mm256_hadd_ps(s01, s23);
				__m256 s4567 = _mm256_hadd_ps(s45, s67);
				__m256 lo = _mm256_permute2f128_ps(s0123, s4567, 0x20);
				__m256 hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
				_mm256_storeu_ps(y + o, _mm256_add_ps(_mm256_loadu_ps(y + o), _mm256_add_ps(lo, hi)));
			}
		}
#endif
		for (; o < n_out; o++) {
			const float * row = b + o * r;
			float d = 0;
			for (int64_t j = 0; j < r; j++) {
				d += row[j] * h[j];
			}
			y[o] += d;
		}
	}
}

// delta_task runs the kernel jobs i ≡ ith (mod nth): a ggml custom
// operation, so that the context's thread pool shares them.
static void delta_task(ggml_tensor * dst, int ith, int nth, void * ud) {
	(void) dst;
	const auto * jobs = static_cast<const std::vector<molly_job> *>(ud);
	for (size_t i = ith; i < jobs->size(); i += nth) {
		const molly_job & j = (*jobs)[i];
		delta_f32(j.a, j.b, j.scale, j.x, j.ldx, j.y, j.ldy, j.n);
	}
}

// parallel_work is the multiply-adds from which run_jobs uses the thread
// pool (about 50 µs of one core's work).
static const int64_t parallel_work = 1 << 20;

// run_jobs runs s->jobs: inline when there is one job, one thread or little
// work, else as one custom operation on the thread pool.
static bool run_jobs(molly_lora * s) {
	if (s->jobs.empty()) {
		return true;
	}
	// Small work (a decode step's runs) stays on this thread: handing it to
	// the pool costs a wake-up and a barrier, and on a busy machine a
	// barrier can wait for a descheduled worker.
	if (s->jobs.size() == 1 || s->n_threads == 1 || s->job_work < parallel_work) {
		delta_task(nullptr, 0, 1, &s->jobs);
		return true;
	}
	ggml_init_params ip = {sizeof(s->meta), s->meta, false};
	ggml_context * g = ggml_init(ip);
	ggml_cgraph * gf = ggml_new_graph_custom(g, 4, false);
	const int n_tasks = (int) std::min<size_t>(s->jobs.size(), s->n_threads);
	ggml_tensor * op = ggml_custom_4d(g, GGML_TYPE_F32, 1, 1, 1, 1, nullptr, 0, delta_task, n_tasks, &s->jobs);
	ggml_build_forward_expand(gf, op);
	ggml_cplan plan = ggml_graph_plan(gf, s->n_threads, s->tp);
	const bool ok = plan.work_size == 0 && ggml_graph_compute(gf, &plan) == GGML_STATUS_SUCCESS;
	ggml_free(g);
	if (!ok) {
		s->err = 2;
	}
	return ok;
}

// kernel_ok reports whether delta_f32 handles lw.
static bool kernel_ok(const molly_lora * s, const llama_adapter_lora_weight * lw) {
	return !s->exact && lw->a->type == GGML_TYPE_F32 && lw->b->type == GGML_TYPE_F32 && lw->a->ne[1] <= 64 &&
	       ggml_is_contiguous(lw->a) && ggml_is_contiguous(lw->b);
}

// apply adds each span's low-rank delta to its columns of t = W x.
static bool apply(molly_lora * s, ggml_tensor * t) {
	ggml_tensor * x = t->src[1];
	const int64_t cols = x->ne[1];
	bool by_output;
	if (cols == s->n_tokens) {
		by_output = false;
	} else if (cols == s->n_outputs) {
		by_output = true;
	} else {
		s->err = 1;
		return false;
	}
	if (x->type != GGML_TYPE_F32 || t->type != GGML_TYPE_F32 || x->ne[2] != 1 || x->ne[3] != 1 ||
	    !ggml_is_contiguous(x) || !ggml_is_contiguous(t) || t->ne[1] != cols) {
		s->err = 1;
		return false;
	}
	const int64_t n_out = t->ne[0];

	// Spans the kernel takes (F32 matrices, rank up to 64) are done at once;
	// the others (and all of them in exact mode) go to a ggml graph.
	size_t need = ggml_graph_overhead_custom(8 * s->spans.size() + 8, false);
	int graphed = 0;
	s->jobs.clear();
	s->job_work = 0;
	for (const auto & sp : s->spans) {
		const int64_t c0 = by_output ? sp.out0 : sp.tok0;
		const int64_t n = by_output ? sp.nout : sp.ntok;
		if (sp.adapter == nullptr || n == 0) {
			continue;
		}
		llama_adapter_lora_weight * lw = weight(s, sp.adapter, t->src[0]);
		if (lw == nullptr) {
			continue;
		}
		if (kernel_ok(s, lw)) {
			const float scale = lw->get_scale(sp.adapter->alpha, sp.scale);
			const size_t ldx = x->nb[1] / sizeof(float), ldy = t->nb[1] / sizeof(float);
			// Runs of many tokens are cut so that the threads share them.
			const int64_t step = std::max<int64_t>(1, (n + s->n_threads - 1) / s->n_threads);
			for (int64_t i = 0; i < n; i += step) {
				const int64_t c = c0 + i;
				s->jobs.push_back({lw->a, lw->b, scale, (const float *) x->data + c * ldx, ldx, (float *) t->data + c * ldy, ldy, std::min(step, n - i)});
			}
			s->job_work += n * (lw->a->ne[0] + lw->b->ne[1]) * lw->a->ne[1];
			s->kernel++;
			continue;
		}
		graphed++;
		need += 8 * ggml_tensor_overhead() + 2 * (size_t) (lw->a->ne[1] + n_out) * n * sizeof(float) + 256;
	}
	s->targets++;
	if (!run_jobs(s)) {
		return false;
	}
	if (graphed == 0) {
		return true;
	}
	if (s->mem.size() < need) {
		s->mem.resize(need);
	}
	ggml_init_params ip = {s->mem.size(), s->mem.data(), false};
	ggml_context * g = ggml_init(ip);
	ggml_cgraph * gf = ggml_new_graph_custom(g, 8 * s->spans.size() + 8, false);
	// Leaves that alias x and t: views of x and t themselves would make
	// the delta graph include (and recompute) everything upstream of them.
	ggml_init_params mp = {sizeof(s->meta), s->meta, true};
	ggml_context * meta = ggml_init(mp);
	ggml_tensor * xl = ggml_new_tensor_2d(meta, GGML_TYPE_F32, x->ne[0], cols);
	ggml_tensor * tl = ggml_new_tensor_2d(meta, GGML_TYPE_F32, n_out, cols);
	xl->data = x->data;
	tl->data = t->data;
	int nodes = 0;
	for (const auto & sp : s->spans) {
		const int64_t c0 = by_output ? sp.out0 : sp.tok0;
		const int64_t n = by_output ? sp.nout : sp.ntok;
		if (sp.adapter == nullptr || n == 0) {
			continue;
		}
		llama_adapter_lora_weight * lw = weight(s, sp.adapter, t->src[0]);
		if (lw == nullptr || kernel_ok(s, lw)) {
			continue;
		}
		// The same operations as llm_graph_context::build_lora_mm.
		const float scale = lw->get_scale(sp.adapter->alpha, sp.scale);
		ggml_tensor * xv = ggml_view_2d(g, xl, x->ne[0], n, xl->nb[1], c0 * xl->nb[1]);
		ggml_tensor * ab = ggml_mul_mat(g, lw->b, ggml_mul_mat(g, lw->a, xv));
		ab = ggml_scale(g, ab, scale);
		ggml_tensor * yv = ggml_view_2d(g, tl, n_out, n, tl->nb[1], c0 * tl->nb[1]);
		ggml_build_forward_expand(gf, ggml_add_inplace(g, yv, ab));
		nodes++;
	}
	if (nodes > 0) {
		ggml_cplan plan = ggml_graph_plan(gf, s->n_threads, s->tp);
		if (plan.work_size > 0) {
			if (s->work.size() < plan.work_size) {
				s->work.resize(plan.work_size);
			}
			plan.work_data = s->work.data();
		}
		if (ggml_graph_compute(gf, &plan) != GGML_STATUS_SUCCESS) {
			s->err = 2;
			ggml_free(meta);
			ggml_free(g);
			return false;
		}
	}
	ggml_free(meta);
	ggml_free(g);
	return true;
}

bool molly_eval_cb(ggml_tensor * t, bool ask, void * user_data) {
	auto * s = static_cast<molly_lora *>(user_data);
	if (s == nullptr || s->spans.empty()) {
		return !ask;
	}
	if (ask) {
		return adapted(s, t);
	}
	return apply(s, t);
}

// Access to llama_context::gf_res_prev (private) by explicit instantiation,
// which may name private members ([temp.spec]/6 in C++17).
namespace {
template <typename Tag, typename Tag::type M> struct molly_rob {
	friend typename Tag::type molly_get(Tag) { return M; }
};
struct molly_gf_prev {
	using type = llm_graph_result_ptr llama_context::*;
	friend type molly_get(molly_gf_prev);
};
template struct molly_rob<molly_gf_prev, &llama_context::gf_res_prev>;
struct molly_sched {
	using type = ggml_backend_sched_ptr llama_context::*;
	friend type molly_get(molly_sched);
};
template struct molly_rob<molly_sched, &llama_context::sched>;
struct molly_cparams {
	using type = llama_cparams llama_context::*;
	friend type molly_get(molly_cparams);
};
template struct molly_rob<molly_cparams, &llama_context::cparams>;
} // namespace

void molly_graph_invalidate(llama_context * ctx) {
	// What llama_context itself does when a memory update resets the
	// scheduler: a reset result has default parameters, which never match.
	(ctx->*molly_get(molly_gf_prev{}))->reset();
}

int32_t molly_graph_reuses(llama_context * ctx) { return llama_perf_context(ctx).n_reused; }

size_t molly_adapter_bytes(llama_adapter_lora * a) {
	size_t n = 0;
	for (const auto & b : a->bufs) {
		n += ggml_backend_buffer_get_size(b.get());
	}
	return n;
}

// set_callback installs the eval callback only for decodes with per-token
// adapters: without it ggml computes each graph split in one go, exactly as
// for a context without the per-token path. It sets both the scheduler's
// callback and the context's parameter that llama.cpp installs again when
// it rebuilds a graph.
static void set_callback(molly_lora * s, bool on) {
	if (s->ctx == nullptr) {
		return;
	}
	llama_cparams & cp = s->ctx->*molly_get(molly_cparams{});
	cp.cb_eval = on ? molly_eval_cb : nullptr;
	cp.cb_eval_user_data = on ? s : nullptr;
	ggml_backend_sched_set_eval_callback((s->ctx->*molly_get(molly_sched{})).get(), cp.cb_eval, cp.cb_eval_user_data);
}
