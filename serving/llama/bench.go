package llama

/*
#include <stdlib.h>
#include "molly.h"
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"
)

// BenchSpec is one run of the llama.cpp baseline: NSeq sequences (ids
// 0..NSeq-1) on Prompt, each generating NGen tokens greedily, sequence s on
// Adapters[SeqAdapter[s]] (-1 or a nil SeqAdapter: the base model).
type BenchSpec struct {
	Prompt     []int32
	NSeq       int
	NGen       int
	Adapters   []*Adapter
	SeqAdapter []int
}

// BenchResult is what a baseline run measured.
type BenchResult struct {
	Prefill     time.Duration // all prompts (one llama_decode per adapter group)
	Decode      time.Duration // the NGen-1 generation steps
	Tokens      int           // generated tokens (NSeq*NGen)
	DecodeCalls int           // llama_decode calls in the generation steps
	Out         [][]int32     // per sequence, the greedy tokens
}

// BatchedBench runs spec on c with libllama alone, as llama.cpp's
// batched-bench example does (one llama_batch per step for all sequences of
// an adapter, llama_decode, argmax over the logits), grouping sequences by
// adapter because llama.cpp applies adapters per context. It clears c's KV
// cache before and after, and leaves the base model set. It is both the
// baseline of the benchmarks and an oracle for the engine's greedy outputs.
// Errors: a failed llama_decode, more sequences than c holds.
func BatchedBench(c *Context, spec BenchSpec) (BenchResult, error) {
	if spec.NSeq <= 0 || spec.NSeq > c.NSeqMax() || len(spec.Prompt) == 0 || spec.NGen <= 0 {
		return BenchResult{}, fmt.Errorf("bench: %d sequences (context holds %d), %d prompt tokens, %d to generate", spec.NSeq, c.NSeqMax(), len(spec.Prompt), spec.NGen)
	}
	n := C.size_t(unsafe.Sizeof(C.int32_t(0)))
	prompt := (*C.llama_token)(C.malloc(n * C.size_t(len(spec.Prompt))))
	defer C.free(unsafe.Pointer(prompt))
	copy(unsafe.Slice((*int32)(unsafe.Pointer(prompt)), len(spec.Prompt)), spec.Prompt)
	seqA := (*C.int32_t)(C.malloc(n * C.size_t(spec.NSeq)))
	defer C.free(unsafe.Pointer(seqA))
	sa := unsafe.Slice((*int32)(unsafe.Pointer(seqA)), spec.NSeq)
	for s := range sa {
		sa[s] = -1
		if s < len(spec.SeqAdapter) {
			sa[s] = int32(spec.SeqAdapter[s])
		}
	}
	var ads **C.struct_llama_adapter_lora
	if len(spec.Adapters) > 0 {
		ads = (**C.struct_llama_adapter_lora)(C.malloc(C.size_t(unsafe.Sizeof(uintptr(0))) * C.size_t(len(spec.Adapters))))
		defer C.free(unsafe.Pointer(ads))
		as := unsafe.Slice(ads, len(spec.Adapters))
		for i, a := range spec.Adapters {
			as[i] = a.p
		}
	}
	out := (*C.llama_token)(C.malloc(n * C.size_t(spec.NSeq*spec.NGen)))
	defer C.free(unsafe.Pointer(out))
	b := C.molly_bench{
		n_seq: C.int32_t(spec.NSeq), n_prompt: C.int32_t(len(spec.Prompt)), prompt: prompt, n_gen: C.int32_t(spec.NGen),
		n_adapters: C.int32_t(len(spec.Adapters)), adapters: ads, seq_adapter: seqA, out: out,
	}
	// The context-level set is changed behind SetAdapters' back.
	c.set, c.scales = nil, nil
	rc := C.molly_batched_bench(c.p, &b)
	c.Pause()
	if rc != 0 {
		return BenchResult{}, fmt.Errorf("bench: llama_decode failed with code %d", int(rc))
	}
	res := BenchResult{
		Prefill: time.Duration(float64(b.t_prefill_us) * 1e3), Decode: time.Duration(float64(b.t_decode_us) * 1e3),
		Tokens: int(b.n_decoded), DecodeCalls: int(b.n_decode_calls),
	}
	all := unsafe.Slice((*int32)(unsafe.Pointer(out)), spec.NSeq*spec.NGen)
	for s := range spec.NSeq {
		res.Out = append(res.Out, append([]int32(nil), all[s*spec.NGen:(s+1)*spec.NGen]...))
	}
	return res, nil
}
