package orchestrate

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/molly-gateway/molly/router/pipeline"
)

// VoteWords is the longest answer (in words) self-consistency voting
// compares; longer answers are ranked by score alone.
const VoteWords = 32

// score is one alternative's rank.
type score struct{ fused, confidence float64 }

// fuse picks one answer among a subtask's alternatives (those without an
// error and with a 2xx status):
//
//   - each is scored as the mixture scores its members
//     (pipeline.FusedScore: routing weight × quality prior × answer
//     confidence, after LLM-Blender, Jiang, Ren and Lin, ACL 2023);
//   - when there are several and all are short (VoteWords), they are
//     compared by self-consistency voting (Wang et al., "Self-Consistency
//     Improves Chain of Thought Reasoning in Language Models", ICLR 2023):
//     the answer shared by most alternatives (normalised: case, white
//     space and punctuation) wins, ties going to the higher total score;
//     no answer shared by two is a disagreement (their texts returned);
//   - otherwise the highest score wins.
//
// best is -1 when no alternative answered; fusion describes the choice.
func fuse(answers []pipeline.Answer, errs []error) (best int, fusion string, disagree []string, scores []score) {
	scores = make([]score, len(answers))
	var ok []int
	for i, a := range answers {
		if errs[i] != nil || a.Status/100 != 2 {
			continue
		}
		f, _, c := pipeline.FusedScore(a.Score, a.BestScore, a.Quality, a.Logprob, a.LogprobTokens)
		scores[i] = score{f, c}
		ok = append(ok, i)
	}
	switch len(ok) {
	case 0:
		return -1, "", nil, scores
	case 1:
		return ok[0], fmt.Sprintf("only %d of %d answered", 1, len(answers)), nil, scores
	}
	short := true
	for _, i := range ok {
		short = short && len(strings.Fields(answers[i].Content)) <= VoteWords
	}
	best = ok[0]
	for _, i := range ok {
		if scores[i].fused > scores[best].fused {
			best = i
		}
	}
	if !short {
		return best, fmt.Sprintf("score: best fused %.4f of %d", scores[best].fused, len(ok)), nil, scores
	}
	votes, total := map[string]int{}, map[string]float64{}
	for _, i := range ok {
		k := normalise(answers[i].Content)
		votes[k]++
		total[k] += scores[i].fused
	}
	winner := ""
	for _, i := range ok {
		k := normalise(answers[i].Content)
		if winner == "" || votes[k] > votes[winner] || votes[k] == votes[winner] && total[k] > total[winner] {
			winner = k
		}
	}
	if votes[winner] < 2 {
		for _, i := range ok {
			disagree = append(disagree, answers[i].Content)
		}
		return best, fmt.Sprintf("vote: no two of %d agree; best fused %.4f", len(ok), scores[best].fused), disagree, scores
	}
	for _, i := range ok {
		if normalise(answers[i].Content) == winner && (normalise(answers[best].Content) != winner || scores[i].fused > scores[best].fused) {
			best = i
		}
	}
	return best, fmt.Sprintf("vote: %d of %d agree", votes[winner], len(ok)), nil, scores
}

// normalise folds case, white space and punctuation, for voting.
func normalise(s string) string {
	var b strings.Builder
	space := false
	for _, r := range strings.ToLower(s) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			if space && b.Len() > 0 {
				b.WriteByte(' ')
			}
			space = false
			b.WriteRune(r)
		default:
			space = true
		}
	}
	return b.String()
}

// compose turns the outputs into the answer as the plan's compose says:
// final (one subtask's output; when it has none, the sections of those
// that have one), sections (each output under "### <title>", a missing
// one said so) or concat. A single section has no heading.
func (rn *run) compose() string {
	c := rn.plan.Compose
	if c.Mode == ComposeFinal {
		if r := rn.result(c.Subtask); r != nil && r.ok {
			return strings.TrimSpace(r.out)
		}
	}
	order := c.Order
	if c.Mode == ComposeFinal || len(order) == 0 {
		order = rn.plan.sinks()
	}
	var parts []string
	answered := 0
	for _, id := range order {
		r := rn.result(id)
		if r != nil && r.ok && strings.TrimSpace(r.out) != "" {
			answered++
		}
	}
	if answered == 0 {
		return ""
	}
	for _, id := range order {
		r, s := rn.result(id), rn.byID[id]
		text := ""
		if r != nil && r.ok {
			text = strings.TrimSpace(r.out)
		}
		if c.Mode == ComposeConcat {
			if text != "" {
				parts = append(parts, text)
			}
			continue
		}
		if text == "" {
			why := "no answer"
			if r != nil && r.err != "" {
				why = "no answer: " + r.err
			}
			text = "_(" + why + ")_"
		}
		if len(order) == 1 {
			parts = append(parts, text)
			continue
		}
		title := s.Title
		if title == "" {
			title = shorten(s.Instruction, 72)
		}
		parts = append(parts, "### "+title+"\n\n"+text)
	}
	return strings.Join(parts, "\n\n")
}
