// Package llama is Molly's small cgo binding to llama.cpp, as vendored by the
// Go module github.com/ollama/ollama v0.17.4 (docs/architecture.md). It is the only
// package with cgo: its exported API has no C types, and every C allocation is
// paired with a Close/Free.
//
// Build: CGO_CPPFLAGS must name $(go list -m -f '{{.Dir}}'
// github.com/ollama/ollama)/llama/llama.cpp/include and
// .../ml/backend/ggml/ggml/include; set CGO_CFLAGS/CGO_CXXFLAGS (e.g.
// "-O3 -march=native") or ggml runs without SIMD. The CPU backend is compiled
// statically and registered by ggml-backend-reg.cpp (GGML_USE_CPU), so no
// dynamic backend loading is needed.
//
// Known defect guarded here: that llama.cpp version reuses the previous
// compute graph when two decodes have the same shape, even if the LoRA
// adapters on the context changed in between, so the adapter change is
// silently ignored. Graph reuse stays on (a rebuild every step costs time);
// SetAdapters forces one rebuild when the set changes, and per-token adapters
// (Batch.AddAdapted) do not change the graph at all.
// TestAdapterSwitchBetweenSameShapeDecodes keeps both honest.
//
// Per-token adapters (lora.cpp): a Context made with TokenAdapters applies
// each token's own adapter inside one llama_decode: the base matrix products
// run once for all tokens and a ggml scheduler eval callback adds each span's
// low-rank delta with the operations llama.cpp's own adapter path uses.
//
// Objects are not safe for concurrent use; the engine drives one Context from
// one goroutine.
package llama

