package serving

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// logit_bias +100 on one token makes a greedy choice that token at every
// step: the output is its piece, max_tokens times (the tokenizer's own
// piece is the oracle). A token id past the vocabulary is a 400.
func TestLogitBiasForcesAndBansTokens(t *testing.T) {
	e := newEngine(t, nil)
	toks, err := e.Tokenize("hello world")
	if err != nil || len(toks) < 2 {
		t.Fatalf("tokenize: %v %v", toks, err)
	}
	y := toks[len(toks)-1]
	if e.model.IsEOG(y) {
		t.Fatalf("token %d ends generation", y)
	}
	body := greedy("molly-demo", "say anything", 6)
	body["logit_bias"] = map[string]any{strconv.Itoa(int(y)): 100}
	text, r := mustText(t, e, body)
	if want := strings.Repeat(string(e.model.TokenPiece(y)), 6); text != want || r.Choices[0].FinishReason != "length" {
		t.Fatalf("with +100 on token %d: %q (%s), want %q", y, text, r.Choices[0].FinishReason, want)
	}

	// -100 on the greedy choice's first token: the first token changes.
	body = greedy("molly-demo", "say anything", 1)
	body["logprobs"] = true
	body["top_logprobs"] = 2
	_, plain := mustText(t, e, body)
	first := plain.Choices[0].Logprobs.Content[0]
	ids, err := e.model.Tokenize(first.Token, false, false)
	if err != nil || len(ids) != 1 {
		t.Fatalf("the first token %q does not tokenize back to one id: %v %v", first.Token, ids, err)
	}
	body["logit_bias"] = map[string]any{strconv.Itoa(int(ids[0])): -100}
	_, banned := mustText(t, e, body)
	if got := banned.Choices[0].Logprobs.Content[0].Token; got == first.Token || got != first.TopLogprobs[1].Token {
		t.Fatalf("with -100 on %q the first token is %q, want the runner-up %q", first.Token, got, first.TopLogprobs[1].Token)
	}

	body = greedy("molly-demo", "x", 1)
	body["logit_bias"] = map[string]any{strconv.Itoa(e.model.NVocab()): 1}
	if code, _ := chat(t, e, body); code != http.StatusBadRequest {
		t.Fatalf("a token id past the vocabulary: %d, want 400", code)
	}
}

// With presence and frequency penalties, each greedy step picks the token
// whose raw logit minus count·frequency − (count > 0)·presence is highest,
// counting the choice's earlier tokens: checked on the raw top_logprobs the
// answer reports (log-softmax differs from the logit by one constant per
// step, so their order is the logits'), OpenAI's formula applied by the
// test. The penalties must change at least one step's choice.
func TestPenaltiesFollowOpenAIsFormula(t *testing.T) {
	e := newEngine(t, nil)
	for _, pen := range []struct{ presence, frequency float64 }{{0, 2}, {2, 0}, {1, 1}} {
		body := greedy("molly-demo", "repeat after me: la la la la", 24)
		body["presence_penalty"] = pen.presence
		body["frequency_penalty"] = pen.frequency
		body["logprobs"] = true
		body["top_logprobs"] = 20
		_, r := mustText(t, e, body)
		counts := map[string]int{}
		changed := false
		for i, c := range r.Choices[0].Logprobs.Content {
			adjusted := func(tok string, lp float64) float64 {
				n := counts[tok]
				if n == 0 {
					return lp
				}
				return lp - float64(n)*pen.frequency - pen.presence
			}
			best, bestTok := math.Inf(-1), ""
			for _, alt := range c.TopLogprobs {
				if a := adjusted(alt.Token, alt.Logprob); a > best {
					best, bestTok = a, alt.Token
				}
			}
			if got := adjusted(c.Token, c.Logprob); got < best-1e-4 {
				t.Fatalf("%+v step %d: chose %q (adjusted %.4f), but %q scores %.4f", pen, i, c.Token, got, bestTok, best)
			}
			if c.Token != c.TopLogprobs[0].Token {
				changed = true
			}
			counts[c.Token]++
		}
		if !changed {
			t.Errorf("%+v: every step took the raw greedy choice; the penalties changed nothing", pen)
		}
	}
}
