package serving

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// Parallel chains with a verifier vote: a chat request with
// n_chains N (Molly's extension, or ReasoningConfig.Chains for its adapter)
// runs N chains as N choices of one request, so they share the prompt's KV
// cells (llama_memory_seq_cp, as n>1 does). Each chain's final answer is
// extracted (ReasoningConfig.AnswerRegex / AnswerField), and the answers are
// combined by vote:
//
//   - with a verifier beside the adapter (or the base model) file
//     (VerifierPath), each chain with an answer weighs its verifier score
//     σ(w·h + b), h the base model's last hidden state at the answer's end,
//     and the answer with the largest total weight wins (verifier-weighted
//     majority vote, as in "Efficient Reasoning on the Edge");
//   - without one, each chain weighs 1 (majority vote: self-consistency,
//     Wang et al., ICLR 2023).
//
// Ties go to the answer given first (lowest chain index). The answer is one
// choice: the winning answer's chain with the highest score (the first
// without a verifier), and the response's molly_vote object explains the
// vote: method, every chain's answer and score, the tally, the winner, the
// chosen chain, whether it was a tie, and a sentence. Usage counts every
// chain. Streaming is refused with n_chains > 1 (the vote needs whole
// chains).

// Vote is the molly_vote object of a chained answer.
type Vote struct {
	// Method is "verifier" or "majority".
	Method string       `json:"method"`
	Chains []ChainVote  `json:"chains"`
	Tally  []VoteAnswer `json:"tally"` // by weight, then first chain
	// Winner is the winning answer (nil when no chain had one).
	Winner      *string `json:"winner"`
	ChosenChain int     `json:"chosen_chain"`
	Tie         bool    `json:"tie"`
	Explanation string  `json:"explanation"`
}

// ChainVote is one chain in a Vote: its extracted answer (nil: none), its
// verifier score (nil without a verifier or answer) and finish reason.
type ChainVote struct {
	Index        int      `json:"index"`
	Answer       *string  `json:"answer"`
	Score        *float64 `json:"score,omitempty"`
	FinishReason string   `json:"finish_reason"`
}

// VoteAnswer is one distinct answer's tally: chains that gave it, their
// total weight (verifier scores, or 1 each) and the first chain giving it.
type VoteAnswer struct {
	Answer string  `json:"answer"`
	Votes  int     `json:"votes"`
	Weight float64 `json:"weight"`
	First  int     `json:"first_chain"`
}

// parseChains reads n_chains (default: ReasoningConfig.Chains for the
// adapter). Errors (400): not an integer in 1..NSeqMax, combined with n > 1
// or stream.
func (e *Engine) parseChains(body []byte, adapter string, n int, stream bool) (int, error) {
	r := gjson.GetBytes(body, "n_chains")
	chains := e.reasoning.chains[adapter]
	if r.Exists() && r.Type != gjson.Null {
		if r.Type != gjson.Number || r.Num != float64(int(r.Num)) || r.Num < 1 || int(r.Num) > e.cfg.NSeqMax {
			return 0, badRequest("n_chains", "n_chains must be an integer between 1 and %d", e.cfg.NSeqMax)
		}
		chains = int(r.Num)
	}
	if chains <= 1 {
		return 1, nil
	}
	if n > 1 {
		return 0, badRequest("n_chains", "n_chains and n > 1 cannot be combined: the chains vote on one answer")
	}
	if stream {
		return 0, badRequest("n_chains", "n_chains > 1 cannot stream: the vote needs every chain's whole answer")
	}
	return chains, nil
}

// chainResult is one chain's generated text.
type chainResult struct {
	content, reasoning strings.Builder
	finish             string
}

// serveChains runs req as cr.chains chains, votes and writes the answer.
func (e *Engine) serveChains(w http.ResponseWriter, r *http.Request, cr *completionRequest, req Request, id string, created int64) {
	req.N = cr.chains
	res := make([]chainResult, req.N)
	var fingerprint any
	usage, err := e.Generate(r.Context(), req, func(ev Event) error {
		if ev.Version != "" {
			fingerprint = ev.Version
		}
		c := &res[ev.Index]
		c.content.WriteString(ev.Text)
		c.reasoning.WriteString(ev.Reasoning)
		if ev.Finish != "" {
			c.finish = ev.Finish
		}
		return nil
	})
	if err == nil {
		var v *Vote
		if v, err = e.vote(req, res); err == nil {
			c := &res[v.ChosenChain]
			msg := map[string]any{"role": "assistant", "content": c.content.String()}
			if req.Reasoning != nil {
				msg["reasoning_content"] = c.reasoning.String()
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{
				"id": id, "object": "chat.completion", "created": created, "model": cr.Model,
				"choices":            []any{map[string]any{"index": 0, "message": msg, "finish_reason": c.finish, "logprobs": nil}},
				"usage":              usage,
				"system_fingerprint": fingerprint,
				"molly_vote":         v,
			})
			return
		}
	}
	if r.Context().Err() != nil {
		return
	}
	ae := classify(err)
	writeError(w, ae.status, ae.typ, ae.param, ae.code, ae.msg)
}

