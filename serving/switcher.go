package serving

import (
	"fmt"
	"net/http"

	"github.com/molly-gateway/molly/serving/llama"
)

// The reasoning switcher: a chat request on the base model, with
// ReasoningConfig.Adapter set, runs on the reasoning adapter with a reasoning
// block when its prompt scores hard, and on the base model without one
// otherwise. The score is the capability estimator's difficulty of the last
// user message (router/capability: a logistic over length, question count,
// reasoning and constraint cues — features known before prefill, as the
// switcher of "Efficient Reasoning on the Edge" uses), compared with
// ReasoningConfig.Threshold. An explicit reasoning_effort overrides it:
// none/minimal keep the base without reasoning, low/medium/high/xhigh/max take the
// adapter. A request naming an adapter is never switched.
//
// The decision is reported in the X-Molly-Reasoning response header, which
// the gateway appends to X-Molly-Route:
//
//	on adapter=<name> score=<s> threshold=<t> by=difficulty|reasoning_effort
//	off score=<s> threshold=<t> by=difficulty|reasoning_effort

// HeaderReasoning is the engine's response header with the switcher's
// decision (format above).
const HeaderReasoning = "X-Molly-Reasoning"

// switchDecision is the switcher's decision for one request.
type switchDecision struct {
	on      bool
	score   float64 // the difficulty (also computed when the effort decided)
	by      string  // "difficulty" or "reasoning_effort"
	adapter string
	thr     float64
}

func (d *switchDecision) header() string {
	if d.on {
		return fmt.Sprintf("on adapter=%s score=%.4f threshold=%.4f by=%s", d.adapter, d.score, d.thr, d.by)
	}
	return fmt.Sprintf("off score=%.4f threshold=%.4f by=%s", d.score, d.thr, d.by)
}

// switchReasoning applies the switcher to a chat request on the base model:
// it returns the adapter and reasoning parameters to run with and the
// decision (nil when the switcher does not apply). explicit says the
// request set reasoning_effort or a reasoning budget.
func (e *Engine) switchReasoning(msgs []llama.ChatMessage, prompt []int32, adapter string, rp *ReasoningParams, explicit bool) (string, *ReasoningParams, *switchDecision, error) {
	sp := e.reasoning
	if sp.adapter == "" || adapter != "" {
		return adapter, rp, nil, nil
	}
	last := ""
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == "user" {
			last = msgs[i].Content
			break
		}
	}
	d := &switchDecision{score: sp.difficulty.Estimate(last, false).Difficulty, by: "difficulty", adapter: sp.adapter, thr: sp.threshold}
	if sp.probe != nil && !explicit {
		mean, err := e.meanHiddenState(prompt)
		if err != nil {
			return "", nil, nil, fmt.Errorf("reasoning probe: %w", err)
		}
		d.score, d.by = sp.probe.probeScore(mean, d.score), "probe"
	}
	switch {
	case explicit:
		d.by, d.on = "reasoning_effort", rp != nil
	default:
		d.on = d.score >= sp.threshold
		if d.on && sp.start != "" {
			rp = &ReasoningParams{Effort: "medium", MaxTokens: sp.budgets["medium"], MinTokens: min(sp.minTokens, sp.budgets["medium"])}
		}
	}
	if !d.on {
		return "", rp, d, nil
	}
	return sp.adapter, rp, d, nil
}

// probeScore is σ(w·[h, difficulty] + b) for a probe (Features
// "mean_hidden_difficulty": NEmbd weights for the mean hidden state of the
// prompt, then one for the capability difficulty).
func (v *Verifier) probeScore(mean []float32, difficulty float64) float64 {
	x := append(append(make([]float32, 0, len(mean)+1), mean...), float32(difficulty))
	return v.Score(x)
}

// meanHiddenState is the base model's mean final-norm hidden state over
// prompt, from the hidden-state context (calls are serialised).
func (e *Engine) meanHiddenState(prompt []int32) ([]float32, error) {
	h, unlock, err := e.hiddenContext()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return h.MeanState(prompt)
}

// ProbeExample is one labelled prompt for TrainProbe: chat messages and
// whether reasoning helped (the prompt is hard).
type ProbeExample struct {
	Messages []llama.ChatMessage `json:"messages"`
	Hard     bool                `json:"hard"`
}

// ProbeFeatures is the switcher probe's input for a prompt: the base
// model's mean hidden state over the templated prompt, then the capability
// difficulty of its last user message (as switchReasoning computes them).
func (e *Engine) ProbeFeatures(msgs []llama.ChatMessage) ([]float32, error) {
	toks, err := e.tokenizeChat(msgs)
	if err != nil {
		return nil, err
	}
	mean, err := e.meanHiddenState(toks)
	if err != nil {
		return nil, err
	}
	last := ""
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == "user" {
			last = msgs[i].Content
			break
		}
	}
	return append(mean, float32(e.reasoning.difficulty.Estimate(last, false).Difficulty)), nil
}

// TrainProbe fits the switcher's linear probe (logistic regression, as
// FitVerifier) on labelled prompts; the result is a Verifier with Features
// "mean_hidden_difficulty", to be saved as ReasoningConfig.Probe. Errors: as
// ProbeFeatures and FitVerifier.
func (e *Engine) TrainProbe(examples []ProbeExample, l2 float64) (*Verifier, error) {
	xs := make([][]float32, len(examples))
	ys := make([]bool, len(examples))
	for i, ex := range examples {
		x, err := e.ProbeFeatures(ex.Messages)
		if err != nil {
			return nil, fmt.Errorf("example %d: %w", i, err)
		}
		xs[i], ys[i] = x, ex.Hard
	}
	v, err := FitVerifier(xs, ys, l2)
	if err != nil {
		return nil, err
	}
	v.Features, v.BaseChecksum = "mean_hidden_difficulty", e.adapters.checksum
	return v, nil
}

// setReasoningHeader writes the decision's header, if any.
func setReasoningHeader(w http.ResponseWriter, d *switchDecision) {
	if d != nil {
		w.Header().Set(HeaderReasoning, d.header())
	}
}
