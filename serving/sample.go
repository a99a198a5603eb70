package serving

import (
	"math"
	"math/rand/v2"
	"sort"
)

// SamplingParams are the OpenAI sampling fields the engine honours.
type SamplingParams struct {
	Temperature float64 // 0: greedy (argmax, lowest id wins ties)
	// TopP is the nucleus mass in (0, 1]; 1 (or 0, unset) disables. A
	// request's top_p 0 arrives as math.SmallestNonzeroFloat64, which keeps
	// only the most likely token.
	TopP        float64
	TopK        int    // 0 disables
	Seed        *int64 // nil: a random seed
	Stop        []string
	MaxTokens   int // 0: up to the sequence's context
	TopLogprobs int // alternatives returned per token when Logprobs
	Logprobs    bool
	// Grammar is a GBNF grammar (start rule "root") the output must match,
	// applied by llama.cpp's grammar sampler; "" for none (tools.go).
	Grammar string
	// StopAfterValue ends a choice (finish "stop") as soon as its output
	// holds one whole JSON object, array or string, leading whitespace
	// aside: the trailing whitespace a JSON grammar allows after its root
	// value is never generated. For grammars whose root is such a value.
	StopAfterValue bool
	// LogitBias is added to the logits of its token ids before sampling
	// (OpenAI's logit_bias, -100 to 100: -100 bans a token, 100 all but
	// forces it).
	LogitBias map[int32]float32
	// PresencePenalty and FrequencyPenalty (-2 to 2) lower the logit of
	// every token the choice has already generated, by
	// c·FrequencyPenalty + PresencePenalty for a token generated c > 0
	// times: OpenAI's formula (platform.openai.com, "Parameter details":
	// mu[j] − c[j]·alpha_frequency − (c[j] > 0)·alpha_presence). Only the
	// choice's own output counts, not the prompt.
	PresencePenalty, FrequencyPenalty float64
}

// adjusts reports whether p changes logits before sampling.
func (p SamplingParams) adjusts() bool {
	return len(p.LogitBias) > 0 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0
}

// sampler draws tokens from logits for one choice.
type sampler struct {
	p   SamplingParams
	rng *rand.Rand
	idx []int
	pr  []float64
	// With p.adjusts(): the tokens drawn so far and their counts, and the
	// logits adjust changed, to put back.
	counts map[int32]int
	saved  []savedLogit
}

type savedLogit struct {
	tok int32
	v   float32
}

func newSampler(p SamplingParams, choice int) *sampler {
	var seed uint64
	if p.Seed != nil {
		seed = uint64(*p.Seed)
	} else {
		seed = rand.Uint64()
	}
	return &sampler{p: p, rng: rand.New(rand.NewPCG(seed, uint64(choice)))}
}

// sample picks a token id from logits (length n_vocab); it does not modify
// logits (the bias and penalties are applied to them and taken back). Order:
// logit_bias and penalties, top-k, temperature, softmax, top-p, draw.
func (s *sampler) sample(logits []float32) int32 {
	if !s.p.adjusts() {
		return s.draw(logits)
	}
	s.adjust(logits)
	tok := s.draw(logits)
	for i := len(s.saved) - 1; i >= 0; i-- {
		logits[s.saved[i].tok] = s.saved[i].v
	}
	if s.counts == nil {
		s.counts = map[int32]int{}
	}
	s.counts[tok]++
	return tok
}

// adjust applies logit_bias and the penalties to logits, recording in
// s.saved what it changed (in order, so that putting it back in reverse
// restores every logit).
func (s *sampler) adjust(logits []float32) {
	s.saved = s.saved[:0]
	for tok, b := range s.p.LogitBias {
		if tok >= 0 && int(tok) < len(logits) {
			s.saved = append(s.saved, savedLogit{tok, logits[tok]})
			logits[tok] += b
		}
	}
	if s.p.PresencePenalty == 0 && s.p.FrequencyPenalty == 0 {
		return
	}
	for tok, c := range s.counts {
		if int(tok) < len(logits) {
			s.saved = append(s.saved, savedLogit{tok, logits[tok]})
			logits[tok] -= float32(float64(c)*s.p.FrequencyPenalty + s.p.PresencePenalty)
		}
	}
}

// draw is sample on logits as they are.
func (s *sampler) draw(logits []float32) int32 {
	if s.p.Temperature <= 0 {
		return argmax(logits)
	}
	sum := s.kept(logits)
	r := s.rng.Float64() * sum
	for k, p := range s.pr {
		r -= p
		if r <= 0 {
			return int32(s.idx[k])
		}
	}
	return int32(s.idx[len(s.idx)-1])
}

