package orchestrate

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.uber.org/zap"
)

// Issue kinds of the meta-cognition check.
const (
	IssueCoverage    = "coverage"    // a part of the request has no (complete) answer
	IssueConsistency = "consistency" // alternatives of one subtask disagree
	IssuePolicy      = "policy"      // the answer breaks a rule (a placeholder the user cannot read, a denied subtask)
)

// Issue is one finding of the meta-cognition check.
type Issue struct {
	Kind    string `json:"kind"`
	Subtask string `json:"subtask,omitempty"`
	Detail  string `json:"detail"`
	// refinable: re-invoking Subtask may fix it (not for a part no
	// subtask reads, nor for a subtask the policy denied).
	refinable bool
}

// placeholderRe matches the placeholders the vault issues ("[EMAIL_1]",
// "[CREDIT_CARD_2]"): one left in an answer is text the user cannot read.
var placeholderRe = regexp.MustCompile(`\[[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_[0-9]+\]`)

// check is the meta-cognition check of the composed answer, before it is
// returned:
//
//   - coverage: every part of the last user message is read by a subtask
//     that answered; every subtask the answer is composed of answered,
//     not empty and not cut off at its token budget (finish_reason
//     "length");
//   - internal consistency: the alternatives of a subtask agree (fuse);
//   - policy conformance: no subtask the answer needs was denied, and the
//     answer holds no vault placeholder the client did not write itself.
//
// It is deterministic and reads no model: it checks what the gateway can
// know, not whether an answer is right.
func (rn *run) check(answer string) []Issue {
	var issues []Issue
	seen := map[string]bool{}
	add := func(i Issue) {
		k := i.Kind + "|" + i.Subtask + "|" + i.Detail
		if !seen[k] {
			seen[k] = true
			issues = append(issues, i)
		}
	}
	nparts := max(len(rn.parts.Items), 1)
	for part := range nparts {
		var readers []string
		for _, s := range rn.plan.Subtasks {
			for _, in := range s.Inputs {
				if in == InputConversation || in == InputLastUser || in == inputPart+strconv.Itoa(part) ||
					in == inputMessage+strconv.Itoa(len(rn.msgs)-1) {
					readers = append(readers, s.ID)
					break
				}
			}
		}
		if len(readers) == 0 {
			add(Issue{Kind: IssueCoverage, Detail: fmt.Sprintf("part %d of the request is read by no subtask", part+1)})
			continue
		}
		answered := false
		for _, id := range readers {
			if r := rn.result(id); r != nil && r.ok {
				answered = true
			}
		}
		if !answered {
			r := rn.result(readers[0])
			why := "no answer"
			if r != nil && r.err != "" {
				why = r.err
			}
			add(Issue{Kind: IssueCoverage, Subtask: readers[0], Detail: fmt.Sprintf("part %d of the request has no answer: %s", part+1, why),
				refinable: r == nil || !r.denied})
		}
	}
	composed := rn.plan.Compose.Order
	if rn.plan.Compose.Mode == ComposeFinal {
		composed = []string{rn.plan.Compose.Subtask}
	}
	for _, id := range composed {
		r := rn.result(id)
		switch {
		case r == nil || !r.ok:
			why := "no answer"
			if r != nil && r.err != "" {
				why = r.err
			}
			kind := IssueCoverage
			if r != nil && r.denied {
				kind = IssuePolicy
			}
			add(Issue{Kind: kind, Subtask: id, Detail: "no answer: " + why, refinable: r == nil || !r.denied})
		case strings.TrimSpace(r.out) == "":
			add(Issue{Kind: IssueCoverage, Subtask: id, Detail: "the answer is empty", refinable: true})
		case r.finish == "length":
			add(Issue{Kind: IssueCoverage, Subtask: id, Detail: "the answer was cut off at its token budget", refinable: true})
		}
	}
	for _, s := range rn.plan.Subtasks {
		if r := rn.result(s.ID); r != nil && len(r.disagree) > 0 {
			add(Issue{Kind: IssueConsistency, Subtask: s.ID, Detail: fmt.Sprintf("its %d alternatives disagree", len(r.disagree)), refinable: true})
		}
	}
	client := rn.a.Body()
	for _, ph := range placeholderRe.FindAllString(answer, -1) {
		if strings.Contains(client, ph) {
			continue
		}
		owner := ""
		for _, s := range rn.plan.Subtasks {
			if r := rn.result(s.ID); r != nil && strings.Contains(r.out, ph) {
				owner = s.ID
				break
			}
		}
		add(Issue{Kind: IssuePolicy, Subtask: owner, Detail: "the answer holds the placeholder " + ph + ", which the user cannot read", refinable: owner != ""})
	}
	return issues
}

