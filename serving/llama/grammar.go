package llama

/*
#include <math.h>
#include <stdlib.h>
#include "llama.h"

// molly_grammar_mask copies logits into out with every token the grammar
// rejects at -INFINITY; buf holds n token_data entries.
static void molly_grammar_mask(struct llama_sampler * g, const float * logits, float * out, llama_token_data * buf, int32_t n) {
	for (int32_t i = 0; i < n; i++) {
		buf[i].id = i;
		buf[i].logit = logits[i];
		buf[i].p = 0.0f;
	}
	llama_token_data_array arr = { buf, (size_t) n, -1, false };
	llama_sampler_apply(g, &arr);
	for (size_t i = 0; i < arr.size; i++) {
		out[arr.data[i].id] = arr.data[i].logit;
	}
}
*/
import "C"

import (
	"errors"
	"unsafe"
)

// Grammar is llama.cpp's grammar sampler (llama_sampler_init_grammar) over a
// model's vocabulary: it constrains sampling to the strings of a GBNF
// grammar (llama.cpp grammars/README.md), start rule "root". Not safe for
// concurrent use; Close frees it.
type Grammar struct {
	p   *C.struct_llama_sampler
	buf *C.llama_token_data
	n   int
}

// ErrGrammar is returned when llama.cpp cannot parse a GBNF grammar.
var ErrGrammar = errors.New("llama.cpp could not parse the grammar")

// NewGrammar parses gbnf (start rule "root") for m's vocabulary.
// Errors: ErrGrammar (the parser's message goes to llama.cpp's log).
func NewGrammar(m *Model, gbnf string) (*Grammar, error) {
	cs := C.CString(gbnf)
	defer C.free(unsafe.Pointer(cs))
	root := C.CString("root")
	defer C.free(unsafe.Pointer(root))
	p := C.llama_sampler_init_grammar(m.vocab, cs, root)
	if p == nil {
		return nil, ErrGrammar
	}
	n := m.NVocab()
	buf := (*C.llama_token_data)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.llama_token_data{}))))
	return &Grammar{p: p, buf: buf, n: n}, nil
}

// Mask writes into out (length NVocab) the logits with every token the
// grammar does not allow next set to -Inf; logits is not modified. End-of-
// generation tokens are allowed only where the grammar may end.
func (g *Grammar) Mask(logits, out []float32) {
	if len(logits) < g.n || len(out) < g.n {
		panic("llama: Grammar.Mask: logits shorter than the vocabulary")
	}
	C.molly_grammar_mask(g.p, (*C.float)(unsafe.Pointer(&logits[0])), (*C.float)(unsafe.Pointer(&out[0])), g.buf, C.int32_t(g.n))
}

// Accept advances the grammar over tok, which must be one Mask allowed.
func (g *Grammar) Accept(tok int32) { C.llama_sampler_accept(g.p, C.llama_token(tok)) }

// Reset returns the grammar to its start, as NewGrammar made it.
func (g *Grammar) Reset() { C.llama_sampler_reset(g.p) }

// Close frees the grammar.
func (g *Grammar) Close() {
	if g.p != nil {
		C.llama_sampler_free(g.p)
		C.free(unsafe.Pointer(g.buf))
		g.p, g.buf = nil, nil
	}
}
