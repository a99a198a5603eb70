package orchestrate

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/molly-gateway/molly/router/capability"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/pipeline"
)

// PlannerDeterministic names the deterministic planner in plans.
const PlannerDeterministic = "deterministic"

// PlannerTarget is the target named in the audit line of a tool subtask
// the deterministic planner planned.
const PlannerTarget = "orchestrator"

// makePlan asks the controller for a plan when one is configured (falling
// back to the deterministic planner when the controller cannot be reached
// or may not see the conversation), validates and normalises it.
func (rn *run) makePlan() error {
	var plan *Plan
	if rn.o.cfg.Controller != "" {
		p, err := rn.controllerPlan()
		var ae *openai.Error
		switch {
		case rn.ctx.Err() != nil:
			return rn.ctx.Err()
		case errors.As(err, &ae) && ae.Code == "invalid_plan":
			return err
		case err != nil:
			rn.log.Warn("the controller did not plan; the deterministic planner does", zap.String("controller", rn.o.cfg.Controller), zap.Error(err))
			rn.rec.mu.Lock()
			rn.rec.PlanErrors = append(rn.rec.PlanErrors, "controller: "+err.Error())
			rn.rec.mu.Unlock()
		default:
			plan = p
		}
	}
	if plan == nil {
		plan = rn.deterministicPlan()
		rn.plannerTier, rn.plannerTarget = pipeline.DirectTier, PlannerTarget
		plan.Planner = PlannerDeterministic
	}
	plan.ID = rn.rec.ID
	plan.normalize(Defaults{Ceiling: rn.o.cfg.TierCeiling, Tokens: rn.subtaskTokens(), Refinements: *rn.o.cfg.MaxRefinements})
	rn.fitClientCap(plan)
	rn.plan, rn.byID = plan, plan.byID()
	rn.rec.mu.Lock()
	rn.rec.Plan, rn.rec.Planner = plan, plan.Planner
	rn.rec.mu.Unlock()
	for i := range plan.Subtasks {
		rn.subtaskRecord(&plan.Subtasks[i])
	}
	return nil
}

// subtaskTokens is a subtask's default completion budget: the configured
// one, or the client's max_tokens when smaller.
func (rn *run) subtaskTokens() int {
	n := rn.o.cfg.SubtaskTokens
	if m := rn.a.MaxTokens(); m > 0 && m < n {
		n = m
	}
	return n
}

// fitClientCap divides the client's max_tokens (max_completion_tokens)
// among the plan's model answers, so that what the answer is billed in
// completion tokens — every subtask's alternatives, and the controller's
// calls already spent — stays within it: each model subtask's budget
// becomes at most (max_tokens − completion tokens spent so far) ÷ (the
// plan's model answers, alternatives counted), at least 1. Refinement is
// held to the same cap (refine). Nothing changes without a max_tokens.
func (rn *run) fitClientCap(p *Plan) {
	m := rn.a.MaxTokens()
	if m <= 0 {
		return
	}
	answers := 0
	for i := range p.Subtasks {
		if p.Subtasks[i].Specialist.Tool == "" {
			answers += p.Subtasks[i].Alternatives
		}
	}
	if answers == 0 {
		return
	}
	share := max((m-rn.spentCompletionNow())/answers, 1)
	for i := range p.Subtasks {
		s := &p.Subtasks[i]
		if s.Specialist.Tool == "" && s.Budget.MaxTokens > share {
			s.Budget.MaxTokens = share
		}
	}
}

// bounds is what the plan's inputs may address.
func (rn *run) bounds() Bounds {
	return Bounds{Messages: len(rn.msgs), Parts: max(len(rn.parts.Items), 1)}
}

