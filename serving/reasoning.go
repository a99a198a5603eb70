package serving

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/capability"
)

// Reasoning mode.
//
// A reasoning request generates a block of reasoning between the template's
// delimiters (<think> … </think> for Qwen3, DeepSeek-R1 and the demo model)
// before its answer. The engine opens the block itself: the start delimiter
// is appended to the templated prompt (as DeepSeek-R1's template does), so
// every generated token up to the end delimiter is reasoning. The answer
// carries the reasoning in `reasoning_content` (message and stream deltas,
// the field llama.cpp's server, vLLM and DeepSeek use), the content after the
// block in `content`, and usage counts the block (the end delimiter
// included) in completion_tokens_details.reasoning_tokens.
//
// Budget forcing (s1: Muennighoff et al., "s1: Simple test-time scaling",
// 2025): once a chain has sampled its reasoning budget (max_reasoning_tokens,
// or the effort's default) the engine feeds the end delimiter's tokens
// instead of sampling, and the model continues with its answer. Below the
// minimum (min_reasoning_tokens) the first token of the end delimiter and the
// end-of-generation tokens are masked (logit −∞), so the chain cannot stop
// thinking early; s1 appends "Wait" at that point, masking is the same
// control without adding text. Stop strings apply to the answer only, and
// max_tokens counts reasoning and answer together, as OpenAI's
// max_completion_tokens does.

// ReasoningConfig configures reasoning mode (Config.Reasoning).
type ReasoningConfig struct {
	// Start and End are the reasoning delimiters. Default: the known pair
	// (KnownReasoningDelimiters) whose two delimiters both appear in the
	// model's chat template; a model with neither refuses reasoning efforts
	// other than "none".
	Start string `json:"start,omitempty"`
	End   string `json:"end,omitempty"`
	// Low, Medium, High, XHigh and Max are the reasoning budgets, in
	// tokens, of the efforts of OpenAI's ReasoningEffort enum above
	// "minimal" (none and minimal take no block); defaults 256, 1024 and
	// 4096, then XHigh twice High and Max twice XHigh (a configured XHigh
	// or Max below the budget under it is raised to it, so those efforts
	// never get less than High).
	Low    int `json:"low,omitempty"`
	Medium int `json:"medium,omitempty"`
	High   int `json:"high,omitempty"`
	XHigh  int `json:"xhigh,omitempty"`
	Max    int `json:"max,omitempty"`
	// MinTokens is the default minimum of reasoning tokens before the end
	// delimiter may be sampled (0: none).
	MinTokens int `json:"min_tokens,omitempty"`
	// Adapter is the reasoning adapter the switcher (switcher.go)
	// activates, with a reasoning block of the medium budget, for a chat
	// request on the base model whose prompt it scores hard; "" disables
	// the switcher.
	Adapter string `json:"adapter,omitempty"`
	// Threshold is the switcher's score at or above which reasoning is
	// on; default 0.5.
	Threshold float64 `json:"threshold,omitempty"`
	// Chains is the default n_chains per adapter name ("" for the base
	// model): parallel chains whose answers are voted on (chains.go).
	Chains map[string]int `json:"chains,omitempty"`
	// AnswerRegex extracts a chain's final answer from its content: the
	// last match, its first group if it has one (RE2 syntax). AnswerField
	// is the alternative for JSON content: a gjson path. Neither: the whole
	// trimmed content is the answer.
	AnswerRegex string `json:"answer_regex,omitempty"`
	AnswerField string `json:"answer_field,omitempty"`
	// Probe is the path of the switcher's linear probe (JSON, as written
	// by `molly switcher train`): when set, the switcher's score is
	// σ(w·[mean hidden state of the prompt, difficulty] + b) instead of the
	// difficulty alone. It costs one extra prefill of the prompt on the
	// hidden-state context.
	Probe string `json:"probe,omitempty"`
}

// KnownReasoningDelimiters are the reasoning delimiter pairs recognised in
// chat templates, first match wins: Qwen3/DeepSeek-R1/QwQ (and the demo
// model), Cohere Command A, Kimi, Seed-OSS.
var KnownReasoningDelimiters = [][2]string{
	{"<think>", "</think>"},
	{"<|START_THINKING|>", "<|END_THINKING|>"},
	{"◁think▷", "◁/think▷"},
	{"<seed:think>", "</seed:think>"},
}

