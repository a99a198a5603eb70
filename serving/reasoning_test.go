package serving

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/serving/gguf"
)

type reasoningChoice struct {
	Index   int `json:"index"`
	Message struct {
		Content          string  `json:"content"`
		ReasoningContent *string `json:"reasoning_content"`
	} `json:"message"`
	FinishReason string `json:"finish_reason"`
}

type reasoningResponse struct {
	Choices []reasoningChoice `json:"choices"`
	Usage   Usage             `json:"usage"`
	Error   *struct {
		Param *string `json:"param"`
		Code  *string `json:"code"`
	} `json:"error"`
}

func reasoningChat(t *testing.T, e *Engine, body map[string]any) (int, reasoningResponse) {
	t.Helper()
	w := call(t, e, context.Background(), http.MethodPost, "/v1/chat/completions", body)
	var r reasoningResponse
	if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil {
		t.Fatalf("decoding %q: %v", w.Body.String(), err)
	}
	return w.Code, r
}

// countTokens is the oracle for reasoning lengths: the demo vocabulary is
// byte level, so a text's token count does not depend on which of the
// equivalent tokens (▁ or <0x20>) the model sampled.
func countTokens(t *testing.T, e *Engine, text string) int {
	t.Helper()
	toks, err := e.model.Tokenize(text, false, true)
	if err != nil {
		t.Fatal(err)
	}
	return len(toks)
}