// deterministicPlan is the planner without a controller, rules over the
// capability estimate of each part of the last user message (SplitParts):
//
//   - one part: one subtask that sees the conversation;
//   - parts of the same task category form one subtask (its inputs are
//     those parts), in order of first appearance; a part with a
//     dependency cue (buildsOnPrevious) forms a subtask of its own that
//     depends on the subtask of the part before it and reads its output
//     (least-to-most);
//   - a subtask's specialist is the catalogue's adapter for its category
//     ("<model>:<category>", the base model's own first) or the base
//     model (the client's, or Config.Model for ModelName), offered the
//     governed tools when a part names one of them;
//   - the answer is the subtasks' outputs as sections, in order.
func (rn *run) deterministicPlan() *Plan {
	tools := rn.toolNames()
	p := &Plan{Goal: "answer each part of the request"}
	if len(rn.parts.Items) < 2 {
		text := rn.a.LastUserText()
		task := rn.a.Task()
		p.Subtasks = []Subtask{{ID: "s1", Title: shorten(text, 72), Instruction: "Answer the user's request.",
			Inputs: []string{InputConversation}, Specialist: Specialist{Model: rn.specialistFor(task), Tools: namesAny(text, tools)}}}
		return p
	}
	type group struct {
		task  string
		parts []int
		dep   int // index of the group it depends on, -1 for none
		tools bool
	}
	var groups []*group
	partGroup := make([]int, len(rn.parts.Items))
	for i, text := range rn.parts.Items {
		task := rn.parts.Tasks[i]
		if i > 0 && buildsOnPrevious(text) {
			groups = append(groups, &group{task: task, parts: []int{i}, dep: partGroup[i-1], tools: namesAny(text, tools)})
			partGroup[i] = len(groups) - 1
			continue
		}
		j := slices.IndexFunc(groups, func(g *group) bool { return g.task == task && g.dep < 0 })
		if j < 0 {
			groups = append(groups, &group{task: task, dep: -1})
			j = len(groups) - 1
		}
		groups[j].parts = append(groups[j].parts, i)
		groups[j].tools = groups[j].tools || namesAny(text, tools)
		partGroup[i] = j
	}
	for gi, g := range groups {
		s := Subtask{ID: "s" + strconv.Itoa(gi+1), Specialist: Specialist{Model: rn.specialistFor(g.task), Tools: g.tools}}
		var nums, titles []string
		for _, i := range g.parts {
			s.Inputs = append(s.Inputs, inputPart+strconv.Itoa(i))
			nums = append(nums, strconv.Itoa(i+1))
			titles = append(titles, shorten(rn.parts.Items[i], 72))
		}
		s.Title = strings.Join(titles, " / ")
		what := "part " + nums[0]
		if len(nums) > 1 {
			what = "parts " + strings.Join(nums[:len(nums)-1], ", ") + " and " + nums[len(nums)-1]
		}
		s.Instruction = fmt.Sprintf("Answer %s of the user's request (%s).", what, g.task)
		if g.dep >= 0 {
			dep := "s" + strconv.Itoa(g.dep+1)
			s.DependsOn = []string{dep}
			s.Inputs = append(s.Inputs, inputSubtask+dep)
			s.Instruction += " Build on the result of " + dep + "."
		}
		p.Subtasks = append(p.Subtasks, s)
	}
	order := make([]string, len(p.Subtasks))
	for i, s := range p.Subtasks {
		order[i] = s.ID
	}
	p.Compose = &Compose{Mode: ComposeSections, Order: order}
	return p
}

// specialistFor is the model for a subtask of category task: an adapter
// "<model>:<task>" the catalogue serves (the base model's own first),
// else the base model.
func (rn *run) specialistFor(task string) string {
	if task == "" || task == capability.TaskChat {
		return rn.base
	}
	var found string
	for _, m := range catalogueModels(rn.o.p.Catalogue) {
		if !strings.HasSuffix(m, ":"+task) {
			continue
		}
		if strings.TrimSuffix(m, ":"+task) == rn.base {
			return m
		}
		if found == "" {
			found = m
		}
	}
	if found != "" {
		return found
	}
	return rn.base
}

// toolNames are the governed tools the gateway may offer to its own tier
// for the caller, by name.
func (rn *run) toolNames() []string {
	if rn.o.p.Tools == nil {
		return nil
	}
	var out []string
	for _, s := range rn.o.p.OfferedTools(rn.ctx, rn.parent.Identity, pipeline.DirectTier) {
		out = append(out, s.Name)
	}
	return out
}

func namesAny(text string, names []string) bool {
	for _, n := range names {
		if mentions(text, n) {
			return true
		}
	}
	return false
}

// controllerSystem is the controller's instruction; the schema, the
// specialists and the parts follow it.
const controllerSystem = `You are the planner of Molly, a gateway that delegates composite requests to specialists.
Split the user's request (the conversation below) into subtasks and reply with ONE JSON object, nothing else, that validates against this JSON Schema:
%s
Rules: give each subtask the least it needs to see (inputs); an input subtask:<id> needs <id> in depends_on; independent subtasks run in parallel, dependent ones after what they depend on; every specialist must be one of those listed.
Specialist models: %s
Governed tools (specialist {"tool": name, "arguments": {...}}): %s
The last user message is split into parts (input part:<index>):
%s`

