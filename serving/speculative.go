package serving

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/molly-gateway/molly/serving/llama"
)

// Speculative decoding (Leviathan, Kalman and Matias, "Fast Inference from
// Transformers via Speculative Decoding", ICML 2023, Algorithm 1). A draft
// model sharing the target's tokenizer proposes K tokens; the target scores
// the last committed token and the K proposals in ONE llama_decode (logits at
// all K+1 positions) and commits between 1 and K+1 tokens per round. Both KV
// caches are rolled back past the rejected proposals (llama_memory_seq_rm).
//
// Greedy requests (temperature 0): the draft proposes its argmax, the target
// accepts the longest prefix of proposals equal to its own argmax and
// appends its own argmax after it, so the output is the target's greedy
// output (near ties are recomputed, see tieMargin). Sampled requests: the
// draft samples from its distribution q (the request's top-k, temperature
// and top-p applied to its logits), the target keeps a proposal x with
// probability min(1, p(x)/q(x)) and replaces the first rejected one by a
// draw from norm(max(0, p − q)) (acceptOrResample), and draws one more token
// from p when all are kept: every token is distributed as plain sampling
// from the target would draw it.
//
// It is a separate decode path, with its own single-sequence target context
// (on the engine's base model) and draft context: requests that qualify
// (see speculates) run here one at a time while the batched scheduler serves
// everything else, including qualifying requests that arrive while a
// speculative one runs. The two contexts hold ContextTokens cells each,
// outside Config.MemoryBytes.

// defaultDraftTokens is Config.DraftTokens' default.
const defaultDraftTokens = 4

type speculator struct {
	k     int
	draft *llama.Model
	dctx  *llama.Context
	tctx  *llama.Context
	batch *llama.Batch
	nCtx  int
	mu    sync.Mutex // one speculative request at a time
	pbuf  []float64  // the target's distribution (speculative sampling)
	rbuf  []float64  // the residual distribution

	proposed   atomic.Int64
	accepted   atomic.Int64
	rounds     atomic.Int64
	redecodes  atomic.Int64
	mismatches atomic.Int64
}

// tieMargin is the logit gap below which the verification decode's choice is
// recomputed by a one-token decode. ggml computes a one-column product
// (plain greedy decoding) with another kernel than a several-column one
// (llamafile's tinyBLAS for n >= 2), and the accepted tokens' KV cells come
// from the several-column one, so the verification's logits differ from
// plain decoding's by rounding that compounds along the sequence: above
// 1e-2 after ~80 tokens on the random demo models (BenchmarkSpeculative's
// small case), so the margin is 0.1. The one-token decode still reads the
// accepted tokens' batch-computed KV, so a tie closer than that KV's
// rounding could still be decided differently from plain decoding (not
// seen in TestSpeculativeGreedyEqualsPlainGreedy or BenchmarkSpeculative).
const tieMargin = 0.1

// argmaxGap is argmax(l) (lowest id wins ties) and the gap between the
// largest and the second largest logit.
func argmaxGap(l []float32) (int32, float32) {
	best := argmax(l)
	second := float32(math.Inf(-1))
	for i, x := range l {
		if int32(i) != best && x > second {
			second = x
		}
	}
	return best, l[best] - second
}

// SpeculativeStats counts speculative decoding since the engine
// started: Proposed draft tokens, Accepted ones (Accepted/Proposed is the
// acceptance rate), Rounds (target verification decodes, each committing
// its accepted tokens plus one) and Redecodes (greedy near ties recomputed
// by a one-token decode, see tieMargin) and Mismatches (rounds that rejected
// a proposal: greedy, because the target's trusted choice differed, which a
// draft identical to the target never causes; sampled, by the acceptance
// test).
type SpeculativeStats struct {
	Proposed, Accepted, Rounds, Redecodes, Mismatches int64
}

// SpeculativeStats reports the speculative decoding counters; zero without
// Config.DraftModel.
func (e *Engine) SpeculativeStats() SpeculativeStats {
	if e.spec == nil {
		return SpeculativeStats{}
	}
	return SpeculativeStats{Proposed: e.spec.proposed.Load(), Accepted: e.spec.accepted.Load(), Rounds: e.spec.rounds.Load(), Redecodes: e.spec.redecodes.Load(), Mismatches: e.spec.mismatches.Load()}
}

// ErrDraftVocab is returned by New when Config.DraftModel's tokenizer differs
// from the base model's (vocabulary size or any token's text).
var ErrDraftVocab = errors.New("draft model does not share the base model's tokenizer")