func reasoningBody(prompt string, maxTokens int, extra map[string]any) map[string]any {
	b := greedy("molly-demo", prompt, maxTokens)
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func TestDemoTemplateDefinesThinkDelimiters(t *testing.T) {
	e := newEngine(t, nil)
	sp := e.reasoning
	if sp.start != "<think>" || sp.end != "</think>" {
		t.Fatalf("delimiters %q %q, want <think> </think> from the demo template", sp.start, sp.end)
	}
	if len(sp.startToks) != 1 || sp.startToks[0] != gguf.TokenThink || len(sp.endToks) != 1 || sp.endToks[0] != gguf.TokenThinkEnd {
		t.Fatalf("delimiter tokens %v %v, want [%d] [%d]", sp.startToks, sp.endToks, gguf.TokenThink, gguf.TokenThinkEnd)
	}
	if got := string(e.model.TokenPiece(gguf.TokenThinkEnd)); got != "</think>" {
		t.Fatalf("</think> renders as %q", got)
	}
}

func TestBudgetForcingEndsReasoningAtTheBudget(t *testing.T) {
	e := newEngine(t, nil)
	const budget = 12
	// The unconstrained chain, the reference for what the model thinks.
	code, free := reasoningChat(t, e, reasoningBody("explain budgets", 300, map[string]any{"max_reasoning_tokens": 280}))
	if code != http.StatusOK || free.Choices[0].Message.ReasoningContent == nil {
		t.Fatalf("status %d %+v", code, free)
	}
	full := *free.Choices[0].Message.ReasoningContent
	if n := countTokens(t, e, full); n <= budget {
		t.Fatalf("the greedy chain ends its reasoning by itself after %d tokens; the test needs more than %d", n, budget)
	}
	code, r := reasoningChat(t, e, reasoningBody("explain budgets", 40, map[string]any{"reasoning_effort": "low", "max_reasoning_tokens": budget}))
	if code != http.StatusOK {
		t.Fatalf("status %d %+v", code, r)
	}
	c := r.Choices[0]
	reasoning := *c.Message.ReasoningContent
	if n := countTokens(t, e, reasoning); n != budget {
		t.Errorf("reasoning has %d tokens, want the budget %d: %q", n, budget, reasoning)
	}
	if !strings.HasPrefix(full, reasoning) {
		t.Errorf("forced reasoning %q is not the prefix of the greedy chain %q", reasoning, full)
	}
	d := r.Usage.CompletionTokensDetails
	if d == nil || d.ReasoningTokens != budget+1 {
		t.Fatalf("usage %+v, want %d reasoning tokens (budget + </think>)", r.Usage, budget+1)
	}
	// max_tokens counts reasoning and answer: the answer has the rest.
	if c.FinishReason != "length" || r.Usage.CompletionTokens != 40 {
		t.Errorf("finish %q, %d completion tokens; want length at 40", c.FinishReason, r.Usage.CompletionTokens)
	}
	if n := countTokens(t, e, c.Message.Content); n != 40-(budget+1) {
		t.Errorf("answer has %d tokens, want %d: %q", n, 40-(budget+1), c.Message.Content)
	}
	// The prompt ends with <think>: one token more than without reasoning.
	_, plain := reasoningChat(t, e, reasoningBody("explain budgets", 1, nil))
	if r.Usage.PromptTokens != plain.Usage.PromptTokens+1 {
		t.Errorf("prompt tokens %d, want %d + <think>", r.Usage.PromptTokens, plain.Usage.PromptTokens)
	}
}

func TestMinimumReasoningSuppressesTheEndDelimiter(t *testing.T) {
	e := newEngine(t, nil)
	const minTokens, n = 60, 8
	body := func(extra map[string]any) map[string]any {
		b := reasoningBody("think about it", 160, map[string]any{"max_reasoning_tokens": 150, "temperature": 1, "seed": 7, "n": n})
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	lengths := func(r reasoningResponse) []int {
		var out []int
		for _, c := range r.Choices {
			out = append(out, countTokens(t, e, *c.Message.ReasoningContent))
		}
		return out
	}
	code, free := reasoningChat(t, e, body(nil))
	if code != http.StatusOK {
		t.Fatalf("status %d %+v", code, free)
	}
	early := 0
	for _, l := range lengths(free) {
		if l < minTokens {
			early++
		}
	}
	if early == 0 {
		t.Fatalf("no chain of seed 7 ends its reasoning before %d tokens (%v); the test needs one", minTokens, lengths(free))
	}
	code, r := reasoningChat(t, e, body(map[string]any{"min_reasoning_tokens": minTokens}))
	if code != http.StatusOK {
		t.Fatalf("status %d %+v", code, r)
	}
	for i, l := range lengths(r) {
		if l < minTokens {
			t.Errorf("choice %d reasoned %d tokens, below the minimum %d", i, l, minTokens)
		}
	}
	t.Logf("reasoning lengths without minimum %v, with minimum %d: %v", lengths(free), minTokens, lengths(r))
}

func TestReasoningStreamsBeforeTheAnswer(t *testing.T) {
	e := newEngine(t, nil)
	body := reasoningBody("stream it", 30, map[string]any{"max_reasoning_tokens": 10})
	_, whole := reasoningChat(t, e, body)
	body["stream"] = true
	body["stream_options"] = map[string]any{"include_usage": true}
	chunks := streamChat(t, e, body)
	var reasoning, content strings.Builder
	var usage *Usage
	for _, c := range chunks {
		if c.Usage != nil {
			usage = c.Usage
		}
		for _, ch := range c.Choices {
			var raw struct {
				Delta struct {
					ReasoningContent string `json:"reasoning_content"`
				} `json:"delta"`
			}
			js, _ := json.Marshal(c.Raw["choices"])
			var arr []json.RawMessage
			_ = json.Unmarshal(js, &arr)
			_ = json.Unmarshal(arr[0], &raw)
			if raw.Delta.ReasoningContent != "" && content.Len() > 0 {
				t.Fatalf("reasoning delta %q after answer text %q", raw.Delta.ReasoningContent, content.String())
			}
			reasoning.WriteString(raw.Delta.ReasoningContent)
			content.WriteString(ch.Delta.Content)
		}
	}
	w := whole.Choices[0].Message
	if reasoning.String() != *w.ReasoningContent || content.String() != w.Content {
		t.Errorf("stream reasoning %q content %q; non-streamed %q %q", reasoning.String(), content.String(), *w.ReasoningContent, w.Content)
	}
	if usage == nil || usage.CompletionTokensDetails == nil || usage.CompletionTokensDetails.ReasoningTokens != 11 {
		t.Errorf("stream usage %+v, want 11 reasoning tokens", usage)
	}
}

func TestReasoningEffortNoneClosesTheBlock(t *testing.T) {
	e := newEngine(t, nil)
	_, plain := reasoningChat(t, e, reasoningBody("answer now", 5, nil))
	code, r := reasoningChat(t, e, reasoningBody("answer now", 5, map[string]any{"reasoning_effort": "none"}))
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	closed := countTokens(t, e, "<think>\n\n</think>\n\n")
	if r.Usage.PromptTokens != plain.Usage.PromptTokens+closed || r.Usage.CompletionTokensDetails != nil || r.Choices[0].Message.ReasoningContent != nil {
		t.Errorf("usage %+v, reasoning %v; want %d+%d prompt tokens and no reasoning", r.Usage, r.Choices[0].Message.ReasoningContent, plain.Usage.PromptTokens, closed)
	}
	if plain.Usage.CompletionTokensDetails != nil || plain.Choices[0].Message.ReasoningContent != nil {
		t.Errorf("a request without reasoning fields got reasoning: %+v", plain)
	}
}

func TestEveryReasoningEffortOfTheAPIHasABudget(t *testing.T) {
	// Low, medium and high configured; xhigh and max take their defaults
	// (twice the budget below: 8 and 16) on one engine, and a configured
	// xhigh below high is raised to high's on the other.
	e := newEngine(t, func(c *Config) { c.Reasoning = ReasoningConfig{Low: 2, Medium: 3, High: 4} })
	raised := newEngine(t, func(c *Config) { c.Reasoning = ReasoningConfig{Low: 2, Medium: 3, High: 4, XHigh: 1} })
	code, free := reasoningChat(t, e, reasoningBody("explain budgets", 300, map[string]any{"max_reasoning_tokens": 280}))
	if code != http.StatusOK || free.Choices[0].Message.ReasoningContent == nil {
		t.Fatalf("status %d %+v", code, free)
	}
	if n := countTokens(t, e, *free.Choices[0].Message.ReasoningContent); n <= 16 {
		t.Fatalf("the greedy chain ends its reasoning by itself after %d tokens; the test needs more than 16", n)
	}
	for _, tc := range []struct {
		e      *Engine
		effort string
		budget int
	}{
		{e, "low", 2}, {e, "medium", 3}, {e, "high", 4}, {e, "xhigh", 8}, {e, "max", 16},
		{raised, "xhigh", 4}, {raised, "max", 8},
	} {
		code, r := reasoningChat(t, tc.e, reasoningBody("explain budgets", 40, map[string]any{"reasoning_effort": tc.effort}))
		if code != http.StatusOK || r.Choices[0].Message.ReasoningContent == nil {
			t.Errorf("%s: status %d %+v", tc.effort, code, r)
			continue
		}
		if n := countTokens(t, e, *r.Choices[0].Message.ReasoningContent); n != tc.budget {
			t.Errorf("%s: %d reasoning tokens, want the budget %d", tc.effort, n, tc.budget)
		}
	}
	for _, effort := range []string{"none", "minimal"} {
		code, r := reasoningChat(t, e, reasoningBody("explain budgets", 5, map[string]any{"reasoning_effort": effort}))
		if code != http.StatusOK || r.Choices[0].Message.ReasoningContent != nil {
			t.Errorf("%s: status %d %+v, want 200 without reasoning", effort, code, r)
		}
	}
}

func TestBadReasoningFieldsAre400(t *testing.T) {
	e := newEngine(t, nil)
	for _, tc := range []struct {
		extra map[string]any
		param string
	}{
		{map[string]any{"reasoning_effort": "extreme"}, "reasoning_effort"},
		{map[string]any{"reasoning_effort": "XHIGH"}, "reasoning_effort"},
		{map[string]any{"reasoning_effort": 3}, "reasoning_effort"},
		{map[string]any{"reasoning_effort": "none", "max_reasoning_tokens": 5}, "reasoning_effort"},
		{map[string]any{"max_reasoning_tokens": 0}, "max_reasoning_tokens"},
		{map[string]any{"max_reasoning_tokens": 2.5}, "max_reasoning_tokens"},
		{map[string]any{"max_reasoning_tokens": 5, "min_reasoning_tokens": 6}, "min_reasoning_tokens"},
	} {
		code, r := reasoningChat(t, e, reasoningBody("x", 5, tc.extra))
		if code != http.StatusBadRequest || r.Error == nil || r.Error.Param == nil || *r.Error.Param != tc.param {
			t.Errorf("%v: status %d error %+v, want 400 on %s", tc.extra, code, r.Error, tc.param)
		}
	}
}

func TestConfiguredMultiTokenDelimitersAreForcedWhole(t *testing.T) {
	e := newEngine(t, func(c *Config) { c.Reasoning = ReasoningConfig{Start: "[plan]", End: "[/plan]", Low: 9} })
	if n := countTokens(t, e, "[/plan]"); n != 7 {
		t.Fatalf("[/plan] is %d tokens, want 7 (byte level)", n)
	}
	code, r := reasoningChat(t, e, reasoningBody("plan it", 30, map[string]any{"reasoning_effort": "low"}))
	if code != http.StatusOK {
		t.Fatalf("status %d %+v", code, r)
	}
	reasoning := *r.Choices[0].Message.ReasoningContent
	if n := countTokens(t, e, reasoning); n != 9 || strings.Contains(reasoning, "[/plan]") {
		t.Errorf("reasoning %q has %d tokens, want the low budget 9 without the delimiter", reasoning, n)
	}
	if d := r.Usage.CompletionTokensDetails; d == nil || d.ReasoningTokens != 9+7 {
		t.Errorf("usage %+v, want 16 reasoning tokens", r.Usage)
	}
	if n := countTokens(t, e, r.Choices[0].Message.Content); n != 30-16 {
		t.Errorf("answer %q has %d tokens, want %d", r.Choices[0].Message.Content, n, 30-16)
	}
}

func TestAGrammarConstrainsTheAnswerNotTheReasoning(t *testing.T) {
	e := newEngine(t, nil)
	free := 0
	for seed := range 6 {
		code, r := reasoningChat(t, e, reasoningBody("json please", 60, map[string]any{
			"seed": seed, "temperature": 1, "max_reasoning_tokens": 8,
			"response_format": map[string]any{"type": "json_object"},
		}))
		if code != http.StatusOK || r.Choices[0].Message.ReasoningContent == nil {
			t.Fatalf("seed %d: status %d %+v", seed, code, r)
		}
		c := r.Choices[0].Message
		if first, ok := jsonPrefix(c.Content); !ok || first != json.Delim('{') {
			t.Errorf("seed %d: answer %q is not the start of a JSON object", seed, c.Content)
		}
		if _, ok := jsonPrefix(*c.ReasoningContent); !ok {
			free++
		}
	}
	// The random model's reasoning is not JSON: the grammar left it alone.
	if free == 0 {
		t.Error("every reasoning block was a JSON prefix: was the grammar applied to it?")
	}
}
