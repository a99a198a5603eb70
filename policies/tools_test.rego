package molly.policy_test

import rego.v1

import data.molly.policy

tool_call(name, effect, tier, tools) := {
	"tool": {"name": name, "side_effect": effect},
	"arguments": {"findings": {}, "sensitivity": "public"},
	"identity": {"member": "alice", "scopes": [], "tools": tools},
	"tier": tier,
}

test_unscoped_member_may_call_any_tool if {
	policy.tool_decision.allow with input as tool_call("support", "write", "T3", [])
}

test_tool_outside_the_scope_is_denied if {
	d := policy.tool_decision with input as tool_call("payments", "read", "T1", ["support"])
	not d.allow
	d.reasons == ["tool payments is not in the tool scope of member alice"]
}

test_scope_prefix_matches if {
	policy.tool_decision.allow with input as tool_call("payments", "money", "T1", ["pay*"])
}

test_money_from_an_external_model_is_denied if {
	d := policy.tool_decision with input as tool_call("payments", "money", "T3", [])
	not d.allow
	d.reasons == ["money tool payments may not be called by a T3 model"]
}

test_money_under_the_limit_from_t2_is_allowed if {
	policy.tool_decision.allow with input as object.union(tool_call("payments", "money", "T2", []), {"amount_minor": 100000, "currency": "EUR"})
}

test_money_over_the_limit_is_denied if {
	d := policy.tool_decision with input as object.union(tool_call("payments", "money", "T0", []), {"amount_minor": 100001, "currency": "EUR"})
	not d.allow
	d.reasons == ["amount 100001 is over the limit of 100000 minor units"]
}

test_a_non_integer_amount_is_denied if {
	d := policy.tool_decision with input as object.union(tool_call("payments", "money", "T0", []), {"amount_minor": "12", "currency": "EUR"})
	not d.allow
}

test_an_unknown_side_effect_is_denied if {
	not policy.tool_decision.allow with input as tool_call("x", "launch", "T0", [])
}

test_missing_input_denies if {
	d := policy.tool_decision with input as {}
	not d.allow
	"the tool call input is incomplete" in d.reasons
}

offer(name, tier, tools) := {
	"tool": {"name": name, "side_effect": "write"},
	"identity": {"member": "alice", "scopes": [], "tools": tools},
	"tier": tier,
}

test_tools_are_offered_to_self_hosted_models if {
	every tier in ["T0", "T1", "T2"] {
		policy.tool_offer.allow with input as offer("support", tier, [])
	}
}

test_tools_are_not_offered_to_external_models if {
	d := policy.tool_offer with input as offer("support", "T3", [])
	not d.allow
	d.reasons == ["tool support is not offered to T3 models"]
}

test_a_tool_outside_the_scope_is_not_offered if {
	d := policy.tool_offer with input as offer("payments", "T1", ["support", "search*"])
	not d.allow
	d.reasons == ["tool payments is not in the tool scope of member alice"]
}

test_a_tool_in_a_prefix_scope_is_offered if {
	policy.tool_offer.allow with input as offer("search_docs", "T1", ["support", "search*"])
}

test_an_operator_may_offer_tools_to_t3_with_data if {
	policy.tool_offer.allow with input as offer("support", "T3", []) with data.molly.config.tool_offer_tiers as ["T3"]
}

test_an_incomplete_offer_is_refused if {
	d := policy.tool_offer with input as {"tool": {"name": "support"}}
	not d.allow
	"the tool offer input is incomplete" in d.reasons
}