/*
#cgo CXXFLAGS: -std=c++17
#include <stdlib.h>
#include <stdio.h>
#include "llama.h"
#include "molly.h"

static int molly_log_verbose = 0;
static enum ggml_log_level molly_log_last = GGML_LOG_LEVEL_NONE;

static void molly_log(enum ggml_log_level level, const char * text, void * ud) {
	(void) ud;
	if (level != GGML_LOG_LEVEL_CONT) {
		molly_log_last = level;
	}
	if (molly_log_verbose || molly_log_last == GGML_LOG_LEVEL_ERROR) {
		fputs(text, stderr);
	}
}

static void molly_init(int verbose) {
	molly_log_verbose = verbose;
	llama_log_set(molly_log, NULL);
	llama_backend_init();
}

static int32_t molly_batch_add(struct llama_batch * b, llama_token tok, llama_pos pos, llama_seq_id seq, int8_t logits) {
	int32_t i = b->n_tokens;
	b->token[i] = tok;
	b->pos[i] = pos;
	b->n_seq_id[i] = 1;
	b->seq_id[i][0] = seq;
	b->logits[i] = logits;
	b->n_tokens = i + 1;
	return i;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"

	_ "github.com/ollama/ollama/llama/llama.cpp/src"
	_ "github.com/ollama/ollama/ml/backend/ggml/ggml/src"
)

var initOnce sync.Once

// Init initialises the backend once per process: it routes llama.cpp logs to
// stderr (errors only, everything when MOLLY_LLAMA_LOG=1) and calls
// llama_backend_init.
// Every constructor calls it; calling it again is a no-op.
func Init() {
	initOnce.Do(func() {
		v := 0
		if os.Getenv("MOLLY_LLAMA_LOG") == "1" {
			v = 1
		}
		C.molly_init(C.int(v))
	})
}

// Model is a loaded base model (weights and vocabulary).
type Model struct {
	p     *C.struct_llama_model
	vocab *C.struct_llama_vocab
}

// LoadModel loads a GGUF model from path (memory mapped, CPU).
// Errors: the file is missing or llama.cpp cannot load it.
func LoadModel(path string) (*Model, error) {
	Init()
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("loading model: %w", err)
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	params := C.llama_model_default_params()
	params.n_gpu_layers = 0
	m := C.llama_model_load_from_file(cpath, params)
	if m == nil {
		return nil, fmt.Errorf("loading model %s: llama.cpp refused it (set MOLLY_LLAMA_LOG=1 for details)", path)
	}
	return &Model{p: m, vocab: C.llama_model_get_vocab(m)}, nil
}

// Close frees the model. Contexts and adapters made from it must be closed
// first.
func (m *Model) Close() {
	if m.p != nil {
		C.llama_model_free(m.p)
		m.p, m.vocab = nil, nil
	}
}

// NVocab is the number of tokens in the vocabulary (the logits length).
func (m *Model) NVocab() int { return int(C.llama_vocab_n_tokens(m.vocab)) }

// NEmbd is the model width.
func (m *Model) NEmbd() int { return int(C.llama_model_n_embd(m.p)) }

// NLayer is the number of transformer blocks.
func (m *Model) NLayer() int { return int(C.llama_model_n_layer(m.p)) }

// NCtxTrain is the training context length, in tokens.
func (m *Model) NCtxTrain() int { return int(C.llama_model_n_ctx_train(m.p)) }

// Size is the total size of the weights, in bytes.
func (m *Model) Size() uint64 { return uint64(C.llama_model_size(m.p)) }

// NParams is the number of parameters.
func (m *Model) NParams() uint64 { return uint64(C.llama_model_n_params(m.p)) }

// Desc is llama.cpp's one-line description (architecture, size, type).
func (m *Model) Desc() string {
	buf := make([]byte, 256)
	n := C.llama_model_desc(m.p, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	if n < 0 {
		return ""
	}
	return string(buf[:min(int(n), len(buf)-1)])
}

// Meta returns a scalar metadata value as a string, and whether it exists.
func (m *Model) Meta(key string) (string, bool) {
	ckey := C.CString(key)
	defer C.free(unsafe.Pointer(ckey))
	buf := make([]byte, 4096)
	n := C.llama_model_meta_val_str(m.p, ckey, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	if n < 0 {
		return "", false
	}
	return string(buf[:min(int(n), len(buf)-1)]), true
}

// ChatTemplate is the model's default chat template (tokenizer.chat_template),
// or "" when it has none.
func (m *Model) ChatTemplate() string {
	p := C.llama_model_chat_template(m.p, nil)
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// Tokenize converts text to token ids. addSpecial adds BOS (and EOS) as the
// model asks; parseSpecial matches control tokens such as <|im_start|>.
// Errors: llama.cpp reports a failure.
func (m *Model) Tokenize(text string, addSpecial, parseSpecial bool) ([]int32, error) {
	if len(text) == 0 && !addSpecial {
		return nil, nil
	}
	ctext := C.CString(text)
	defer C.free(unsafe.Pointer(ctext))
	n := len(text) + 8
	for range 2 {
		out := make([]int32, n)
		r := C.llama_tokenize(m.vocab, ctext, C.int32_t(len(text)), (*C.llama_token)(unsafe.Pointer(&out[0])), C.int32_t(n), C.bool(addSpecial), C.bool(parseSpecial))
		if r >= 0 {
			return out[:r], nil
		}
		if r == C.INT32_MIN {
			break
		}
		n = int(-r)
	}
	return nil, errors.New("tokenize failed")
}

// TokenPiece is the text bytes of one token (control tokens render as
// nothing; byte tokens as their byte). Pieces may split UTF-8 characters.
func (m *Model) TokenPiece(tok int32) []byte {
	buf := make([]byte, 64)
	for range 2 {
		n := C.llama_token_to_piece(m.vocab, C.llama_token(tok), (*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(len(buf)), 0, C.bool(false))
		if n >= 0 {
			return buf[:n]
		}
		buf = make([]byte, -n)
	}
	return nil
}

// TokenText is the vocabulary's text of tok as stored in the model
// (llama_vocab_get_text): control tokens keep their text, byte tokens read
// like "<0x0A>", and SentencePiece spaces stay "▁".
func (m *Model) TokenText(tok int32) string {
	return C.GoString(C.llama_vocab_get_text(m.vocab, C.llama_token(tok)))
}

// IsEOG reports whether tok ends generation (EOS, EOT, <|im_end|>, ...).
func (m *Model) IsEOG(tok int32) bool { return bool(C.llama_vocab_is_eog(m.vocab, C.llama_token(tok))) }

// BOS and EOS are the begin/end of sequence token ids (-1 if none).
func (m *Model) BOS() int32 { return int32(C.llama_vocab_bos(m.vocab)) }
func (m *Model) EOS() int32 { return int32(C.llama_vocab_eos(m.vocab)) }

// ChatMessage is one message given to ApplyChatTemplate.
type ChatMessage struct {
	Role    string
	Content string
}

// ApplyChatTemplate formats messages with tmpl, a template llama.cpp
// recognises (its built-in list: chatml, llama2, llama3, ...; a Jinja
// template is matched by heuristics, not executed); addAssistant appends the
// assistant turn's opening. Errors: the template is not recognised.
func ApplyChatTemplate(tmpl string, msgs []ChatMessage, addAssistant bool) (string, error) {
	ctmpl := C.CString(tmpl)
	defer C.free(unsafe.Pointer(ctmpl))
	cmsgs := make([]C.struct_llama_chat_message, len(msgs))
	total := 0
	var frees []unsafe.Pointer
	defer func() {
		for _, p := range frees {
			C.free(p)
		}
	}()
	for i, msg := range msgs {
		r, c := C.CString(msg.Role), C.CString(msg.Content)
		frees = append(frees, unsafe.Pointer(r), unsafe.Pointer(c))
		cmsgs[i] = C.struct_llama_chat_message{role: r, content: c}
		total += len(msg.Role) + len(msg.Content)
	}
	// C memory for the message array: cgo forbids passing Go memory that
	// holds Go pointers, and these are C pointers in Go memory, which is
	// allowed; still allocate in C to keep the rule simple.
	var arr *C.struct_llama_chat_message
	if len(msgs) > 0 {
		sz := C.size_t(len(msgs)) * C.size_t(unsafe.Sizeof(cmsgs[0]))
		arr = (*C.struct_llama_chat_message)(C.malloc(sz))
		frees = append(frees, unsafe.Pointer(arr))
		copy(unsafe.Slice(arr, len(msgs)), cmsgs)
	}
	n := 2*total + 256
	for range 2 {
		buf := (*C.char)(C.malloc(C.size_t(n)))
		r := C.llama_chat_apply_template(ctmpl, arr, C.size_t(len(msgs)), C.bool(addAssistant), buf, C.int32_t(n))
		if r < 0 {
			C.free(unsafe.Pointer(buf))
			return "", fmt.Errorf("chat template not supported by llama.cpp")
		}
		if int(r) <= n {
			s := C.GoStringN(buf, r)
			C.free(unsafe.Pointer(buf))
			return s, nil
		}
		C.free(unsafe.Pointer(buf))
		n = int(r)
	}
	return "", errors.New("chat template output changed size")
}

// Quantize writes a copy of the GGUF model in to out with weights converted
// to ftype: "q8_0", "q4_0", "q4_k_m", "q4_k_s" or "f16". Errors: unknown
// ftype, llama.cpp failure (a missing or unreadable file, one that is not a
// GGUF model, quantized weights: serving.CheckQuantizable tells these apart
// before the call).
func Quantize(in, out, ftype string) error {
	Init()
	params := C.llama_model_quantize_default_params()
	switch ftype = strings.ToLower(ftype); ftype {
	case "q8_0":
		params.ftype = C.LLAMA_FTYPE_MOSTLY_Q8_0
	case "q4_0":
		params.ftype = C.LLAMA_FTYPE_MOSTLY_Q4_0
	case "q4_k_m", "q4_k":
		params.ftype = C.LLAMA_FTYPE_MOSTLY_Q4_K_M
	case "q4_k_s":
		params.ftype = C.LLAMA_FTYPE_MOSTLY_Q4_K_S
	case "f16":
		params.ftype = C.LLAMA_FTYPE_MOSTLY_F16
	default:
		return fmt.Errorf("quantize: unknown type %q (want q8_0, q4_0, q4_k_m, q4_k_s or f16)", ftype)
	}
	cin, cout := C.CString(in), C.CString(out)
	defer C.free(unsafe.Pointer(cin))
	defer C.free(unsafe.Pointer(cout))
	if r := C.llama_model_quantize(cin, cout, &params); r != 0 {
		return fmt.Errorf("quantize %s to %s: llama_model_quantize failed (status %d; llama.cpp's error log says why)", in, ftype, r)
	}
	return nil
}

// Adapter is a LoRA adapter loaded against one Model (its tensors resident).
type Adapter struct {
	p     *C.struct_llama_adapter_lora
	bytes int64
}

// LoadAdapter loads a LoRA adapter GGUF from path for model m.
// Errors: llama.cpp refuses it (wrong architecture, a tensor missing from the
// base model, wrong shapes, not an adapter).
func LoadAdapter(m *Model, path string) (*Adapter, error) {
	Init()
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	a := C.llama_adapter_lora_init(m.p, cpath)
	if a == nil {
		return nil, fmt.Errorf("loading adapter %s: llama.cpp refused it (set MOLLY_LLAMA_LOG=1 for details)", path)
	}
	return &Adapter{p: a, bytes: int64(C.molly_adapter_bytes(a))}, nil
}

// Bytes is the size of the adapter's resident tensors, in bytes.
func (a *Adapter) Bytes() int64 { return a.bytes }

// Close frees the adapter. It must not be set on any context or be in a
// batch that will be decoded.
func (a *Adapter) Close() {
	if a.p != nil {
		C.llama_adapter_lora_free(a.p)
		a.p = nil
	}
}

// ContextParams configure a Context.
type ContextParams struct {
	NCtx    int  // total KV cells, tokens (split evenly across sequences unless Unified)
	NBatch  int  // most tokens per Decode call
	NUBatch int  // physical micro-batch, tokens (0: NBatch)
	NSeqMax int  // number of sequences (parallel streams)
	Threads int  // CPU threads (0: llama.cpp default)
	Unified bool // one KV buffer shared by all sequences
	// TokenAdapters installs the per-token adapter path (Batch.AddAdapted).
	// It needs every Decode to be one micro-batch in batch order: Unified
	// (or NSeqMax 1) and NUBatch 0.
	TokenAdapters bool
	// ExactTokenAdapters computes every per-token delta with ggml's
	// operations, bitwise what llama.cpp's context-level path computes for a
	// run of the same shape; otherwise F32 adapters use Molly's kernel,
	// which sums in another order and is several times faster for runs of a
	// few tokens.
	ExactTokenAdapters bool
	// TypeK and TypeV are the KV cache types: "" or "f16" (default),
	// "q8_0", "q4_0" (quant_reason.go; a quantized V turns flash attention
	// on).
	TypeK, TypeV string
}

// Context holds the KV cache for NSeqMax sequences and the adapters applied to
// the next Decode.
type Context struct {
	p       *C.struct_llama_context
	mem     C.llama_memory_t
	nVocab  int
	lora    *C.molly_lora
	tokenOK bool // per-token adapters can be decoded
	set     []*Adapter
	scales  []float32
	spans   []C.molly_span
}

// NewContext creates a context on m with a persistent thread pool of Threads
// workers. Errors: llama.cpp cannot allocate it.
func NewContext(m *Model, p ContextParams) (*Context, error) {
	Init()
	cp := C.llama_context_default_params()
	cp.n_ctx = C.uint32_t(p.NCtx)
	cp.n_batch = C.uint32_t(p.NBatch)
	cp.n_ubatch = C.uint32_t(p.NUBatch)
	if p.NUBatch == 0 {
		cp.n_ubatch = C.uint32_t(p.NBatch)
	}
	cp.n_seq_max = C.uint32_t(max(p.NSeqMax, 1))
	threads := p.Threads
	if threads <= 0 {
		threads = int(cp.n_threads)
	}
	cp.n_threads = C.int32_t(threads)
	cp.n_threads_batch = C.int32_t(threads)
	cp.kv_unified = C.bool(p.Unified)
	cp.no_perf = C.bool(true)
	if err := applyKVTypes(&cp, m, p); err != nil {
		return nil, err
	}
	lora := C.molly_lora_new(C.int32_t(threads))
	if p.TokenAdapters {
		cp.cb_eval = C.ggml_backend_sched_eval_callback(C.molly_eval_cb)
		cp.cb_eval_user_data = unsafe.Pointer(lora)
	}
	c := C.llama_init_from_model(m.p, cp)
	if c == nil {
		C.molly_lora_free(lora)
		return nil, errors.New("creating llama context failed (set MOLLY_LLAMA_LOG=1 for details)")
	}
	C.molly_lora_attach(lora, c)
	C.molly_lora_exact(lora, C.bool(p.ExactTokenAdapters))
	return &Context{
		p: c, mem: C.llama_get_memory(c), nVocab: m.NVocab(), lora: lora,
		tokenOK: p.TokenAdapters && (p.Unified || p.NSeqMax <= 1) && (p.NUBatch == 0 || p.NUBatch >= p.NBatch),
	}, nil
}

// Close frees the context, its KV cache and its thread pool.
func (c *Context) Close() {
	if c.p != nil {
		C.llama_free(c.p)
		c.p = nil
		C.molly_lora_free(c.lora)
		c.lora = nil
	}
}

// NCtx is the total number of KV cells; NCtxSeq the cells per sequence.
func (c *Context) NCtx() int    { return int(C.llama_n_ctx(c.p)) }
func (c *Context) NCtxSeq() int { return int(C.llama_n_ctx_seq(c.p)) }

// NBatch is the most tokens one Decode accepts; NSeqMax the sequence count.
func (c *Context) NBatch() int  { return int(C.llama_n_batch(c.p)) }
func (c *Context) NSeqMax() int { return int(C.llama_n_seq_max(c.p)) }

// SetAdapters replaces the context-level adapters applied to every token of
// the next Decode with as, each scaled by the matching entry of scales (1
// when scales is shorter); an empty set means the base model. When the set
// changes, the next Decode builds its graph afresh (the graph-reuse defect in
// the package comment).
func (c *Context) SetAdapters(as []*Adapter, scales []float32) {
	sc := make([]float32, len(as))
	for i := range sc {
		sc[i] = 1
		if i < len(scales) {
			sc[i] = scales[i]
		}
	}
	if len(as) == len(c.set) {
		same := true
		for i := range as {
			same = same && as[i] == c.set[i] && sc[i] == c.scales[i]
		}
		if same {
			return
		}
	}
	C.llama_clear_adapter_lora(c.p)
	for i, a := range as {
		C.llama_set_adapter_lora(c.p, a.p, C.float(sc[i]))
	}
	C.molly_graph_invalidate(c.p)
	c.set, c.scales = append(c.set[:0], as...), sc
}

// Pause puts the context's worker threads to sleep until the next Decode.
// ggml's workers spin for a while after each decode to start the next one
// sooner; an idle engine (or a benchmark between runs) should not burn cores.
func (c *Context) Pause() { C.molly_lora_pause(c.lora) }

// GraphReuses is how many decodes so far reused the previous compute graph.
func (c *Context) GraphReuses() int { return int(C.molly_graph_reuses(c.p)) }

// ErrNoKVSlot is returned by Decode when the KV cache has no room for the
// batch.
var ErrNoKVSlot = errors.New("llama_decode: no KV slot for the batch")

// ErrTokenAdapters is returned by Decode for a batch with per-token adapters
// on a context that cannot decode them (see ContextParams.TokenAdapters).
var ErrTokenAdapters = errors.New("per-token adapters need a context made with TokenAdapters, Unified and NUBatch 0")

// Decode runs the model on the batch, applying each token's adapter (see
// Batch.AddAdapted) on top of the context-level set. Errors: ErrNoKVSlot,
// ErrTokenAdapters, or another llama.cpp failure code.
func (c *Context) Decode(b *Batch) error {
	n := int(b.b.n_tokens)
	if n == 0 {
		return nil
	}
	c.spans = c.spans[:0]
	if b.adapted > 0 {
		if !c.tokenOK {
			return ErrTokenAdapters
		}
		logits := unsafe.Slice(b.b.logits, n)
		outs := 0
		for i := 0; i < n; {
			j := i
			o := outs
			for j < n && b.ad[j] == b.ad[i] && b.sc[j] == b.sc[i] {
				if logits[j] != 0 {
					outs++
				}
				j++
			}
			if b.ad[i] != nil {
				c.spans = append(c.spans, C.molly_span{
					tok0: C.int32_t(i), ntok: C.int32_t(j - i), out0: C.int32_t(o), nout: C.int32_t(outs - o),
					adapter: b.ad[i].p, scale: C.float(b.sc[i]),
				})
			}
			i = j
		}
		C.molly_lora_set(c.lora, C.int32_t(n), C.int32_t(outs), &c.spans[0], C.int32_t(len(c.spans)))
	} else {
		C.molly_lora_set(c.lora, C.int32_t(n), 0, nil, 0)
	}
	r := C.llama_decode(c.p, b.b)
	if e := C.molly_lora_error(c.lora); e != 0 && r == 0 {
		return fmt.Errorf("llama_decode: per-token adapter path failed (code %d)", int(e))
	}
	switch {
	case r == 0:
		return nil
	case r == 1:
		return ErrNoKVSlot
	default:
		return fmt.Errorf("llama_decode failed with code %d", int(r))
	}
}

// AdaptedProducts is how many matrix products the last Decode adapted per
// token (0 when no token had an adapter).
func (c *Context) AdaptedProducts() int { return int(C.molly_lora_targets(c.lora)) }

// KernelSpans is how many (product, run) deltas of the last Decode Molly's
// F32 kernel computed (the rest went through ggml operations).
func (c *Context) KernelSpans() int { return int(C.molly_lora_kernel_spans(c.lora)) }

// Logits copies into dst (grown to NVocab) the logits of the token at batch
// index i, which must have been added with logits=true, and returns it.
func (c *Context) Logits(i int, dst []float32) []float32 {
	p := C.llama_get_logits_ith(c.p, C.int32_t(i))
	if p == nil {
		return nil
	}
	if cap(dst) < c.nVocab {
		dst = make([]float32, c.nVocab)
	}
	dst = dst[:c.nVocab]
	copy(dst, unsafe.Slice((*float32)(unsafe.Pointer(p)), c.nVocab))
	return dst
}

// LogitsView is the logits of the token at batch index i without copying;
// it is valid until the next Decode. nil if i has no logits.
func (c *Context) LogitsView(i int) []float32 {
	p := C.llama_get_logits_ith(c.p, C.int32_t(i))
	if p == nil {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(p)), c.nVocab)
}

// SeqRm removes the cells of sequence seq at positions [p0, p1) (p1 < 0: to
// the end). Removing a whole sequence (p0=0, p1=-1) always succeeds.
func (c *Context) SeqRm(seq, p0, p1 int) bool {
	return bool(C.llama_memory_seq_rm(c.mem, C.llama_seq_id(seq), C.llama_pos(p0), C.llama_pos(p1)))
}

// SeqCp makes dst share (unified KV) or copy (per-sequence KV) the cells of
// src at positions [p0, p1) (p1 < 0: to the end). With per-sequence KV only
// whole-sequence copies are supported.
func (c *Context) SeqCp(src, dst, p0, p1 int) {
	C.llama_memory_seq_cp(c.mem, C.llama_seq_id(src), C.llama_seq_id(dst), C.llama_pos(p0), C.llama_pos(p1))
}

// SeqPosMax is the largest position stored for seq, or -1 if it is empty.
func (c *Context) SeqPosMax(seq int) int {
	return int(C.llama_memory_seq_pos_max(c.mem, C.llama_seq_id(seq)))
}

// Clear empties the KV cache of every sequence.
func (c *Context) Clear() { C.llama_memory_clear(c.mem, C.bool(true)) }

// Batch is a reusable input batch of up to its capacity tokens, each for one
// sequence and optionally with its own adapter.
type Batch struct {
	b       C.struct_llama_batch
	cap     int
	ad      []*Adapter
	sc      []float32
	adapted int // tokens with an adapter
}

// NewBatch allocates a batch of capacity tokens. Free it with Free.
func NewBatch(capacity int) *Batch {
	return &Batch{b: C.llama_batch_init(C.int32_t(capacity), 0, 1), cap: capacity,
		ad: make([]*Adapter, 0, capacity), sc: make([]float32, 0, capacity)}
}

// Add appends token tok at position pos of sequence seq; logits asks for its
// output logits. It returns the token's batch index (for Logits), or -1 if the
// batch is full.
func (b *Batch) Add(tok int32, pos, seq int, logits bool) int {
	return b.AddAdapted(tok, pos, seq, logits, nil, 0)
}

// AddAdapted is Add with the token's own adapter a at scale (nil: the base
// model, plus any context-level adapters). Tokens that share an adapter
// should be added consecutively: each run of them costs two small matrix
// products per adapted weight.
func (b *Batch) AddAdapted(tok int32, pos, seq int, logits bool, a *Adapter, scale float32) int {
	if int(b.b.n_tokens) >= b.cap {
		return -1
	}
	l := C.int8_t(0)
	if logits {
		l = 1
	}
	if a != nil {
		b.adapted++
	}
	b.ad = append(b.ad, a)
	b.sc = append(b.sc, scale)
	return int(C.molly_batch_add(&b.b, C.llama_token(tok), C.llama_pos(pos), C.llama_seq_id(seq), l))
}

// Len is the number of tokens in the batch; Cap its capacity.
func (b *Batch) Len() int { return int(b.b.n_tokens) }
func (b *Batch) Cap() int { return b.cap }

// Clear empties the batch for reuse.
func (b *Batch) Clear() {
	b.b.n_tokens = 0
	clear(b.ad)
	b.ad, b.sc, b.adapted = b.ad[:0], b.sc[:0], 0
}

// Free releases the batch's C memory.
func (b *Batch) Free() {
	if b.cap > 0 {
		C.llama_batch_free(b.b)
		b.cap = 0
	}
}