// ReasoningParams are a request's reasoning settings (Request.Reasoning; nil:
// no reasoning block).
type ReasoningParams struct {
	// Effort is "low", "medium", "high", "xhigh" or "max"
	// (informational once MaxTokens is set).
	Effort string
	// MaxTokens is the budget: reasoning tokens sampled before the end
	// delimiter is forced (> 0).
	MaxTokens int
	// MinTokens is the minimum: reasoning tokens sampled before the end
	// delimiter or an end-of-generation token may be (0: none; at most
	// MaxTokens).
	MinTokens int
}

// CompletionTokensDetails is OpenAI's breakdown of completion tokens.
type CompletionTokensDetails struct {
	// ReasoningTokens counts the tokens of the reasoning block: sampled
	// reasoning tokens and the end delimiter's tokens (forced or sampled).
	ReasoningTokens int `json:"reasoning_tokens"`
}

// reasoningSpec is the engine's resolved reasoning configuration.
type reasoningSpec struct {
	start, end   string
	startToks    []int32 // appended to a reasoning prompt
	endToks      []int32 // fed when the budget is reached
	closedToks   []int32 // start, blank line, end, blank line: reasoning_effort none
	budgets      map[string]int
	minTokens    int
	eog          []int32 // end-of-generation tokens (masked below the minimum)
	maskedFirsts []int32 // end delimiter's first token, then eog
	adapter      string  // the switcher's reasoning adapter ("": off)
	threshold    float64
	difficulty   *capability.Estimator
	answers      answerExtractor
	verifiers    verifiers
	chains       map[string]int
	probe        *Verifier
}

// newReasoningSpec resolves delimiters from the configuration or the chat
// template and tokenizes them. A model without delimiters gets a spec with
// empty start (reasoning refused).
func (e *Engine) newReasoningSpec(c ReasoningConfig) (*reasoningSpec, error) {
	sp := &reasoningSpec{start: c.Start, end: c.End, minTokens: c.MinTokens,
		budgets: map[string]int{"low": c.Low, "medium": c.Medium, "high": c.High, "xhigh": c.XHigh, "max": c.Max},
		adapter: c.Adapter, threshold: c.Threshold, difficulty: capability.NewEstimator(nil)}
	if sp.threshold == 0 {
		sp.threshold = 0.5
	}
	sp.answers.field, sp.chains = c.AnswerField, c.Chains
	if c.AnswerRegex != "" {
		re, err := regexp.Compile(c.AnswerRegex)
		if err != nil {
			return nil, fmt.Errorf("serving: reasoning answer_regex: %w", err)
		}
		sp.answers.re = re
	}
	if c.Probe != "" {
		v, err := LoadVerifier(c.Probe)
		if err != nil {
			return nil, fmt.Errorf("serving: reasoning probe: %w", err)
		}
		if v.Features != "mean_hidden_difficulty" || len(v.Weights) != e.model.NEmbd()+1 {
			return nil, fmt.Errorf("serving: reasoning probe %s: want features mean_hidden_difficulty and %d weights", c.Probe, e.model.NEmbd()+1)
		}
		sp.probe = v
	}
	for name, n := range c.Chains {
		if n < 1 || n > e.cfg.NSeqMax {
			return nil, fmt.Errorf("serving: reasoning chains for %q: %d, want 1..%d (the engine's sequences)", name, n, e.cfg.NSeqMax)
		}
	}
	for k, d := range map[string]int{"low": 256, "medium": 1024, "high": 4096} {
		if sp.budgets[k] <= 0 {
			sp.budgets[k] = d
		}
	}
	for i, k := range budgetEfforts[3:] {
		below := sp.budgets[budgetEfforts[i+2]]
		if sp.budgets[k] <= 0 {
			sp.budgets[k] = 2 * below
		}
		sp.budgets[k] = max(sp.budgets[k], below)
	}
	if (sp.start == "") != (sp.end == "") {
		return nil, fmt.Errorf("serving: reasoning start and end delimiters go together (got %q, %q)", sp.start, sp.end)
	}
	if sp.start == "" {
		for _, d := range KnownReasoningDelimiters {
			if strings.Contains(e.tmpl, d[0]) && strings.Contains(e.tmpl, d[1]) {
				sp.start, sp.end = d[0], d[1]
				break
			}
		}
	}
	for t := range int32(e.model.NVocab()) {
		if e.model.IsEOG(t) {
			sp.eog = append(sp.eog, t)
		}
	}
	if sp.start == "" {
		return sp, nil
	}
	var err error
	tok := func(s string) []int32 {
		if err != nil {
			return nil
		}
		var t []int32
		t, err = e.model.Tokenize(s, false, true)
		return t
	}
	sp.startToks, sp.endToks = tok(sp.start), tok(sp.end)
	sp.closedToks = tok(sp.start + "\n\n" + sp.end + "\n\n")
	if err != nil {
		return nil, fmt.Errorf("serving: tokenizing reasoning delimiters: %w", err)
	}
	if len(sp.startToks) == 0 || len(sp.endToks) == 0 {
		return nil, fmt.Errorf("serving: reasoning delimiters %q, %q tokenize to nothing", sp.start, sp.end)
	}
	sp.maskedFirsts = append([]int32{sp.endToks[0]}, sp.eog...)
	return sp, nil
}

