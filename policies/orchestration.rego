# Orchestration: may a delegation plan — a typed graph of
# subtasks, each with a specialist, a tier ceiling and a budget — run for
# this caller?
#
# Input (built by router/orchestrate; no request text, no instructions, no
# tool arguments):
#   plan       {id, planner ("deterministic" | "controller"), budget
#               {max_tokens, max_cost_usd}, max_refinements, subtasks:
#               [{id, specialist {kind ("model" | "tool"), name}, tools
#               (governed tools offered to the specialist), tier_ceiling,
#               budget {max_tokens, max_cost_usd}, depends_on [ids],
#               alternatives, inputs [refs]}]}
#   metrics    {subtasks, depth (subtasks on the longest dependency chain),
#               fan_out (most direct dependents of one node, the request
#               itself being the root of the subtasks without dependencies),
#               worst_case {tokens, cost_usd} (every answer at its full token
#               budget on the costliest target its specialist may reach
#               under its ceiling, alternatives and refinements included)}
#   catalogue  {models: [client model names served], tools: [governed tools]}
#   identity, request, capability, sovereignty: as in the route decision's
#               input (the client request's)
# Output: orchestration {allow: bool, reasons: [...]}. Anything else denies
# (403 plan_denied).
#
# Every subtask is then classified on the data it will see and decided by
# the route decision again (input.derived.kind "subtask"): this rule admits
# the plan's shape and budget, never a tier.
package molly.policy

import rego.v1

# Limits of the defaults; override any of them with data, e.g.
# {"molly": {"config": {"orchestration": {"max_fan_out": 6}}}} in a data.json.
orchestration_default_limits := {
	"max_subtasks": 8,
	"max_depth": 3,
	"max_fan_out": 4,
	"max_alternatives": 3,
	"max_refinements": 2,
	"max_cost_usd": 1.0,
	"max_tokens": 65536,
}

orchestration_limits := object.union(orchestration_default_limits, orchestration_config)

default orchestration_config := {}

orchestration_config := data.molly.config.orchestration if is_object(data.molly.config.orchestration)

orchestration := {"allow": count(orchestration_denials) == 0, "reasons": sort(orchestration_denials)}

orchestration_denials contains "the orchestration input is incomplete" if not orchestration_input_complete

orchestration_input_complete if {
	is_array(input.plan.subtasks)
	count(input.plan.subtasks) > 0
	is_number(input.plan.budget.max_cost_usd)
	is_number(input.plan.budget.max_tokens)
	is_number(input.metrics.depth)
	is_number(input.metrics.fan_out)
	is_number(input.metrics.worst_case.cost_usd)
	is_number(input.metrics.worst_case.tokens)
	is_string(input.identity.member)
}

orchestration_denials contains sprintf("the plan has %d subtasks, over the limit of %d", [n, orchestration_limits.max_subtasks]) if {
	n := count(input.plan.subtasks)
	n > orchestration_limits.max_subtasks
}

orchestration_denials contains sprintf("the plan is %d subtasks deep, over the limit of %d", [input.metrics.depth, orchestration_limits.max_depth]) if {
	input.metrics.depth > orchestration_limits.max_depth
}

orchestration_denials contains sprintf("the plan fans out to %d subtasks at once, over the limit of %d", [input.metrics.fan_out, orchestration_limits.max_fan_out]) if {
	input.metrics.fan_out > orchestration_limits.max_fan_out
}

orchestration_denials contains sprintf("subtask %s asks for %d alternatives, over the limit of %d", [s.id, s.alternatives, orchestration_limits.max_alternatives]) if {
	some s in input.plan.subtasks
	s.alternatives > orchestration_limits.max_alternatives
}

orchestration_denials contains sprintf("the plan asks for %d refinements, over the limit of %d", [input.plan.max_refinements, orchestration_limits.max_refinements]) if {
	input.plan.max_refinements > orchestration_limits.max_refinements
}

# Budget: the worst case must fit the plan's own budget, and the budget the
# orchestration limit and what is left of the member's.
orchestration_denials contains sprintf("the plan's worst case of %v USD is over its budget of %v USD", [input.metrics.worst_case.cost_usd, input.plan.budget.max_cost_usd]) if {
	input.metrics.worst_case.cost_usd > input.plan.budget.max_cost_usd
}

orchestration_denials contains sprintf("the plan's worst case of %d tokens is over its budget of %d tokens", [input.metrics.worst_case.tokens, input.plan.budget.max_tokens]) if {
	input.metrics.worst_case.tokens > input.plan.budget.max_tokens
}

orchestration_denials contains sprintf("the plan's budget of %v USD is over the orchestration limit of %v USD", [input.plan.budget.max_cost_usd, orchestration_limits.max_cost_usd]) if {
	input.plan.budget.max_cost_usd > orchestration_limits.max_cost_usd
}

orchestration_denials contains sprintf("the plan's budget of %d tokens is over the orchestration limit of %d tokens", [input.plan.budget.max_tokens, orchestration_limits.max_tokens]) if {
	input.plan.budget.max_tokens > orchestration_limits.max_tokens
}

orchestration_denials contains sprintf("the plan's budget of %v USD is over the %v USD left of member %s's budget", [input.plan.budget.max_cost_usd, input.identity.remaining_usd, input.identity.member]) if {
	is_number(input.identity.remaining_usd)
	input.plan.budget.max_cost_usd > input.identity.remaining_usd
}

orchestration_denials contains sprintf("subtask %s's budget of %v USD is over the plan's budget of %v USD", [s.id, s.budget.max_cost_usd, input.plan.budget.max_cost_usd]) if {
	some s in input.plan.subtasks
	s.budget.max_cost_usd > input.plan.budget.max_cost_usd
}

# Specialists: served by the catalogue (models) or configured (tools),
# inside the member's scopes, and in the operator's list when there is one
# (data.molly.config.orchestration.specialists: names, trailing * = prefix).
orchestration_denials contains sprintf("subtask %s: no target serves the specialist model %s", [s.id, s.specialist.name]) if {
	some s in input.plan.subtasks
	s.specialist.kind == "model"
	not s.specialist.name in {m | some m in input.catalogue.models}
}

orchestration_denials contains sprintf("subtask %s: no governed tool %s is configured", [s.id, s.specialist.name]) if {
	some s in input.plan.subtasks
	s.specialist.kind == "tool"
	not s.specialist.name in {t | some t in input.catalogue.tools}
}

orchestration_denials contains sprintf("subtask %s: member %s may not use the model %s", [s.id, input.identity.member, s.specialist.name]) if {
	some s in input.plan.subtasks
	s.specialist.kind == "model"
	count(object.get(input.identity, "models", [])) > 0
	not scope_admits(input.identity.models, s.specialist.name)
}

orchestration_denials contains sprintf("subtask %s: member %s may not use the tool %s", [s.id, input.identity.member, s.specialist.name]) if {
	some s in input.plan.subtasks
	s.specialist.kind == "tool"
	count(object.get(input.identity, "tools", [])) > 0
	not scope_admits(input.identity.tools, s.specialist.name)
}

orchestration_denials contains sprintf("subtask %s: the specialist %s is not among the allowed specialists", [s.id, s.specialist.name]) if {
	allowed := data.molly.config.orchestration.specialists
	some s in input.plan.subtasks
	not scope_admits(allowed, s.specialist.name)
}

orchestration_denials contains sprintf("subtask %s: unknown specialist kind %v", [object.get(s, "id", null), object.get(s, ["specialist", "kind"], null)]) if {
	some s in input.plan.subtasks
	not object.get(s, ["specialist", "kind"], null) in {"model", "tool"}
}