// critique is what a refinement tells subtask id about its issues.
func critique(id string, issues []Issue, r *result) string {
	var found []string
	for _, i := range issues {
		if i.Subtask == id {
			found = append(found, i.Detail)
		}
	}
	if len(found) == 0 || r == nil || !r.ok {
		return "" // no answer to refine: the subtask runs again as planned
	}
	msg := "A review of your answer found: " + strings.Join(found, "; ") + "."
	if len(r.disagree) > 0 {
		msg += " The answers given were: " + strings.Join(quoteAll(r.disagree), ", ") + "."
	}
	return msg + " Revise your answer to fix this, completely and concisely, and reply with the revised answer only."
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strconv.Quote(shorten(v, 200))
	}
	return out
}

// Reasons refinement stops with issues left (Uncertainty.Stopped).
const (
	StoppedBudget         = "budget"
	StoppedMaxRefinements = "max_refinements"
	StoppedNotRefinable   = "not_refinable"
)

// refine checks the composed answer and, while issues remain that
// re-invoking a subtask may fix, re-runs those subtasks with the critique
// (and every subtask depending on them), at most max_refinements rounds
// and only while the round's worst case fits what is left of the plan's
// budget. It returns the last composed answer and, when issues remain,
// the uncertainty annotation.
func (rn *run) refine() (string, *Uncertainty) {
	for round := 1; ; round++ {
		answer := rn.compose()
		issues := rn.check(answer)
		if len(issues) == 0 || rn.ctx.Err() != nil {
			return answer, nil
		}
		var targets []string
		for _, i := range issues {
			if i.refinable && i.Subtask != "" && !contains(targets, i.Subtask) {
				targets = append(targets, i.Subtask)
			}
		}
		stop := ""
		closure := rn.plan.dependents(targets)
		var worst Cost
		worstOut := 0 // the round's completion tokens at most
		for _, id := range closure {
			s := rn.byID[id]
			w := rn.subtaskWorst(s, true)
			worst.Tokens += s.Alternatives * w.Tokens
			worst.CostUSD += float64(s.Alternatives) * w.CostUSD
			if s.Specialist.Tool == "" {
				worstOut += s.Alternatives * s.Budget.MaxTokens
			}
		}
		spent := rn.spentNow()
		spent.Tokens, spent.CostUSD = spent.Tokens-rn.admitted.Tokens, spent.CostUSD-rn.admitted.CostUSD
		switch {
		case len(targets) == 0:
			stop = StoppedNotRefinable
		case round > *rn.plan.MaxRefinements:
			stop = StoppedMaxRefinements
		case spent.Tokens+worst.Tokens > rn.budget.Tokens || spent.CostUSD+worst.CostUSD > rn.budget.CostUSD+1e-9:
			stop = StoppedBudget
		case rn.a.MaxTokens() > 0 && rn.spentCompletionNow()+worstOut > rn.a.MaxTokens():
			stop = StoppedBudget // the client's max_tokens bounds the answer's completion tokens
		}
		if stop != "" {
			u := &Uncertainty{Stopped: stop, Issues: issues}
			rn.rec.mu.Lock()
			rn.rec.Uncertainty = u
			rn.rec.mu.Unlock()
			rn.log.Info("meta-cognition check not passed", zap.String("stopped", stop), zap.Int("issues", len(issues)),
				zap.Int("spent_tokens", spent.Tokens), zap.Float64("spent_usd", spent.CostUSD), zap.Int("round_worst_tokens", worst.Tokens),
				zap.Float64("round_worst_usd", worst.CostUSD))
			return answer, u
		}
		critiques := map[string]string{}
		for _, id := range targets {
			critiques[id] = critique(id, issues, rn.result(id))
		}
		rn.rec.mu.Lock()
		rn.rec.Refinements = append(rn.rec.Refinements, RefinementRecord{Round: round, Subtasks: closure, Issues: issues,
			WorstCase: Cost{Tokens: worst.Tokens, CostUSD: round6(worst.CostUSD)}})
		rn.rec.mu.Unlock()
		rn.log.Info("refinement", zap.Int("round", round), zap.Strings("subtasks", closure), zap.Int("issues", len(issues)))
		rn.progress(fmt.Sprintf("molly refinement %d: %s", round, strings.Join(closure, ", ")))
		rn.execute(closure, critiques)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
