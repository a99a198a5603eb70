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

// Pooling is how an Embedder turns a sequence's per-token outputs into one
// vector (llama.cpp's llama_pooling_type).
type Pooling int

const (
	PoolingMean Pooling = C.LLAMA_POOLING_TYPE_MEAN // average over the tokens
	PoolingNone Pooling = C.LLAMA_POOLING_TYPE_NONE // one vector per token
)

// Embedder is a llama.cpp context in embeddings mode (one sequence of at
// most NCtx tokens per call, decoded in one micro-batch). Not safe for
// concurrent use; Close frees it.
type Embedder struct {
	p       *C.struct_llama_context
	mem     C.llama_memory_t
	b       *Batch
	nEmbd   int
	nCtx    int
	pooling Pooling
}

// NewEmbedder creates an embeddings context on m for inputs of at most nCtx
// tokens, with threads CPU threads (0: llama.cpp's default). Errors:
// llama.cpp cannot allocate it.
func NewEmbedder(m *Model, nCtx, threads int, pooling Pooling) (*Embedder, error) {
	Init()
	cp := C.llama_context_default_params()
	cp.n_ctx = C.uint32_t(nCtx)
	cp.n_batch = C.uint32_t(nCtx)
	cp.n_ubatch = C.uint32_t(nCtx)
	cp.n_seq_max = 1
	if threads > 0 {
		cp.n_threads = C.int32_t(threads)
		cp.n_threads_batch = C.int32_t(threads)
	}
	cp.embeddings = C.bool(true)
	cp.pooling_type = C.enum_llama_pooling_type(pooling)
	cp.no_perf = C.bool(true)
	c := C.llama_init_from_model(m.p, cp)
	if c == nil {
		return nil, errors.New("creating llama embeddings context failed (set MOLLY_LLAMA_LOG=1 for details)")
	}
	return &Embedder{p: c, mem: C.llama_get_memory(c), b: NewBatch(nCtx), nEmbd: m.NEmbd(), nCtx: nCtx, pooling: pooling}, nil
}

// NEmbd is the length of each vector; NCtx the most tokens per input.
func (e *Embedder) NEmbd() int { return e.nEmbd }
func (e *Embedder) NCtx() int  { return e.nCtx }

// Embed runs tokens (1..NCtx of them) through the model and returns the
// raw (not normalised) outputs: one vector for PoolingMean, one per token
// for PoolingNone, each NEmbd floats. Errors: an empty or too long input,
// llama.cpp failures.
func (e *Embedder) Embed(tokens []int32) ([][]float32, error) {
	if len(tokens) == 0 || len(tokens) > e.nCtx {
		return nil, fmt.Errorf("embeddings: %d tokens, want 1 to %d", len(tokens), e.nCtx)
	}
	C.llama_memory_clear(e.mem, C.bool(true))
	e.b.Clear()
	for i, t := range tokens {
		e.b.Add(t, i, 0, true)
	}
	if r := C.llama_decode(e.p, e.b.b); r != 0 {
		return nil, fmt.Errorf("embeddings: llama_decode failed with code %d", int(r))
	}
	if e.pooling != PoolingNone {
		p := C.llama_get_embeddings_seq(e.p, 0)
		if p == nil {
			return nil, errors.New("embeddings: llama.cpp returned no pooled embedding")
		}
		return [][]float32{append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(p)), e.nEmbd)...)}, nil
	}
	out := make([][]float32, len(tokens))
	for i := range tokens {
		p := C.llama_get_embeddings_ith(e.p, C.int32_t(i))
		if p == nil {
			return nil, fmt.Errorf("embeddings: no output for token %d", i)
		}
		out[i] = append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(p)), e.nEmbd)...)
	}
	return out, nil
}

// Close frees the context.
func (e *Embedder) Close() {
	if e.p != nil {
		C.llama_free(e.p)
		e.p = nil
		e.b.Free()
	}
}
