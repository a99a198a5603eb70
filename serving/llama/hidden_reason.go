package llama

/*
#include "llama.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// HiddenContext reads the base model's last hidden state (the output of the
// final norm, what the output projection turns into logits) for token
// sequences: the features of the reasoning switcher's probe and of the
// chain verifier. It is a context of its own with embeddings on
// and no pooling, two sequences on a unified KV cache, no adapters. Not safe
// for concurrent use.
type HiddenContext struct {
	p     *C.struct_llama_context
	mem   C.llama_memory_t
	nEmbd int
	nCtx  int
	b     *Batch
}

// NewHiddenContext creates a hidden-state context on m holding nCtx tokens
// (a prefix and one continuation together), decoding at most nBatch tokens
// per call, on threads CPU threads. Errors: llama.cpp cannot allocate it.
func NewHiddenContext(m *Model, nCtx, nBatch, threads int) (*HiddenContext, error) {
	Init()
	cp := C.llama_context_default_params()
	cp.n_ctx = C.uint32_t(nCtx)
	cp.n_batch = C.uint32_t(nBatch)
	cp.n_ubatch = C.uint32_t(nBatch)
	cp.n_seq_max = 2
	cp.kv_unified = true
	cp.embeddings = true
	cp.pooling_type = C.LLAMA_POOLING_TYPE_NONE
	cp.n_threads = C.int32_t(max(threads, 1))
	cp.n_threads_batch = cp.n_threads
	cp.no_perf = true
	c := C.llama_init_from_model(m.p, cp)
	if c == nil {
		return nil, errors.New("creating the hidden-state context failed (set MOLLY_LLAMA_LOG=1 for details)")
	}
	return &HiddenContext{p: c, mem: C.llama_get_memory(c), nEmbd: m.NEmbd(), nCtx: int(C.llama_n_ctx(c)), b: NewBatch(nBatch)}, nil
}

// Close frees the context.
func (h *HiddenContext) Close() {
	if h.p != nil {
		C.llama_free(h.p)
		h.p = nil
		h.b.Free()
	}
}

// ErrHiddenTooLong is returned for a prefix and continuation longer than
// the hidden-state context.
var ErrHiddenTooLong = errors.New("sequence longer than the hidden-state context")

// decode feeds toks at positions from pos on seq, in batches; each token's
// state is passed to each (nil: only the last token's state is output).
func (h *HiddenContext) decode(toks []int32, pos, seq int, each func(int, []float32)) ([]float32, error) {
	var last []float32
	for i := 0; i < len(toks); {
		h.b.Clear()
		for ; i < len(toks) && h.b.Len() < h.b.Cap(); i++ {
			h.b.Add(toks[i], pos+i, seq, each != nil || i == len(toks)-1)
		}
		if r := C.llama_decode(h.p, h.b.b); r != 0 {
			return nil, fmt.Errorf("hidden-state decode failed with code %d", int(r))
		}
		for j := range h.b.Len() {
			if each == nil && j != h.b.Len()-1 {
				continue
			}
			p := C.llama_get_embeddings_ith(h.p, C.int32_t(j))
			if p == nil {
				return nil, errors.New("llama.cpp returned no hidden state")
			}
			v := unsafe.Slice((*float32)(unsafe.Pointer(p)), h.nEmbd)
			if each != nil {
				each(i-h.b.Len()+j, v)
			}
			last = append(last[:0], v...)
		}
	}
	return last, nil
}

// LastStates returns, for each continuation, the hidden state at the last
// token of prefix followed by that continuation (an empty continuation:
// the prefix's last token). The prefix is decoded once and its KV shared
// by the continuations (llama_memory_seq_cp). Each state has NEmbd floats.
// Errors: empty prefix, ErrHiddenTooLong, llama.cpp failures.
func (h *HiddenContext) LastStates(prefix []int32, conts [][]int32) ([][]float32, error) {
	if len(prefix) == 0 {
		return nil, errors.New("empty prefix")
	}
	defer C.llama_memory_clear(h.mem, true)
	C.llama_memory_clear(h.mem, true)
	for _, c := range conts {
		if len(prefix)+len(c) > h.nCtx {
			return nil, fmt.Errorf("%w: %d tokens, the context holds %d", ErrHiddenTooLong, len(prefix)+len(c), h.nCtx)
		}
	}
	pl, err := h.decode(prefix, 0, 0, nil)
	if err != nil {
		return nil, err
	}
	out := make([][]float32, len(conts))
	for i, c := range conts {
		if len(c) == 0 {
			out[i] = append([]float32(nil), pl...)
			continue
		}
		C.llama_memory_seq_rm(h.mem, 1, 0, -1)
		C.llama_memory_seq_cp(h.mem, 0, 1, 0, -1)
		v, err := h.decode(c, len(prefix), 1, nil)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// MeanState returns the mean hidden state over the tokens of toks (NEmbd
// floats): the pooled representation of a prompt. Errors: empty toks,
// ErrHiddenTooLong, llama.cpp failures.
func (h *HiddenContext) MeanState(toks []int32) ([]float32, error) {
	if len(toks) == 0 {
		return nil, errors.New("empty sequence")
	}
	if len(toks) > h.nCtx {
		return nil, fmt.Errorf("%w: %d tokens, the context holds %d", ErrHiddenTooLong, len(toks), h.nCtx)
	}
	defer C.llama_memory_clear(h.mem, true)
	C.llama_memory_clear(h.mem, true)
	sum := make([]float64, h.nEmbd)
	if _, err := h.decode(toks, 0, 0, func(_ int, v []float32) {
		for k, x := range v {
			sum[k] += float64(x)
		}
	}); err != nil {
		return nil, err
	}
	out := make([]float32, h.nEmbd)
	for k := range out {
		out[k] = float32(sum[k] / float64(len(toks)))
	}
	return out, nil
}
