package molly.policy_test

import rego.v1

import data.molly.policy

subtask(id, kind, name, deps) := {
	"id": id, "specialist": {"kind": kind, "name": name}, "tools": false, "tier_ceiling": "T3",
	"budget": {"max_tokens": 256, "max_cost_usd": 0.01}, "depends_on": deps, "alternatives": 1,
	"inputs": ["part:0"],
}

plan_input(subtasks, depth, fan_out, worst_usd) := {
	"plan": {
		"id": "p1", "planner": "deterministic", "max_refinements": 1,
		"budget": {"max_tokens": 4096, "max_cost_usd": 0.05},
		"subtasks": subtasks,
	},
	"metrics": {"subtasks": count(subtasks), "depth": depth, "fan_out": fan_out, "worst_case": {"tokens": 2048, "cost_usd": worst_usd}},
	"catalogue": {"models": ["chat", "molly-demo:billing", "molly-demo:legal"], "tools": ["support"]},
	"identity": {"member": "alice", "scopes": [], "models": [], "tiers": [], "tools": []},
	"request": {"endpoint": "chat.completions", "model": "molly-orchestrator", "stream": false},
	"capability": {"task": "billing"},
	"sovereignty": {"sensitivity": "public"},
}

two := [subtask("s1", "model", "molly-demo:billing", []), subtask("s2", "model", "molly-demo:legal", [])]

test_a_plan_within_its_limits_runs if {
	d := policy.orchestration with input as plan_input(two, 1, 2, 0.02)
	d.allow
	d.reasons == []
}

test_a_worst_case_over_the_plan_budget_is_denied if {
	d := policy.orchestration with input as plan_input(two, 1, 2, 0.08)
	not d.allow
	d.reasons == ["the plan's worst case of 0.08 USD is over its budget of 0.05 USD"]
}

test_a_budget_over_what_the_member_has_left_is_denied if {
	inp := json.patch(plan_input(two, 1, 2, 0.02), [{"op": "add", "path": "/identity/remaining_usd", "value": 0.03}])
	d := policy.orchestration with input as inp
	not d.allow
	d.reasons == ["the plan's budget of 0.05 USD is over the 0.03 USD left of member alice's budget"]
}

test_a_budget_over_the_orchestration_limit_is_denied if {
	inp := json.patch(plan_input(two, 1, 2, 0.02), [{"op": "replace", "path": "/plan/budget/max_cost_usd", "value": 2}])
	d := policy.orchestration with input as inp
	not d.allow
	d.reasons == ["the plan's budget of 2 USD is over the orchestration limit of 1 USD"]
}

test_the_limits_come_from_data if {
	d := policy.orchestration with input as plan_input(two, 1, 2, 0.02)
		with data.molly.config.orchestration as {"max_fan_out": 1}
	not d.allow
	d.reasons == ["the plan fans out to 2 subtasks at once, over the limit of 1"]
}

test_a_deep_plan_is_denied if {
	d := policy.orchestration with input as plan_input(two, 4, 1, 0.02)
	not d.allow
	d.reasons == ["the plan is 4 subtasks deep, over the limit of 3"]
}

test_too_many_subtasks_are_denied if {
	many := [subtask(sprintf("s%d", [i]), "model", "chat", []) | some i in numbers.range(1, 9)]
	d := policy.orchestration with input as plan_input(many, 1, 4, 0.02)
	not d.allow
	d.reasons == ["the plan has 9 subtasks, over the limit of 8"]
}

test_an_unknown_specialist_is_denied if {
	d := policy.orchestration with input as plan_input([subtask("s1", "model", "gpt-9", [])], 1, 1, 0.01)
	not d.allow
	d.reasons == ["subtask s1: no target serves the specialist model gpt-9"]
}

test_an_unconfigured_tool_is_denied if {
	d := policy.orchestration with input as plan_input([subtask("s1", "tool", "payments", [])], 1, 1, 0)
	not d.allow
	d.reasons == ["subtask s1: no governed tool payments is configured"]
}

test_a_specialist_outside_the_model_scope_is_denied if {
	inp := json.patch(plan_input(two, 1, 2, 0.02), [{"op": "replace", "path": "/identity/models", "value": ["molly-orchestrator", "molly-demo:b*"]}])
	d := policy.orchestration with input as inp
	not d.allow
	d.reasons == ["subtask s2: member alice may not use the model molly-demo:legal"]
}

test_a_tool_outside_the_tool_scope_is_denied if {
	inp := json.patch(plan_input([subtask("s1", "tool", "support", [])], 1, 1, 0), [{"op": "replace", "path": "/identity/tools", "value": ["payments"]}])
	d := policy.orchestration with input as inp
	not d.allow
	d.reasons == ["subtask s1: member alice may not use the tool support"]
}

test_the_operator_lists_the_allowed_specialists if {
	d := policy.orchestration with input as plan_input(two, 1, 2, 0.02)
		with data.molly.config.orchestration as {"specialists": ["molly-demo:billing"]}
	not d.allow
	d.reasons == ["subtask s2: the specialist molly-demo:legal is not among the allowed specialists"]
}

test_too_many_alternatives_are_denied if {
	s := json.patch(subtask("s1", "model", "chat", []), [{"op": "replace", "path": "/alternatives", "value": 5}])
	d := policy.orchestration with input as plan_input([s], 1, 1, 0.01)
	not d.allow
	d.reasons == ["subtask s1 asks for 5 alternatives, over the limit of 3"]
}

test_an_empty_input_is_denied if {
	d := policy.orchestration with input as {}
	not d.allow
	"the orchestration input is incomplete" in d.reasons
}

test_an_unknown_specialist_kind_is_denied if {
	s := json.patch(subtask("s1", "model", "chat", []), [{"op": "replace", "path": "/specialist/kind", "value": "agent"}])
	d := policy.orchestration with input as plan_input([s], 1, 1, 0.01)
	not d.allow
	d.reasons == ["subtask s1: unknown specialist kind agent"]
}