// newSpeculator loads the draft model and the two single-sequence contexts.
// Errors: unloadable draft, ErrDraftVocab, contexts llama.cpp cannot
// allocate.
func newSpeculator(target *llama.Model, cfg Config, nCtx int) (*speculator, error) {
	d, err := llama.LoadModel(cfg.DraftModel)
	if err != nil {
		return nil, fmt.Errorf("loading draft model: %w", err)
	}
	if err := sameVocab(target, d); err != nil {
		d.Close()
		return nil, fmt.Errorf("draft model %s: %w", cfg.DraftModel, err)
	}
	k := cfg.DraftTokens
	if k <= 0 {
		k = defaultDraftTokens
	}
	nb := max(cfg.NBatch, k+1)
	p := llama.ContextParams{NCtx: nCtx, NBatch: nb, NSeqMax: 1, Threads: cfg.Threads, TypeK: cfg.KVCacheType, TypeV: cfg.KVCacheType}
	dctx, err := llama.NewContext(d, p)
	if err != nil {
		d.Close()
		return nil, err
	}
	tctx, err := llama.NewContext(target, p)
	if err != nil {
		dctx.Close()
		d.Close()
		return nil, err
	}
	return &speculator{k: k, draft: d, dctx: dctx, tctx: tctx, batch: llama.NewBatch(nb), nCtx: tctx.NCtx()}, nil
}

func (s *speculator) close() {
	s.batch.Free()
	s.tctx.Close()
	s.dctx.Close()
	s.draft.Close()
}

// sameVocab checks that two models tokenize alike: equal vocabulary sizes and
// equal bytes for every token. Errors: ErrDraftVocab naming the first
// difference.
func sameVocab(a, b *llama.Model) error {
	if a.NVocab() != b.NVocab() {
		return fmt.Errorf("%w: %d tokens, the base has %d", ErrDraftVocab, b.NVocab(), a.NVocab())
	}
	for t := range int32(a.NVocab()) {
		if !bytes.Equal(a.TokenPiece(t), b.TokenPiece(t)) {
			return fmt.Errorf("%w: token %d is %q, the base's is %q", ErrDraftVocab, t, b.TokenPiece(t), a.TokenPiece(t))
		}
	}
	return nil
}

// speculates reports whether r takes the speculative path: one choice,
// base model, no grammar, stop strings, logprobs, reasoning, logit_bias or
// penalties; greedy or sampled.
func (e *Engine) speculates(r Request) bool {
	p := r.Params
	return e.spec != nil && r.N == 1 && r.Adapter == "" && r.Reasoning == nil &&
		p.Grammar == "" && !p.StopAfterValue && len(p.Stop) == 0 && !p.Logprobs && !p.adjusts()
}

// generateSpeculative runs r on the speculative path; the caller holds
// e.spec.mu. Same contract as Generate.
func (e *Engine) generateSpeculative(ctx context.Context, r Request, onEvent func(Event) error) (Usage, error) {
	s := e.spec
	u := Usage{PromptTokens: len(r.Prompt)}
	maxTok := e.nCtxSeq - len(r.Prompt)
	if r.Params.MaxTokens > 0 {
		maxTok = min(maxTok, r.Params.MaxTokens)
	}
	var text []byte
	sent := 0
	flush := func(finish string) error {
		end := len(text)
		if finish == "" {
			end -= holdBack(text[sent:], nil) // an incomplete UTF-8 character
		}
		if end == sent && finish == "" {
			return nil
		}
		ev := Event{Text: string(text[sent:end]), Finish: finish}
		sent = end
		return onEvent(ev)
	}
	finish := "length"
	err := s.generate(ctx, r.Prompt, maxTok, r.Params, func(tok int32) (bool, error) {
		select {
		case <-e.quit:
			return false, ErrClosed
		default:
		}
		if e.model.IsEOG(tok) {
			finish = "stop"
			return false, nil
		}
		u.CompletionTokens++
		text = append(text, e.model.TokenPiece(tok)...)
		return u.CompletionTokens < maxTok, flush("")
	})
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if err != nil {
		return Usage{}, err
	}
	return u, flush(finish)
}