// budgetEfforts are the reasoning_effort values with a reasoning budget, in
// increasing order: OpenAI's ReasoningEffort enum (none, minimal, low,
// medium, high, xhigh, max) less none and minimal.
var budgetEfforts = []string{"low", "medium", "high", "xhigh", "max"}

// parseReasoning reads reasoning_effort and Molly's max_reasoning_tokens and
// min_reasoning_tokens extensions from a chat body. It returns nil params
// and closed=false when the request asks nothing, closed=true for effort
// "none" (or "minimal", which this engine treats as none) on a model with
// delimiters. Errors (400): an unknown effort, a non-positive budget, a
// minimum above the budget, reasoning asked of a model without delimiters.
func (e *Engine) parseReasoning(body []byte) (rp *ReasoningParams, closed bool, err error) {
	f := gjson.GetManyBytes(body, "reasoning_effort", "max_reasoning_tokens", "min_reasoning_tokens")
	effort, maxT, minT := f[0], f[1], f[2]
	if !effort.Exists() && !maxT.Exists() && !minT.Exists() {
		return nil, false, nil
	}
	sp := e.reasoning
	p := &ReasoningParams{MinTokens: sp.minTokens}
	if effort.Exists() && effort.Type != gjson.Null {
		if effort.Type != gjson.String {
			return nil, false, badRequest("reasoning_effort", "reasoning_effort must be a string")
		}
		switch effort.Str {
		case "none", "minimal":
			if maxT.Exists() || minT.Exists() {
				return nil, false, badRequest("reasoning_effort", "reasoning_effort %q takes no reasoning budget", effort.Str)
			}
			return nil, sp.start != "", nil
		case "low", "medium", "high", "xhigh", "max":
			p.Effort, p.MaxTokens = effort.Str, sp.budgets[effort.Str]
		default:
			return nil, false, badRequest("reasoning_effort", "reasoning_effort must be one of none, minimal, low, medium, high, xhigh, max")
		}
	} else {
		p.Effort, p.MaxTokens = "medium", sp.budgets["medium"]
	}
	intField := func(r gjson.Result, name string, min int) (int, error) {
		if r.Type != gjson.Number || r.Num != math.Trunc(r.Num) || r.Num < float64(min) || r.Num > 1<<30 {
			return 0, badRequest(name, "%s must be an integer >= %d", name, min)
		}
		return int(r.Num), nil
	}
	if maxT.Exists() {
		if p.MaxTokens, err = intField(maxT, "max_reasoning_tokens", 1); err != nil {
			return nil, false, err
		}
	}
	if minT.Exists() {
		if p.MinTokens, err = intField(minT, "min_reasoning_tokens", 0); err != nil {
			return nil, false, err
		}
		if p.MinTokens > p.MaxTokens {
			return nil, false, badRequest("min_reasoning_tokens", "min_reasoning_tokens (%d) exceeds the reasoning budget (%d)", p.MinTokens, p.MaxTokens)
		}
	}
	p.MinTokens = min(p.MinTokens, p.MaxTokens)
	if sp.start == "" {
		return nil, false, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "reasoning_effort",
			code: "reasoning_not_supported", msg: fmt.Sprintf("the model %q has no reasoning delimiters in its chat template (configure reasoning start and end)", e.cfg.ModelName)}
	}
	return p, false, nil
}

