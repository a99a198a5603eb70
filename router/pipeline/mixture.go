package pipeline

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// HeaderMixture explains a mixture's answer: "best=<target>/<model>", then
// each member in ranking order, "<target>/<model> fused=<f>" (4 decimals)
// or "<target>/<model> failed", joined by ", ", then "cost_usd=<c>", the
// USD every member's answer cost together (6 decimals); parts are joined
// by "; ". Example:
// "best=lan/m; lan/m fused=0.2220, remote/m fused=0.0337; cost_usd=0.000012".
const HeaderMixture = "X-Molly-Mixture"

// UnknownConfidence is the confidence of an answer whose backend gave no
// logprobs: neutral between sure (1) and unsure (0).
const UnknownConfidence = 0.5

// fusedScore is an answer's rank in a mixture, best being the best ranked
// member's selection score:
//
//	fused = routing weight × quality prior × confidence
//
// where the routing weight is e^(score − best score) (1 for the best
// ranked), and the confidence e^(mean token log-probability), the
// geometric-mean token probability (UnknownConfidence without logprobs) —
// the selection half of LLM-Blender (Jiang, Ren and Lin, ACL 2023), with
// the priors standing in for its pairwise ranker.
func fusedScore(o outcome, best float64) (fused, weight, confidence float64) {
	return FusedScore(o.cand.Score, best, o.cand.Quality, o.logprob, o.tokens)
}

// FusedScore is the mixture's rank of one answer (see fusedScore): score
// and best are selection scores (the answer's candidate's and the best
// ranked one's), quality its quality prior in [0,1], meanLogprob the
// answer's mean token log-probability in nats over tokens tokens (0
// tokens: UnknownConfidence). fused = e^(score−best) × quality ×
// confidence, confidence = e^meanLogprob.
func FusedScore(score, best, quality, meanLogprob float64, tokens int) (fused, weight, confidence float64) {
	weight = math.Exp(score - best)
	confidence = UnknownConfidence
	if tokens > 0 {
		confidence = math.Exp(meanLogprob)
	}
	return weight * quality * confidence, weight, confidence
}

// mixture asks the plan's members in parallel and returns the best 2xx
// answer, or when none gave one the first non-2xx answer; when every
// member failed, the rest of the plan's candidates are tried one by one.
func (p *Pipeline) mixture(rq *request) error {
	members, rest := rq.plan.Candidates[:rq.plan.Members], rq.plan.Candidates[rq.plan.Members:]
	outs := make([]outcome, len(members))
	var wg sync.WaitGroup
	for i, c := range members {
		wg.Go(func() { outs[i] = p.scored(rq, c, 0) })
	}
	wg.Wait()
	if rq.ctx.Err() != nil {
		for i := range outs {
			outs[i].abandon()
		}
		return p.clientGone(rq, nil)
	}
	best, bestFused, firstOther := -1, 0.0, -1
	parts := make([]string, len(outs))
	var logged []string
	spentUSD := 0.0
	for i, o := range outs {
		switch {
		case !o.ok():
			rq.note(o)
			parts[i] = o.label() + " failed"
			logged = append(logged, o.label()+" failed: "+o.failure)
			continue
		case o.status/100 != 2:
			if firstOther < 0 {
				firstOther = i
			}
			parts[i] = fmt.Sprintf("%s HTTP %d", o.label(), o.status)
			logged = append(logged, parts[i])
			continue
		}
		if u := o.usage(); u != nil {
			spentUSD += u.CostUSD
		}
		fused, weight, conf := fusedScore(o, members[0].Score)
		parts[i] = fmt.Sprintf("%s fused=%.4f", o.label(), fused)
		logged = append(logged, fmt.Sprintf("%s weight=%.4f q=%.4f confidence=%.4f fused=%.4f", o.label(), weight, o.cand.Quality, conf, fused))
		if best < 0 || fused > bestFused {
			best, bestFused = i, fused
		}
	}
	chosen := best
	if chosen < 0 {
		chosen = firstOther
	}
	if chosen < 0 {
		rq.log.Warn("mixture: every member failed, falling back", zap.String("decision_id", rq.dec.ID()), zap.Strings("members", logged))
		return p.single(rq, rest)
	}
	for i := range outs {
		if o := &outs[i]; i != chosen && o.ok() && o.status/100 == 2 {
			p.spend(rq, o)
		}
	}
	rq.w.Header().Set(HeaderMixture, fmt.Sprintf("best=%s; %s; cost_usd=%.6f", outs[chosen].label(), strings.Join(parts, ", "), spentUSD))
	rq.log.Info("mixture", zap.String("decision_id", rq.dec.ID()), zap.Float64("task_entropy", rq.a.TaskEntropy()), zap.Strings("members", logged),
		zap.String("answered", outs[chosen].label()), zap.Float64("cost_usd", spentUSD), zap.Duration("duration", time.Since(rq.begin)))
	return p.respond(rq, &outs[chosen], labelMixture)
}
