package serving

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

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

	calls, proposed, accepted atomic.Int64 // VerifyStats

	infoOnce sync.Once
	info     VerifyInfo
}

// VerifyStats counts remote verification since the engine started: Calls
// answered (POST /molly/engine/verify and Engine.Verify), the draft tokens
// they Proposed and how many of those were Accepted.
type VerifyStats struct {
	Calls, Proposed, Accepted int64
}

// VerifyStats reports the remote verification counters.
func (e *Engine) VerifyStats() VerifyStats {
	v := &e.verify
	return VerifyStats{Calls: v.calls.Load(), Proposed: v.proposed.Load(), Accepted: v.accepted.Load()}
}

// VerifyInfo is what a drafting engine must share with this one for its
// drafts to be verified and its answers to equal this engine's own
// (GET /molly/engine/verify).
type VerifyInfo struct {
	// Model is the served base model name.
	Model string `json:"model"`
	// VocabSHA256 is the hex SHA-256 of the tokenizer: for every token id
	// in order, its text's length (4 bytes, little endian), the text
	// (llama_vocab_get_text) and one byte, 1 when the token ends
	// generation; then the ids (4 bytes each, little endian) that
	// tokenizing the empty string with special tokens gives (BOS/EOS as the
	// model adds them).
	VocabSHA256 string `json:"vocab_sha256"`
	// ChatTemplateSHA256 is the hex SHA-256 of the chat template the
	// engine renders messages with (the model's, or "chatml").
	ChatTemplateSHA256 string `json:"chat_template_sha256"`
	// ContextTokens is the most prompt plus completion tokens of one
	// request (Engine.ContextTokens); a greedy answer ends at it with
	// finish_reason "length".
	ContextTokens int `json:"context_tokens"`
	// Plain reports that a base-model chat request without reasoning or
	// n_chains fields is decoded as written: no reasoning switcher and no
	// default n_chains for the base (either would change the answer
	// drafting reproduces).
	Plain bool `json:"plain"`
}

// VerifyInfo describes this engine for drafters (computed once).
func (e *Engine) VerifyInfo() VerifyInfo {
	v := &e.verify
	v.infoOnce.Do(func() {
		h := sha256.New()
		var n [4]byte
		for t := range int32(e.model.NVocab()) {
			text := e.model.TokenText(t)
			binary.LittleEndian.PutUint32(n[:], uint32(len(text)))
			h.Write(n[:])
			h.Write([]byte(text))
			eog := byte(0)
			if e.model.IsEOG(t) {
				eog = 1
			}
			h.Write([]byte{eog})
		}
		special, _ := e.model.Tokenize("", true, true)
		for _, t := range special {
			binary.LittleEndian.PutUint32(n[:], uint32(t))
			h.Write(n[:])
		}
		tmpl := sha256.Sum256([]byte(e.tmpl))
		v.info = VerifyInfo{
			Model: e.cfg.ModelName, VocabSHA256: hex.EncodeToString(h.Sum(nil)), ChatTemplateSHA256: hex.EncodeToString(tmpl[:]),
			ContextTokens: e.nCtxSeq, Plain: e.reasoning.adapter == "" && e.reasoning.chains[""] <= 1,
		}
	})
	return v.info
}

// serveVerifyInfo is GET /molly/engine/verify: VerifyInfo as JSON.
func (e *Engine) serveVerifyInfo(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(e.VerifyInfo())
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
	v.calls.Add(1)
	v.proposed.Add(int64(len(draft)))
	v.accepted.Add(int64(vd.accepted))
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
// whether next ends generation}; see Verify. The body may also carry
// "vocab_sha256" and "chat_template_sha256", the drafter's idea of this
// engine's (VerifyInfo): when either differs the answer is 409 with code
// verify_mismatch (this engine's tokenizer or template changed since the
// drafter asked), so token ids of another vocabulary are never verified.
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
	info := e.VerifyInfo()
	for field, want := range map[string]string{"vocab_sha256": info.VocabSHA256, "chat_template_sha256": info.ChatTemplateSHA256} {
		if f := gjson.GetBytes(body, field); f.Exists() && f.String() != want {
			writeError(w, http.StatusConflict, "invalid_request_error", field, "verify_mismatch",
				fmt.Sprintf("%s %q is not this engine's (%s): ask GET %s again", field, f.String(), want, r.URL.Path))
			return
		}
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