// kept fills s.idx with the tokens sample may draw (all of them, or the
// top_k / top_p ones by decreasing logit) and s.pr with their unnormalised
// weights exp((logit − max) / temperature), and returns the weights' sum.
// Temperature must be > 0.
func (s *sampler) kept(logits []float32) float64 {
	n := len(logits)
	s.idx = s.idx[:0]
	for i := range n {
		s.idx = append(s.idx, i)
	}
	if s.p.TopK > 0 || (s.p.TopP > 0 && s.p.TopP < 1) {
		sort.SliceStable(s.idx, func(a, b int) bool { return logits[s.idx[a]] > logits[s.idx[b]] })
		if s.p.TopK > 0 && s.p.TopK < n {
			s.idx = s.idx[:s.p.TopK]
		}
	}
	mx := math.Inf(-1)
	for _, i := range s.idx {
		mx = math.Max(mx, float64(logits[i]))
	}
	s.pr = s.pr[:0]
	var sum float64
	for _, i := range s.idx {
		p := math.Exp((float64(logits[i]) - mx) / s.p.Temperature)
		s.pr = append(s.pr, p)
		sum += p
	}
	if s.p.TopP > 0 && s.p.TopP < 1 {
		var c float64
		for k, p := range s.pr {
			c += p / sum
			if c >= s.p.TopP {
				s.idx, s.pr = s.idx[:k+1], s.pr[:k+1]
				break
			}
		}
		sum = 0
		for _, p := range s.pr {
			sum += p
		}
	}
	return sum
}

func argmax(l []float32) int32 {
	best := 0
	for i, x := range l {
		if x > l[best] {
			best = i
		}
	}
	return int32(best)
}

// logSoftmax returns log p(tok) and the k most likely (id, log p) under the
// model's distribution (raw logits, temperature 1), as OpenAI reports.
func logSoftmax(logits []float32, tok int32, k int) (float64, []int32, []float64) {
	mx := float64(logits[argmax(logits)])
	var sum float64
	for _, x := range logits {
		sum += math.Exp(float64(x) - mx)
	}
	lse := mx + math.Log(sum)
	lp := float64(logits[tok]) - lse
	if k <= 0 {
		return lp, nil, nil
	}
	ids := make([]int32, 0, k+1)
	for i, x := range logits {
		if len(ids) < k || x > logits[ids[len(ids)-1]] {
			j := sort.Search(len(ids), func(j int) bool { return logits[ids[j]] < x })
			ids = append(ids, 0)
			copy(ids[j+1:], ids[j:])
			ids[j] = int32(i)
			if len(ids) > k {
				ids = ids[:k]
			}
		}
	}
	lps := make([]float64, len(ids))
	for i, id := range ids {
		lps[i] = float64(logits[id]) - lse
	}
	return lp, ids, lps
}

// probs writes into out (length len(logits), reused when large enough) the
// distribution sample draws from when Temperature > 0 — top-k, temperature,
// softmax, top-p, in that order — with zeros outside the kept tokens, and
// returns it; the values sum to 1.
func (s *sampler) probs(logits []float32, out []float64) []float64 {
	n := len(logits)
	if cap(out) < n {
		out = make([]float64, n)
	}
	out = out[:n]
	clear(out)
	sum := s.kept(logits)
	for k, i := range s.idx {
		out[i] = s.pr[k] / sum
	}
	return out
}

// drawFrom draws a token id with probability proportional to w[id] (non-
// negative weights with a positive sum, in id order).
func drawFrom(w []float64, rng *rand.Rand) int32 {
	var sum float64
	for _, x := range w {
		sum += x
	}
	r := rng.Float64() * sum
	last := int32(0)
	for i, x := range w {
		if x <= 0 {
			continue
		}
		last = int32(i)
		r -= x
		if r < 0 {
			return last
		}
	}
	return last
}

// acceptOrResample is one position of speculative sampling (Leviathan,
// Kalman and Matias, "Fast Inference from Transformers via Speculative
// Decoding", ICML 2023, Algorithm 1; Chen et al., "Accelerating Large
// Language Model Decoding with Speculative Sampling", 2023): the draft drew
// x from its distribution q, the target's distribution is p (both dense over
// the vocabulary, summing to 1). x is kept with probability
// min(1, p(x)/q(x)); otherwise the answer is drawn from the residual
// norm(max(0, p − q)) (scratch holds it). Either way the token returned is
// distributed exactly as p, and x is kept with probability Σ min(p, q).
func acceptOrResample(p, q []float64, x int32, rng *rand.Rand, scratch []float64) (tok int32, kept bool, res []float64) {
	if q[x] > 0 && rng.Float64()*q[x] < p[x] {
		return x, true, scratch
	}
	if cap(scratch) < len(p) {
		scratch = make([]float64, len(p))
	}
	scratch = scratch[:len(p)]
	var sum float64
	for i := range p {
		scratch[i] = max(0, p[i]-q[i])
		sum += scratch[i]
	}
	if sum <= 0 { // p == q up to rounding: the residual is empty
		return drawFrom(p, rng), false, scratch
	}
	return drawFrom(scratch, rng), false, scratch
}
