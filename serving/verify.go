package serving

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/serving/llama"
)

// Remote verification for speculative decoding (Leviathan et al., ICML 2023):
// another engine drafts tokens and this one, the target, checks them in one
// llama_decode. A single-sequence context of ContextTokens cells (outside
// Config.MemoryBytes), created on first use, keeps the KV of the last
// verified tokens so that a drafting session extending its prefix only
// decodes the new tokens. Calls are serialised.
type verifyState struct {
	once   sync.Once
	mu     sync.Mutex
	err    error
	ctx    *llama.Context
	batch  *llama.Batch
	cached []int32 // tokens whose KV the context holds, from position 0
}

func (v *verifyState) close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.ctx != nil {
		v.batch.Free()
		v.ctx.Close()
		v.ctx = nil
	}
}

// Verify checks draft tokens proposed after prefix against the base model's
// greedy choices: accepted is the length of the longest prefix of draft
// equal to them, next the base model's greedy token after prefix and the
// accepted tokens (so a drafter commits accepted+1 tokens). Near ties are
// recomputed by a one-token decode, as on the speculative path (tieMargin).
// Errors: an empty prefix, a token outside the vocabulary, ErrContextLength
// when prefix and draft exceed ContextTokens, ErrClosed, ctx.Err(),
// llama.cpp failures.
func (e *Engine) Verify(ctx context.Context, prefix, draft []int32) (accepted int, next int32, err error) {
	if len(prefix) == 0 {
		return 0, 0, badRequest("prefix", "prefix must hold at least one token")
	}
	nv := int32(e.model.NVocab())
	for _, t := range slices.Concat(prefix, draft) {
		if t < 0 || t >= nv {
			return 0, 0, badRequest("prefix", "token %d is outside the vocabulary of %d tokens", t, nv)
		}
	}
	if len(prefix)+len(draft) >= e.nCtxSeq {
		return 0, 0, fmt.Errorf("%w: %d tokens, the context holds %d per sequence", ErrContextLength, len(prefix)+len(draft), e.nCtxSeq)
	}
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return 0, 0, ErrClosed
	}
	v := &e.verify
	v.once.Do(func() {
		nb := max(e.cfg.NBatch, e.nCtxSeq)
		v.ctx, v.err = llama.NewContext(e.model, llama.ContextParams{NCtx: e.nCtxSeq, NBatch: nb, NSeqMax: 1, Threads: e.cfg.Threads, TypeK: e.cfg.KVCacheType, TypeV: e.cfg.KVCacheType})
		if v.err == nil {
			v.batch = llama.NewBatch(nb)
		}
	})
	if v.err != nil {
		return 0, 0, v.err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.ctx == nil {
		return 0, 0, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	// Keep the KV of the longest common prefix with the last call, short of
	// the last prefix token (decoded below with the draft).
	n := len(prefix) - 1
	keep := 0
	for keep < len(v.cached) && keep < n && v.cached[keep] == prefix[keep] {
		keep++
	}
	v.ctx.SeqRm(0, keep, -1)
	v.cached = append(v.cached[:keep], prefix[keep:n]...)
	if keep < n {
		v.batch.Clear()
		for i := keep; i < n; i++ {
			v.batch.Add(prefix[i], i, 0, false)
		}
		if err := v.ctx.Decode(v.batch); err != nil {
			v.cached = v.cached[:0]
			v.ctx.Clear()
			return 0, 0, err
		}
	}
	vd, err := verifyDraft(v.ctx, v.batch, n, prefix[n], draft)
	if err != nil {
		v.cached = v.cached[:0]
		v.ctx.Clear()
		return 0, 0, err
	}
	v.cached = append(append(v.cached, prefix[n]), draft[:vd.accepted]...)
	return vd.accepted, vd.next, nil
}

// verdict is verifyDraft's answer: how many proposals the target accepted,
// its next token after them, the near ties recomputed by one-token decodes,
// and whether a trusted target choice (not a near tie) rejected a proposal.
type verdict struct {
	accepted  int
	next      int32
	redecodes int
	mismatch  bool
}

// verifyDraft decodes last at position pos and the proposals rest after it
// in one batch of ctx (a single-sequence context holding [0, pos)) and
// compares rest with the target's greedy choices. A choice whose top two
// logits are within tieMargin is recomputed by a one-token decode, as plain
// greedy decoding computes it (ggml rounds a one-column product differently
// from a several-column one), and checking goes on after it when the
// proposal agrees. On return ctx holds [0, pos+1+accepted). Errors:
// llama.cpp failures (the KV is then undefined).
func verifyDraft(ctx *llama.Context, b *llama.Batch, pos int, last int32, rest []int32) (verdict, error) {
	var v verdict
	for {
		b.Clear()
		b.Add(last, pos, 0, true)
		for i, d := range rest {
			b.Add(d, pos+1+i, 0, true)
		}
		if err := ctx.Decode(b); err != nil {
			return v, err
		}
		i := 0
		for ; i <= len(rest); i++ {
			t, gap := argmaxGap(ctx.LogitsView(i))
			if gap < tieMargin {
				break
			}
			if i == len(rest) || rest[i] != t {
				ctx.SeqRm(0, pos+1+i, -1)
				v.accepted += i
				v.next = t
				v.mismatch = i < len(rest)
				return v, nil
			}
		}
		// A near tie after the token at pos+i: decode that token alone.
		tok := last
		if i > 0 {
			tok = rest[i-1]
		}
		ctx.SeqRm(0, pos+i, -1)
		b.Clear()
		b.Add(tok, pos+i, 0, true)
		if err := ctx.Decode(b); err != nil {
			return v, err
		}
		v.redecodes++
		v.next = argmax(ctx.LogitsView(0))
		v.accepted += i
		if i == len(rest) || rest[i] != v.next {
			return v, nil
		}
		// The proposal agrees with the recomputed choice: go on after it.
		v.accepted++
		last, pos, rest = rest[i], pos+i+1, rest[i+1:]
	}
}

// serveVerify is POST /molly/engine/verify: body {"prefix": [token ids],
// "draft": [token ids]}, answer {"accepted": n, "next": token id, "eog":
// whether next ends generation}; see Verify.
func (e *Engine) serveVerify(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 8<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", "reading body: "+err.Error())
		return
	}
	if !gjson.ValidBytes(body) {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", "body is not JSON")
		return
	}
	tokens := func(field string) ([]int32, error) {
		f := gjson.GetBytes(body, field)
		if !f.Exists() || f.Type == gjson.Null {
			return nil, nil
		}
		if !f.IsArray() {
			return nil, badRequest(field, "%s must be an array of token ids", field)
		}
		var out []int32
		for _, t := range f.Array() {
			if t.Type != gjson.Number || t.Num != float64(int32(t.Num)) {
				return nil, badRequest(field, "%s holds %s, not a token id", field, t.Raw)
			}
			out = append(out, int32(t.Num))
		}
		return out, nil
	}
	prefix, err := tokens("prefix")
	var draft []int32
	if err == nil {
		draft, err = tokens("draft")
	}
	var acc int
	var next int32
	if err == nil {
		acc, next, err = e.Verify(r.Context(), prefix, draft)
	}
	if err != nil {
		ae := classify(err)
		if ae.param == "messages" {
			ae.param = "prefix"
		}
		writeError(w, ae.status, ae.typ, ae.param, ae.code, ae.msg)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	out := `{"accepted":` + strconv.Itoa(acc) + `,"next":` + strconv.Itoa(int(next)) + `,"eog":` + strconv.FormatBool(e.model.IsEOG(next)) + "}\n"
	_, _ = io.WriteString(w, out)
}
