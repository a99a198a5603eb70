package orchestrate

import (
	"net/http"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/capability"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// critiqueTokens bounds the critique a refinement adds to a prompt.
const critiqueTokens = 256

// worstOn is the worst case of one answer of out completion tokens to a
// prompt of prompt tokens from model: its price on the costliest target
// serving model at or under ceiling (route's reservation rule: the worst
// case spends on the priciest candidate it may reach).
func (rn *run) worstOn(model, ceiling string, prompt, out int) Cost {
	if rn.prices == nil {
		rn.prices = map[string][]*route.Target{}
		for _, t := range rn.o.p.Catalogue.Targets() {
			for _, m := range t.PolicyView()["models"].([]any) {
				rn.prices[m.(string)] = append(rn.prices[m.(string)], t)
			}
		}
	}
	c := Cost{Tokens: prompt + out}
	limit := tierIndex(ceiling)
	for _, t := range rn.prices[model] {
		if limit >= 0 && tierIndex(t.Tier) > limit {
			continue
		}
		c.CostUSD = max(c.CostUSD, t.Cost(prompt, out))
	}
	return c
}

// promptBound bounds the prompt of subtask s in tokens
// (capability.BoundTokens: bytes, what no tokenizer exceeds): the system
// preamble and instruction, each input (the conversation's bound, a
// part with the preamble, a message, a dependency's output at its full
// budget, a tool's at the tool-result bound), 3 per message and 3 for
// the reply; a refinement adds the previous answer and the critique.
func (rn *run) promptBound(s *Subtask, refine bool) int {
	n := capability.BoundTokens(specialistSystem) + capability.BoundTokens(s.Instruction) + 16 + 3*3 + 3
	preamble := false
	for _, in := range s.Inputs {
		switch {
		case in == InputConversation:
			n += rn.a.PromptBound()
		case in == InputLastUser:
			n += capability.BoundTokens(rn.a.LastUserText()) + 8
		case strings.HasPrefix(in, inputPart):
			i, _ := strconv.Atoi(strings.TrimPrefix(in, inputPart))
			if i < len(rn.parts.Items) {
				n += capability.BoundTokens(rn.parts.Items[i]) + 8
			} else {
				n += capability.BoundTokens(rn.a.LastUserText()) + 8
			}
			preamble = true
		case strings.HasPrefix(in, inputMessage):
			i, _ := strconv.Atoi(strings.TrimPrefix(in, inputMessage))
			if i < len(rn.msgs) {
				n += capability.BoundTokens(messageText(rn.msgs[i])) + 8
			}
		case strings.HasPrefix(in, inputSubtask):
			if d := rn.byID[strings.TrimPrefix(in, inputSubtask)]; d != nil {
				n += rn.outputBound(d) + 16
			}
		}
	}
	if preamble && rn.parts.Preamble != "" {
		n += capability.BoundTokens(rn.parts.Preamble) + 8
	}
	if refine {
		n += rn.outputBound(s) + critiqueTokens + 6
	}
	return n
}

// outputBound bounds the tokens of a subtask's output.
func (rn *run) outputBound(s *Subtask) int {
	if s.Specialist.Tool != "" {
		return rn.o.p.Strategies.ResultTokens()
	}
	return s.Budget.MaxTokens
}

// subtaskWorst is the worst case of one answer to s (one alternative;
// refine: a refinement round's): a direct tool call costs no tokens; the
// tool loop is every round at its growing prompt (route's tool
// reservation); a model answer is one answer at the full budget.
func (rn *run) subtaskWorst(s *Subtask, refine bool) Cost {
	if s.Specialist.Tool != "" {
		return Cost{}
	}
	prompt, out := rn.promptBound(s, refine), s.Budget.MaxTokens
	if !s.Specialist.Tools || rn.o.p.Tools == nil {
		return rn.worstOn(s.Specialist.Model, s.TierCeiling, prompt, out)
	}
	var total Cost
	cfg := rn.o.p.Strategies
	for i := 0; i <= cfg.Steps(); i++ {
		c := rn.worstOn(s.Specialist.Model, s.TierCeiling, prompt+i*(out+cfg.ResultTokens()), out)
		total.Tokens, total.CostUSD = total.Tokens+c.Tokens, total.CostUSD+c.CostUSD
	}
	return total
}

// planWorst is the plan's worst case (every subtask's alternatives) and
// the worst case of one round of refinement of every subtask.
func (rn *run) planWorst() (base, round Cost) {
	for i := range rn.plan.Subtasks {
		s := &rn.plan.Subtasks[i]
		w, r := rn.subtaskWorst(s, false), rn.subtaskWorst(s, true)
		base.Tokens += s.Alternatives * w.Tokens
		base.CostUSD += float64(s.Alternatives) * w.CostUSD
		round.Tokens += s.Alternatives * r.Tokens
		round.CostUSD += float64(s.Alternatives) * r.CostUSD
	}
	return base, round
}

// admit fills the plan's budget (when it sets none: its worst case plus
// max_refinements rounds of refinement), asks the orchestration policy
// about the whole plan, and reserves the budget — the plan's worst case when
// that is more — on the caller's ledger before the first subtask. Errors: 403 plan_denied with the policy's
// reasons; the reservation's 429.
func (rn *run) admit() (release func(), err error) {
	p := rn.plan
	depth, fanOut := p.Depth()
	base, round := rn.planWorst()
	refinements := *p.MaxRefinements
	if p.Budget == nil {
		p.Budget = &Budget{}
	}
	if p.Budget.MaxTokens == 0 {
		p.Budget.MaxTokens = base.Tokens + refinements*round.Tokens
	}
	if p.Budget.MaxCostUSD == 0 {
		p.Budget.MaxCostUSD = round6(base.CostUSD + float64(refinements)*round.CostUSD + 5e-7)
	}
	rn.budget = Cost{Tokens: p.Budget.MaxTokens, CostUSD: p.Budget.MaxCostUSD}
	// The reservation covers the plan's execution whatever its budget
	// says: the default policy denies a worst case over the budget, but
	// the ledger must not depend on a policy rule an operator may drop.
	// Refinement is held to the budget (refine, within its 1e-9 USD of
	// rounding), so the spend never exceeds what is held.
	held := Cost{Tokens: max(rn.budget.Tokens, base.Tokens), CostUSD: max(rn.budget.CostUSD+1e-9, base.CostUSD)}
	base.CostUSD = round6(base.CostUSD)
	in := rn.a.PolicyInput()
	var toolNames []any
	if rn.o.p.Tools != nil {
		for _, s := range rn.o.p.Tools.Tools() {
			if !slices.Contains(rn.o.p.ToolsHidden, s.Name) {
				toolNames = append(toolNames, s.Name)
			}
		}
	}
	var models []any
	for _, m := range catalogueModels(rn.o.p.Catalogue) {
		models = append(models, m)
	}
	input := map[string]any{
		"plan":        rn.policyPlan(),
		"metrics":     map[string]any{"subtasks": len(p.Subtasks), "depth": depth, "fan_out": fanOut, "worst_case": map[string]any{"tokens": base.Tokens, "cost_usd": base.CostUSD}},
		"catalogue":   map[string]any{"models": orEmpty(models), "tools": orEmpty(toolNames)},
		"identity":    rn.parent.Identity.PolicyInput(),
		"request":     in["request"],
		"capability":  in["capability"],
		"sovereignty": in["sovereignty"],
	}
	d := rn.o.policy.DecideOrchestration(rn.ctx, input)
	adm := &Admission{Allow: d.Allow, DecisionID: d.ID, Reasons: d.Reasons, Depth: depth, FanOut: fanOut, WorstCase: base, Budget: rn.budget}
	rn.rec.mu.Lock()
	rn.rec.Admission = adm
	rn.rec.mu.Unlock()
	rn.log.Info("orchestration plan", zap.String("planner", p.Planner), zap.Int("subtasks", len(p.Subtasks)), zap.Int("depth", depth),
		zap.Int("fan_out", fanOut), zap.Int("worst_tokens", base.Tokens), zap.Float64("worst_usd", base.CostUSD),
		zap.Int("budget_tokens", rn.budget.Tokens), zap.Float64("budget_usd", rn.budget.CostUSD), zap.Bool("allow", d.Allow),
		zap.Strings("reasons", d.Reasons), zap.String("orchestration_decision_id", d.ID))
	if rn.ctx.Err() != nil {
		return nil, rn.ctx.Err()
	}
	if !d.Allow {
		msg := "The orchestration plan was denied by policy"
		if len(d.Reasons) > 0 {
			msg += ": " + strings.Join(d.Reasons, "; ")
		}
		return nil, &openai.Error{Status: http.StatusForbidden, Type: "policy_denied", Code: policies.CodePlanDenied, Message: msg + ".",
			Extra: map[string]any{"reasons": orEmptyStrings(d.Reasons), "plan_id": rn.rec.ID, "decision_id": d.ID, "cause": d.Code}}
	}
	rn.admitted = rn.spentNow()
	release, err = rn.reserve(held)
	if err != nil {
		return nil, err
	}
	rn.rec.mu.Lock()
	adm.Reserved = rn.parent.Identity != nil
	rn.rec.mu.Unlock()
	return release, nil
}

// policyPlan is the plan as orchestration.rego sees it: its shape and
// budgets, never its text (instructions, titles, tool arguments).
func (rn *run) policyPlan() map[string]any {
	p := rn.plan
	subs := make([]any, len(p.Subtasks))
	for i, s := range p.Subtasks {
		deps := make([]any, len(s.DependsOn))
		for j, d := range s.DependsOn {
			deps[j] = d
		}
		inputs := make([]any, len(s.Inputs))
		for j, v := range s.Inputs {
			inputs[j] = v
		}
		subs[i] = map[string]any{
			"id": s.ID, "specialist": map[string]any{"kind": s.Specialist.Kind(), "name": s.Specialist.Name()}, "tools": s.Specialist.Tools,
			"tier_ceiling": s.TierCeiling, "budget": map[string]any{"max_tokens": s.Budget.MaxTokens, "max_cost_usd": s.Budget.MaxCostUSD},
			"depends_on": deps, "alternatives": s.Alternatives, "inputs": inputs,
		}
	}
	return map[string]any{"id": p.ID, "planner": plannerKind(p.Planner), "max_refinements": *p.MaxRefinements,
		"budget": map[string]any{"max_tokens": p.Budget.MaxTokens, "max_cost_usd": p.Budget.MaxCostUSD}, "subtasks": subs}
}

func plannerKind(p string) string {
	if strings.HasPrefix(p, "controller") {
		return "controller"
	}
	return PlannerDeterministic
}

func orEmpty(v []any) []any {
	if v == nil {
		return []any{}
	}
	return v
}

func orEmptyStrings(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}
