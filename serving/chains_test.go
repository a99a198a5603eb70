package serving

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/molly-gateway/molly/serving/llama"
)

type voteResponse struct {
	Choices []reasoningChoice `json:"choices"`
	Usage   Usage             `json:"usage"`
	Vote    *Vote             `json:"molly_vote"`
}

func chainBody(n int, extra map[string]any) map[string]any {
	b := reasoningBody("pick a letter", 6, map[string]any{"temperature": 1, "seed": 3})
	if n > 0 {
		b["n_chains"] = n
	}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func postVote(t *testing.T, e *Engine, body map[string]any) voteResponse {
	t.Helper()
	w := call(t, e, context.Background(), http.MethodPost, "/v1/chat/completions", body)
	var r voteResponse
	if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil || w.Code != http.StatusOK {
		t.Fatalf("status %d %q: %v", w.Code, w.Body.String(), err)
	}
	return r
}

// firstChars is the oracle's answer extraction for AnswerRegex "^.(.)": the second character.
func firstChars(r voteResponse) []string {
	var out []string
	for _, c := range r.Choices {
		out = append(out, c.Message.Content[1:2])
	}
	return out
}

func TestChainsVoteByMajorityWithoutAVerifier(t *testing.T) {
	e := newEngine(t, func(c *Config) { c.Reasoning.AnswerRegex = `^.(.)` })
	// The reference: the same chains as plain choices (same seeds per
	// choice), voted on here.
	ref := postVote(t, e, chainBody(0, map[string]any{"n": 8}))
	answers := firstChars(ref)
	count, first := map[string]int{}, map[string]int{}
	for i, a := range answers {
		if _, ok := first[a]; !ok {
			first[a] = i
		}
		count[a]++
	}
	win := answers[0]
	for a, n := range count {
		if n > count[win] || n == count[win] && first[a] < first[win] {
			win = a
		}
	}
	if len(count) < 2 {
		t.Fatalf("all chains answer %q; the test needs disagreement: %v", win, answers)
	}
	wantTie := false
	for a, n := range count {
		wantTie = wantTie || a != win && n == count[win]
	}
	r := postVote(t, e, chainBody(8, nil))
	v := r.Vote
	if v != nil && v.Tie != wantTie {
		t.Errorf("tie %v, want %v", v.Tie, wantTie)
	}
	if v == nil || v.Method != "majority" || v.Winner == nil || *v.Winner != win || v.ChosenChain != first[win] {
		t.Fatalf("vote %+v, want majority for %q (chain %d) from %v", v, win, first[win], answers)
	}
	if len(r.Choices) != 1 || r.Choices[0].Message.Content != ref.Choices[first[win]].Message.Content {
		t.Errorf("answer %+v, want chain %d's %q", r.Choices, first[win], ref.Choices[first[win]].Message.Content)
	}
	for _, ta := range v.Tally {
		if ta.Votes != count[ta.Answer] || ta.Weight != float64(count[ta.Answer]) || ta.First != first[ta.Answer] {
			t.Errorf("tally %+v, want %d votes from chain %d", ta, count[ta.Answer], first[ta.Answer])
		}
	}
	if r.Usage.CompletionTokens != ref.Usage.CompletionTokens || r.Usage.PromptTokens != ref.Usage.PromptTokens {
		t.Errorf("usage %+v, want the 8 chains' %+v", r.Usage, ref.Usage)
	}
	t.Logf("answers %v: %s", answers, v.Explanation)
}

func TestVerifierWeightedVoteFollowsTheTrainedVerifier(t *testing.T) {
	dir := t.TempDir()
	if err := WriteDemo(dir, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, func(c *Config) {
		*c = DemoConfig(dir)
		c.NSeqMax, c.NCtx, c.Threads, c.NBatch = 8, 8*256, 1, 256
		c.Reasoning.AnswerRegex = `^.(.)`
	})
	msgs := []llama.ChatMessage{{Role: "user", Content: "pick a letter"}}
	ref := postVote(t, e, chainBody(0, map[string]any{"n": 8}))
	answers := firstChars(ref)
	// Train the verifier to trust the answer fewest chains give, against
	// the majority.
	count := map[string]int{}
	for _, a := range answers {
		count[a]++
	}
	liked, most := answers[0], 0
	for _, a := range answers {
		if count[a] < count[liked] {
			liked = a
		}
		most = max(most, count[a])
	}
	if count[liked] == most {
		t.Fatalf("every answer has %d votes: %v", most, answers)
	}
	var examples []VerifierExample
	for i, c := range ref.Choices {
		examples = append(examples, VerifierExample{Messages: msgs, Content: c.Message.Content, Correct: answers[i] == liked})
	}
	v, err := e.TrainVerifier(examples, 1e-6)
	if err != nil {
		t.Fatal(err)
	}
	if v.TrainAccuracy != 1 {
		t.Fatalf("train accuracy %v on separable chains", v.TrainAccuracy)
	}
	js, _ := json.Marshal(v)
	if err := os.WriteFile(VerifierPath(filepath.Join(dir, DemoModelFile)), js, 0o644); err != nil {
		t.Fatal(err)
	}
	r := postVote(t, e, chainBody(8, nil))
	vote := r.Vote
	if vote == nil || vote.Method != "verifier" || vote.Winner == nil || *vote.Winner != liked {
		t.Fatalf("vote %+v, want the verifier's %q over %v", vote, liked, answers)
	}
	// Oracle for the scores: the hidden state read by a separate context
	// from the rendered prompt and the content up to the answer (two characters).
	h, err := llama.NewHiddenContext(e.model, 512, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	prompt, _ := e.model.Tokenize("<|im_start|>user\npick a letter<|im_end|>\n<|im_start|>assistant\n", true, true)
	best, bestChain := -1.0, -1
	for i, c := range vote.Chains {
		cont, _ := e.model.Tokenize(ref.Choices[i].Message.Content[:2], false, false)
		hs, err := h.LastStates(prompt, [][]int32{cont})
		if err != nil {
			t.Fatal(err)
		}
		want := v.Score(hs[0])
		if c.Score == nil || math.Abs(*c.Score-want) > 1e-4 {
			t.Errorf("chain %d score %v, want %v", i, c.Score, want)
		}
		if answers[i] == liked && want > best {
			best, bestChain = want, i
		}
	}
	if vote.ChosenChain != bestChain || r.Choices[0].Message.Content != ref.Choices[bestChain].Message.Content {
		t.Errorf("chosen chain %d, want %d (the highest score of %q)", vote.ChosenChain, bestChain, liked)
	}
	t.Logf("answers %v: %s", answers, vote.Explanation)
}

func TestFitVerifierRecoversASeparatingDirection(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const d = 16
	truth := make([]float64, d)
	for k := range truth {
		truth[k] = rng.NormFloat64()
	}
	sample := func(n int) ([][]float32, []bool) {
		var xs [][]float32
		var ys []bool
		for range n {
			x := make([]float32, d)
			z := 0.3
			for k := range x {
				x[k] = float32(rng.NormFloat64())
				z += truth[k] * float64(x[k])
			}
			xs, ys = append(xs, x), append(ys, z > 0)
		}
		return xs, ys
	}
	xs, ys := sample(400)
	v, err := FitVerifier(xs, ys, 1e-3)
	if err != nil {
		t.Fatal(err)
	}
	var dot, nw, nt float64
	for k := range d {
		dot += v.Weights[k] * truth[k]
		nw += v.Weights[k] * v.Weights[k]
		nt += truth[k] * truth[k]
	}
	if cos := dot / math.Sqrt(nw*nt); cos < 0.95 {
		t.Errorf("cosine with the generating direction %.3f, want >= 0.95", cos)
	}
	hx, hy := sample(400)
	right := 0
	for i, x := range hx {
		if (v.Score(x) >= 0.5) == hy[i] {
			right++
		}
	}
	if acc := float64(right) / 400; acc < 0.95 {
		t.Errorf("held-out accuracy %.3f, want >= 0.95", acc)
	}
	if _, err := FitVerifier(xs[:3], []bool{true, true, true}, 0); err == nil {
		t.Error("one class was accepted")
	}
}

func TestBadChainRequestsAre400(t *testing.T) {
	e := newEngine(t, nil)
	for _, extra := range []map[string]any{
		{"n_chains": 0}, {"n_chains": 99}, {"n_chains": 1.5},
		{"n_chains": 2, "n": 2}, {"n_chains": 2, "stream": true}, {"n_chains": 2, "tools": weatherTools},
	} {
		code, r := reasoningChat(t, e, reasoningBody("x", 3, extra))
		if code != http.StatusBadRequest || r.Error == nil || r.Error.Param == nil || *r.Error.Param != "n_chains" {
			t.Errorf("%v: status %d %+v, want 400 on n_chains", extra, code, r.Error)
		}
	}
}

func TestReasoningChainsVoteOnTheAnswerAfterTheBlock(t *testing.T) {
	dir := t.TempDir()
	if err := WriteDemo(dir, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, func(c *Config) {
		*c = DemoConfig(dir)
		c.NSeqMax, c.NCtx, c.Threads, c.NBatch = 8, 8*256, 1, 256
		c.Reasoning.AnswerRegex = `^.(.)`
	})
	extra := map[string]any{"reasoning_effort": "low", "max_reasoning_tokens": 5, "max_tokens": 12}
	ref := postVote(t, e, chainBody(0, map[string]any{"n": 6, "reasoning_effort": "low", "max_reasoning_tokens": 5, "max_tokens": 12}))
	answers := firstChars(ref)
	msgs := []llama.ChatMessage{{Role: "user", Content: "pick a letter"}}
	var examples []VerifierExample
	for i, c := range ref.Choices {
		examples = append(examples, VerifierExample{Messages: msgs, Reasoning: c.Message.ReasoningContent, Content: c.Message.Content, Correct: i%2 == 1})
	}
	v, err := e.TrainVerifier(examples, 1e-6)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(v)
	if err := os.WriteFile(VerifierPath(filepath.Join(dir, DemoModelFile)), js, 0o644); err != nil {
		t.Fatal(err)
	}
	r := postVote(t, e, chainBody(6, extra))
	wantReasoning := 0 // every chain's reasoning tokens and its </think>
	for _, c := range ref.Choices {
		wantReasoning += countTokens(t, e, *c.Message.ReasoningContent) + 1
	}
	if r.Vote == nil || r.Vote.Method != "verifier" || r.Usage.CompletionTokensDetails == nil || r.Usage.CompletionTokensDetails.ReasoningTokens != wantReasoning {
		t.Fatalf("vote %+v usage %+v, want a verifier vote and %d reasoning tokens", r.Vote, r.Usage, wantReasoning)
	}
	// Oracle: the state after <think>, the reasoning, </think> and the
	// content up to the answer, read by a separate hidden-state context.
	h, err := llama.NewHiddenContext(e.model, 512, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	prompt, _ := e.model.Tokenize("<|im_start|>user\npick a letter<|im_end|>\n<|im_start|>assistant\n<think>", true, true)
	for i, c := range r.Vote.Chains {
		rc := ref.Choices[i].Message
		cont, _ := e.model.Tokenize(*rc.ReasoningContent+"</think>"+rc.Content[:2], false, true)
		hs, err := h.LastStates(prompt, [][]int32{cont})
		if err != nil {
			t.Fatal(err)
		}
		if want := v.Score(hs[0]); c.Score == nil || math.Abs(*c.Score-want) > 1e-4 || *c.Answer != answers[i] {
			t.Errorf("chain %d: answer %v score %v, want %q %v", i, c.Answer, c.Score, answers[i], want)
		}
	}
	chosen := ref.Choices[r.Vote.ChosenChain].Message
	if got := r.Choices[0].Message; got.Content != chosen.Content || *got.ReasoningContent != *chosen.ReasoningContent {
		t.Errorf("answer %+v, want chain %d's %+v", got, r.Vote.ChosenChain, chosen)
	}
}