// generate decodes after prompt, calling commit for each token the target
// chooses until commit returns false, maxTok tokens were committed or the
// context is full. Greedy when p.Temperature <= 0 (the target's greedy
// choices, see verifyDraft); otherwise speculative sampling (verifySampled):
// the draft samples its proposals with p's top-k, temperature and top-p, and
// every committed token is distributed as plain sampling with p would draw
// it (not the same draws for a given seed: the random stream is consumed
// differently). Errors: llama.cpp failures, ctx.Err(), commit's.
func (s *speculator) generate(ctx context.Context, prompt []int32, maxTok int, p SamplingParams, commit func(int32) (bool, error)) error {
	s.tctx.Clear()
	s.dctx.Clear()
	// Prefill both models; the target's last logits give the first token.
	if err := s.prefill(s.tctx, prompt, true); err != nil {
		return err
	}
	var smp *sampler // nil: greedy
	var qs [][]float64
	if p.Temperature > 0 {
		smp = newSampler(p, 0)
		qs = make([][]float64, s.k)
	}
	cur := argmax(s.tctx.LogitsView(s.batch.Len() - 1))
	if smp != nil {
		cur = smp.sample(s.tctx.LogitsView(s.batch.Len() - 1))
	}
	if err := s.prefill(s.dctx, prompt[:len(prompt)-1], false); err != nil {
		return err
	}
	n := len(prompt)                // position of cur; the target's KV holds [0, n)
	pending := []int32{prompt[n-1]} // committed tokens the draft's KV lacks, from position dpos
	dpos := n - 1
	done := 0
	var props []int32
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		more, err := commit(cur)
		if err != nil || !more {
			return err
		}
		done++
		pending = append(pending, cur)
		if done >= maxTok || n+1 >= s.nCtx {
			return nil
		}
		// Draft K tokens greedily (fewer near the end of the budget).
		k := min(s.k, maxTok-done-1, s.nCtx-n-2)
		props = props[:0]
		if k > 0 {
			s.batch.Clear()
			for i, t := range pending {
				s.batch.Add(t, dpos+i, 0, i == len(pending)-1)
			}
			if err := s.dctx.Decode(s.batch); err != nil {
				return fmt.Errorf("draft decode: %w", err)
			}
			dpos += len(pending)
			pending = pending[:0]
			for {
				var d int32
				if smp == nil {
					d = argmax(s.dctx.LogitsView(s.batch.Len() - 1))
				} else {
					q := smp.probs(s.dctx.LogitsView(s.batch.Len()-1), qs[len(props)])
					qs[len(props)] = q
					d = drawFrom(q, smp.rng)
				}
				props = append(props, d)
				if len(props) == k {
					break
				}
				s.batch.Clear()
				s.batch.Add(d, dpos, 0, true)
				if err := s.dctx.Decode(s.batch); err != nil {
					return fmt.Errorf("draft decode: %w", err)
				}
				dpos++
			}
		}
		// Verify cur and the proposals in one target decode.
		var vd verdict
		if smp == nil {
			vd, err = verifyDraft(s.tctx, s.batch, n, cur, props)
		} else {
			vd, err = s.verifySampled(smp, n, cur, props, qs)
		}
		if err != nil {
			return fmt.Errorf("target decode: %w", err)
		}
		j, next := vd.accepted, vd.next
		s.rounds.Add(1)
		s.proposed.Add(int64(len(props)))
		s.accepted.Add(int64(j))
		s.redecodes.Add(int64(vd.redecodes))
		if vd.mismatch {
			s.mismatches.Add(1)
		}
		// The target's KV holds [0, n+1+j): cur and the accepted proposals;
		// the draft's drops what it decoded past them.
		if kept := n + 1 + j; dpos > kept {
			s.dctx.SeqRm(0, kept, -1)
			dpos = kept
		}
		for i := range j {
			more, err := commit(props[i])
			if err != nil || !more {
				return err
			}
			done++
			if dpos <= n+1+i {
				pending = append(pending, props[i])
			}
		}
		n += 1 + j
		cur = next
		if done >= maxTok {
			return nil
		}
	}
}

// verifySampled decodes last at position pos and the proposals after it in
// one target batch and runs acceptOrResample at each proposal in turn: the
// first rejected one is replaced by the residual draw; when all are kept the
// next token is drawn from the target's distribution after them. On return
// the target's KV holds [0, pos+1+accepted). Errors: llama.cpp failures.
func (s *speculator) verifySampled(smp *sampler, pos int, last int32, props []int32, qs [][]float64) (verdict, error) {
	b := s.batch
	b.Clear()
	b.Add(last, pos, 0, true)
	for i, d := range props {
		b.Add(d, pos+1+i, 0, true)
	}
	if err := s.tctx.Decode(b); err != nil {
		return verdict{}, err
	}
	for i, x := range props {
		s.pbuf = smp.probs(s.tctx.LogitsView(i), s.pbuf)
		tok, kept, res := acceptOrResample(s.pbuf, qs[i], x, smp.rng, s.rbuf)
		s.rbuf = res
		if !kept {
			s.tctx.SeqRm(0, pos+1+i, -1)
			return verdict{accepted: i, next: tok, mismatch: true}, nil
		}
	}
	s.pbuf = smp.probs(s.tctx.LogitsView(len(props)), s.pbuf)
	return verdict{accepted: len(props), next: drawFrom(s.pbuf, smp.rng)}, nil
}

// prefill decodes toks into ctx from position 0 in NBatch chunks, with
// logits for the last token when last. The batch holds the final chunk.
func (s *speculator) prefill(ctx *llama.Context, toks []int32, last bool) error {
	for i := 0; i < len(toks); {
		s.batch.Clear()
		for ; i < len(toks) && s.batch.Len() < s.batch.Cap(); i++ {
			s.batch.Add(toks[i], i, 0, last && i == len(toks)-1)
		}
		if err := ctx.Decode(s.batch); err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
	}
	return nil
}
