package serving

import (
	"math"
	"math/rand/v2"
	"sort"
)

// SamplingParams are the OpenAI sampling fields the engine honours.
type SamplingParams struct {
	Temperature float64 // 0: greedy (argmax, lowest id wins ties)
	TopP        float64 // nucleus mass in (0, 1]; 1 disables
	TopK        int     // 0 disables
	Seed        *int64  // nil: a random seed
	Stop        []string
	MaxTokens   int // 0: up to the sequence's context
	TopLogprobs int // alternatives returned per token when Logprobs
	Logprobs    bool
	// Grammar is a GBNF grammar (start rule "root") the output must match,
	// applied by llama.cpp's grammar sampler; "" for none (tools.go).
	Grammar string
}

// sampler draws tokens from logits for one choice.
type sampler struct {
	p   SamplingParams
	rng *rand.Rand
	idx []int
	pr  []float64
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
// logits. Order: top-k, temperature, softmax, top-p, draw.
func (s *sampler) sample(logits []float32) int32 {
	if s.p.Temperature <= 0 {
		return argmax(logits)
	}
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
	r := s.rng.Float64() * sum
	for k, p := range s.pr {
		r -= p
		if r <= 0 {
			return int32(s.idx[k])
		}
	}
	return int32(s.idx[len(s.idx)-1])
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
