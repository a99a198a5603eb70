package serving

import (
	"fmt"
	"net/http"

	"github.com/molly-gateway/molly/serving/llama"
)

// The reasoning switcher (issue 18): a chat request on the base model, with
// ReasoningConfig.Adapter set, runs on the reasoning adapter with a reasoning
// block when its prompt scores hard, and on the base model without one
// otherwise. The score is the capability estimator's difficulty of the last
// user message (router/capability: a logistic over length, question count,
// reasoning and constraint cues — features known before prefill, as the
// switcher of "Efficient Reasoning on the Edge" uses), compared with
// ReasoningConfig.Threshold. An explicit reasoning_effort overrides it:
// none/minimal keep the base without reasoning, low/medium/high take the
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
func (e *Engine) switchReasoning(msgs []llama.ChatMessage, adapter string, rp *ReasoningParams, explicit bool) (string, *ReasoningParams, *switchDecision) {
	sp := e.reasoning
	if sp.adapter == "" || adapter != "" {
		return adapter, rp, nil
	}
	last := ""
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == "user" {
			last = msgs[i].Content
			break
		}
	}
	d := &switchDecision{score: sp.difficulty.Estimate(last, false).Difficulty, by: "difficulty", adapter: sp.adapter, thr: sp.threshold}
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
		return "", rp, d
	}
	return sp.adapter, rp, d
}

// setReasoningHeader writes the decision's header, if any.
func setReasoningHeader(w http.ResponseWriter, d *switchDecision) {
	if d != nil {
		w.Header().Set(HeaderReasoning, d.header())
	}
}
