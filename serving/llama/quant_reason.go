package llama

/*
#include "llama.h"
*/
import "C"

import "fmt"

// KV cache types (ContextParams.TypeK/TypeV): "f16" (llama.cpp's default),
// "q8_0" and "q4_0" (ggml block quantizations: 32 values per block with
// one F16 scale, 34 and 18 bytes per block).
var kvTypes = map[string]struct {
	t          C.enum_ggml_type
	num, denom int64 // bytes per value = num/denom
}{
	"":     {C.GGML_TYPE_F16, 2, 1},
	"f16":  {C.GGML_TYPE_F16, 2, 1},
	"q8_0": {C.GGML_TYPE_Q8_0, 34, 32},
	"q4_0": {C.GGML_TYPE_Q4_0, 18, 32},
}

// KVTypeBytes returns the bytes per cached value of a KV cache type as the
// fraction num/denom. Errors: unknown type.
func KVTypeBytes(typ string) (num, denom int64, err error) {
	k, ok := kvTypes[typ]
	if !ok {
		return 0, 0, fmt.Errorf("unknown KV cache type %q (want f16, q8_0 or q4_0)", typ)
	}
	return k.num, k.denom, nil
}

// applyKVTypes sets the cache types of cp from p. A quantized V cache needs
// flash attention in llama.cpp (the non-flash path transposes V), so it is
// switched on; llama_init_from_model refuses a quantized V cache otherwise.
// A quantized type needs the model's head size to be a multiple of its
// block (32 values): ggml quantizes per head and asserts it (the process
// would abort), so a smaller head is an error here.
func applyKVTypes(cp *C.struct_llama_context_params, m *Model, p ContextParams) error {
	k, ok := kvTypes[p.TypeK]
	if !ok {
		return fmt.Errorf("unknown K cache type %q (want f16, q8_0 or q4_0)", p.TypeK)
	}
	v, ok := kvTypes[p.TypeV]
	if !ok {
		return fmt.Errorf("unknown V cache type %q (want f16, q8_0 or q4_0)", p.TypeV)
	}
	if k.t != C.GGML_TYPE_F16 || v.t != C.GGML_TYPE_F16 {
		head := m.NEmbd() / max(int(C.llama_model_n_head(m.p)), 1)
		if head%32 != 0 {
			return fmt.Errorf("a quantized KV cache (%s/%s) needs a head size that is a multiple of 32; this model's is %d", p.TypeK, p.TypeV, head)
		}
	}
	cp.type_k, cp.type_v = k.t, v.t
	if v.t != C.GGML_TYPE_F16 {
		cp.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_ENABLED
	}
	return nil
}

// SeqStateBytes is the size of sequence seq's state as llama.cpp would save
// it (llama_state_seq_get_size): its KV cells in the cache's types, the
// measured memory of one sequence.
func (c *Context) SeqStateBytes(seq int) int64 {
	return int64(C.llama_state_seq_get_size(c.p, C.llama_seq_id(seq)))
}