// controllerPlan asks the controller for a plan (a request derived from
// the client's, kind "plan", under the controller's tier ceiling, its
// worst case reserved), repairing an invalid plan once: first by Repair,
// then by asking the controller again with the errors. A plan still
// invalid is a 502 invalid_plan naming the errors.
func (rn *run) controllerPlan() (*Plan, error) {
	cfg := rn.o.cfg
	tools := "none"
	var toolList []string
	for _, s := range rn.o.p.OfferedTools(rn.ctx, rn.parent.Identity, cfg.ControllerTier) {
		desc, _ := json.Marshal(map[string]any{"name": s.Name, "description": s.Description, "side_effect": s.SideEffect, "parameters": json.RawMessage(orObject(s.Parameters))})
		toolList = append(toolList, string(desc))
	}
	if len(toolList) > 0 {
		tools = strings.Join(toolList, "; ")
	}
	var parts strings.Builder
	for i, it := range rn.parts.Items {
		fmt.Fprintf(&parts, "part:%d (%s): %s\n", i, rn.parts.Tasks[i], it)
	}
	if parts.Len() == 0 {
		parts.WriteString("(one part: use last_user or conversation)\n")
	}
	system := fmt.Sprintf(controllerSystem, SchemaJSON, strings.Join(catalogueModels(rn.o.p.Catalogue), ", "), tools, parts.String())
	msgs := []any{map[string]any{"role": "system", "content": system}}
	for _, m := range rn.msgs {
		msgs = append(msgs, json.RawMessage(m.Raw))
	}
	msgs = append(msgs, map[string]any{"role": "user", "content": "Plan the request above. Reply with the plan as one JSON object."})
	prompt := rn.a.PromptBound() + capability.BoundTokens(system) + 32
	worst := rn.worstOn(cfg.Controller, cfg.ControllerTier, prompt+cfg.ControllerTokens+64, cfg.ControllerTokens)
	worst.Tokens, worst.CostUSD = 2*worst.Tokens, 2*worst.CostUSD // the plan and one repair
	release, err := rn.reserve(worst)
	if err != nil {
		return nil, err
	}
	defer release()
	var errs []error
	for attempt := 0; attempt < 2; attempt++ {
		body, _ := json.Marshal(map[string]any{"model": cfg.Controller, "messages": msgs, "max_completion_tokens": cfg.ControllerTokens,
			"temperature": 0, "response_format": map[string]any{"type": "json_object"}})
		ans, err := rn.o.p.RunDerived(rn.ctx, rn.parent, pipeline.Derived{Kind: "plan", Body: body, MaxTier: cfg.ControllerTier, Label: "controller"})
		rn.spend(ans.PromptTokens, ans.CompletionTokens, ans.CostUSD)
		if err != nil {
			return nil, err
		}
		if ans.Status/100 != 2 {
			return nil, fmt.Errorf("the controller answered HTTP %d", ans.Status)
		}
		var plan *Plan
		plan, errs = ParsePlan(extractJSON(ans.Content))
		if plan != nil {
			if errs = plan.Validate(rn.bounds()); len(errs) > 0 && plan.Repair() {
				rn.notePlanErrors("repaired", errs)
				errs = plan.Validate(rn.bounds())
			}
		}
		if len(errs) == 0 {
			plan.Planner = "controller:" + ans.Target
			rn.plannerTier, rn.plannerTarget = ans.Tier, ans.Target
			return plan, nil
		}
		rn.notePlanErrors(fmt.Sprintf("attempt %d", attempt+1), errs)
		msgs = append(msgs, map[string]any{"role": "assistant", "content": ans.Content},
			map[string]any{"role": "user", "content": "The plan is invalid: " + joinErrors(errs) + ". Reply with the corrected plan as one JSON object."})
	}
	reasons := make([]string, len(errs))
	for i, e := range errs {
		reasons[i] = e.Error()
	}
	return nil, &openai.Error{Status: http.StatusBadGateway, Type: "upstream_error", Code: "invalid_plan",
		Message: "The controller's plan is invalid after one repair: " + joinErrors(errs) + ".", Extra: map[string]any{"reasons": reasons, "plan_id": rn.rec.ID}}
}

func (rn *run) notePlanErrors(when string, errs []error) {
	rn.rec.mu.Lock()
	defer rn.rec.mu.Unlock()
	for _, e := range errs {
		rn.rec.PlanErrors = append(rn.rec.PlanErrors, when+": "+e.Error())
	}
}

func joinErrors(errs []error) string {
	s := make([]string, len(errs))
	for i, e := range errs {
		s[i] = e.Error()
	}
	return strings.Join(s, "; ")
}

// extractJSON is the JSON object in a model's answer: the text from its
// first "{" to its last "}" (models wrap JSON in prose or code fences).
func extractJSON(s string) []byte {
	i, j := strings.IndexByte(s, '{'), strings.LastIndexByte(s, '}')
	if i < 0 || j < i {
		return []byte(s)
	}
	return []byte(s[i : j+1])
}

func orObject(b json.RawMessage) []byte {
	if len(b) == 0 || !json.Valid(b) {
		return []byte(`{"type":"object"}`)
	}
	return b
}