// withReasoning appends the delimiters a request needs to its templated
// prompt: the start delimiter to open the block (rp set), or the closed
// block for effort none.
func (e *Engine) withReasoning(prompt []int32, rp *ReasoningParams, closed bool) []int32 {
	switch {
	case rp != nil:
		return append(prompt, e.reasoning.startToks...)
	case closed:
		return append(prompt, e.reasoning.closedToks...)
	}
	return prompt
}

// thinking is one choice's state inside its reasoning block.
type thinking struct {
	max, min int
	sampled  int     // reasoning tokens sampled
	tokens   int     // reasoning tokens including the end delimiter
	forced   []int32 // end-delimiter tokens still to feed
	text     []byte  // reasoning text so far
	sent     int     // bytes of text emitted
	done     bool    // the block is closed: what follows is the answer
}

func newThinking(p *ReasoningParams) *thinking {
	if p == nil {
		return nil
	}
	return &thinking{max: p.MaxTokens, min: p.MinTokens}
}

// acceptThinking takes the next token of s while it is in its reasoning
// block: a forced end-delimiter token, the end delimiter's first token at the
// budget, or a sample with the end masked below the minimum (an
// end-of-generation token sampled at or above it closes the block instead).
// The block ends when its text ends with the end delimiter.
func (e *Engine) acceptThinking(q *request, s *sequence, logits []float32) {
	t, sp := s.think, e.reasoning
	var tok int32
	switch {
	case len(t.forced) > 0:
		tok, t.forced = t.forced[0], t.forced[1:]
	case t.sampled >= t.max:
		tok, t.forced = sp.endToks[0], append(t.forced[:0], sp.endToks[1:]...)
	default:
		if t.sampled < t.min {
			tok = sampleMasked(s.smp, logits, sp.maskedFirsts)
		} else {
			tok = s.smp.sample(logits)
		}
		if e.model.IsEOG(tok) {
			tok, t.forced = sp.endToks[0], append(t.forced[:0], sp.endToks[1:]...)
		} else {
			t.sampled++
		}
	}
	s.generated++
	t.tokens++
	q.u.CompletionTokens++
	if q.u.CompletionTokensDetails == nil {
		q.u.CompletionTokensDetails = &CompletionTokensDetails{}
	}
	q.u.CompletionTokensDetails.ReasoningTokens++
	s.last = tok
	from := max(0, len(t.text)-len(sp.end)+1)
	t.text = append(t.text, e.model.TokenPiece(tok)...)
	if i := bytes.Index(t.text[from:], []byte(sp.end)); i >= 0 {
		// The block is closed; anything after the delimiter in the same
		// piece is answer text.
		i += from
		rest := t.text[i+len(sp.end):]
		t.text, t.done, t.forced = t.text[:i], true, nil
		s.text = append(s.text, rest...)
		if s.smp.p.StopAfterValue {
			s.json.feed(rest) // the answer's JSON starts after the block
		}
		e.flushThinking(q, s)
	}
	if s.generated >= s.maxTokens {
		e.flushThinking(q, s)
		e.end(q, s, "length", len(s.text))
		return
	}
	if t.done {
		return
	}
	if upto := len(t.text) - holdBack(t.text[t.sent:], []string{sp.end}); upto > t.sent {
		e.send(q, Event{Index: s.index, Reasoning: string(t.text[t.sent:upto])})
		t.sent = upto
	}
}

// flushThinking emits the reasoning text not sent yet, if any.
func (e *Engine) flushThinking(q *request, s *sequence) {
	if t := s.think; t.sent < len(t.text) {
		e.send(q, Event{Index: s.index, Reasoning: string(t.text[t.sent:])})
		t.sent = len(t.text)
	}
}

// sampleMasked samples from logits with the masked tokens' logits at −∞,
// restoring them after (the logits may be shared by several choices).
func sampleMasked(smp *sampler, logits []float32, masked []int32) int32 {
	var saved [8]float32
	keep := saved[:0]
	for _, m := range masked {
		keep = append(keep, logits[m])
		logits[m] = float32(math.Inf(-1))
	}
	tok := smp.sample(logits)
	for i, m := range masked {
		logits[m] = keep[i]
	}
	return tok
}