// vote extracts every chain's answer, scores the chains with the verifier
// of req's adapter when there is one, and tallies (see the package notes
// above). Errors: an unreadable verifier, hidden-state failures.
func (e *Engine) vote(req Request, res []chainResult) (*Vote, error) {
	ver, err := e.verifierFor(req.Adapter)
	if err != nil {
		return nil, err
	}
	v := &Vote{Method: "majority", Chains: make([]ChainVote, len(res))}
	var conts [][]int32
	var scored []int
	for i := range res {
		content := res[i].content.String()
		v.Chains[i] = ChainVote{Index: i, FinishReason: res[i].finish}
		a, end, ok := e.reasoning.answers.extract(content)
		if !ok {
			continue
		}
		v.Chains[i].Answer = &a
		if ver != nil {
			var rs *string
			if req.Reasoning != nil {
				s := res[i].reasoning.String()
				rs = &s
			}
			toks, err := e.chainTokens(rs, content, end)
			if err != nil {
				return nil, err
			}
			conts = append(conts, toks)
			scored = append(scored, i)
		}
	}
	if ver != nil {
		v.Method = "verifier"
		if len(conts) > 0 {
			hs, err := e.lastHiddenStates(req.Prompt, conts)
			if err != nil {
				return nil, fmt.Errorf("verifier: %w", err)
			}
			for k, i := range scored {
				s := ver.Score(hs[k])
				v.Chains[i].Score = &s
			}
		}
	}
	byAnswer := map[string]int{}
	for _, c := range v.Chains {
		if c.Answer == nil {
			continue
		}
		w := 1.0
		if c.Score != nil {
			w = *c.Score
		}
		k, ok := byAnswer[*c.Answer]
		if !ok {
			k = len(v.Tally)
			byAnswer[*c.Answer] = k
			v.Tally = append(v.Tally, VoteAnswer{Answer: *c.Answer, First: c.Index})
		}
		v.Tally[k].Votes++
		v.Tally[k].Weight += w
	}
	slices.SortStableFunc(v.Tally, func(a, b VoteAnswer) int {
		if c := cmp.Compare(b.Weight, a.Weight); c != 0 {
			return c
		}
		return cmp.Compare(a.First, b.First)
	})
	if len(v.Tally) == 0 {
		v.Explanation = "no chain's answer could be extracted; chain 0 is returned"
		return v, nil
	}
	win := v.Tally[0]
	v.Winner = &win.Answer
	v.ChosenChain = win.First
	best := -1.0
	for _, c := range v.Chains {
		if c.Answer != nil && *c.Answer == win.Answer && c.Score != nil && *c.Score > best {
			best, v.ChosenChain = *c.Score, c.Index
		}
	}
	unit := "votes"
	if v.Method == "verifier" {
		unit = "verifier weight"
	}
	switch {
	case len(v.Tally) > 1 && v.Tally[1].Weight == win.Weight:
		v.Tie = true
		var tied []string
		for _, t := range v.Tally {
			if t.Weight == win.Weight {
				tied = append(tied, strconv.Quote(t.Answer))
			}
		}
		v.Explanation = fmt.Sprintf("tie at %s %.4f between %s: the answer given first (chain %d) wins", unit, win.Weight, strings.Join(tied, ", "), win.First)
	case len(v.Tally) > 1:
		v.Explanation = fmt.Sprintf("%q wins with %s %.4f (%d of %d chains) over %q with %.4f", win.Answer, unit, win.Weight, win.Votes, len(res), v.Tally[1].Answer, v.Tally[1].Weight)
	default:
		v.Explanation = fmt.Sprintf("all %d chains with an answer agree on %q", win.Votes, win.Answer)
	}
	if v.Method == "verifier" {
		v.Explanation += fmt.Sprintf("; chain %d has its highest score", v.ChosenChain)
	}
	return v, nil
}
