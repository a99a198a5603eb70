# Governed tools: may a gateway tool be offered to a model, and
# may this call of it run?
#
# tool_offer: input tool {name, side_effect}, identity {member, scopes,
# tools, ...}, tier (of the target the request goes to). Output {allow,
# reasons}; anything else does not offer the tool.
#
# tool_decision: input tool {name, side_effect}, arguments {findings (count
# per entity type; never the values), sensitivity}, identity {member,
# scopes, tools, ...}, tier (of the model that asked), and for a money tool
# amount_minor and currency when the arguments carry them. Output {allow,
# reasons}. Anything else denies.
#
# The tool scope is matched with scope_admits (residency.rego).
package molly.policy

import rego.v1

# Tiers whose models may move money: ours, never an external API's.
tool_money_tiers := {"T0", "T1", "T2"}

# Largest amount a model may move in one call, in minor units.
tool_money_limit_minor := 100000

tool_decision := {"allow": count(tool_denials) == 0, "reasons": sort(tool_denials)}

tool_denials contains sprintf("tool %s is not in the tool scope of member %s", [input.tool.name, input.identity.member]) if {
	not tool_in_scope
}

tool_denials contains sprintf("money tool %s may not be called by a %s model", [input.tool.name, input.tier]) if {
	input.tool.side_effect == "money"
	not input.tier in tool_money_tiers
}

tool_denials contains sprintf("amount %v is over the limit of %d minor units", [input.amount_minor, tool_money_limit_minor]) if {
	input.tool.side_effect == "money"
	input.amount_minor > tool_money_limit_minor
}

tool_denials contains "the amount is not an integer number of minor units" if {
	input.tool.side_effect == "money"
	"amount_minor" in object.keys(input)
	not is_integer(input.amount_minor)
}

tool_denials contains "the tool call input is incomplete" if not tool_input_complete

tool_input_complete if {
	is_string(input.tool.name)
	is_string(input.tool.side_effect)
	is_string(input.identity.member)
	is_string(input.tier)
}

tool_denials contains sprintf("unknown side effect %v", [object.get(input.tool, "side_effect", null)]) if {
	not input.tool.side_effect in {"read", "write", "money"}
}

is_integer(x) if {
	is_number(x)
	round(x) == x
}

# An empty tool scope (or none: anonymous, unscoped keys) admits every tool.
tool_in_scope if count(object.get(input.identity, "tools", [])) == 0

tool_in_scope if scope_admits(input.identity.tools, input.tool.name)

# Tiers whose models are offered governed tools: ours, not an external
# API's, which could otherwise open tickets or read records on a member's
# behalf. Extend in Rego (`tool_offer_tiers contains "T3"`) or with data,
# e.g. {"molly": {"config": {"tool_offer_tiers": ["T3"]}}} in a data.json.
tool_offer_tiers contains t if some t in ["T0", "T1", "T2"]

tool_offer_tiers contains t if some t in data.molly.config.tool_offer_tiers

tool_offer := {"allow": count(tool_offer_denials) == 0, "reasons": sort(tool_offer_denials)}

tool_offer_denials contains sprintf("tool %s is not in the tool scope of member %s", [input.tool.name, input.identity.member]) if {
	not tool_in_scope
}

tool_offer_denials contains sprintf("tool %s is not offered to %s models", [input.tool.name, input.tier]) if {
	not tool_offered_to_tier
}

tool_offer_denials contains "the tool offer input is incomplete" if not tool_input_complete

tool_offered_to_tier if input.tier in tool_offer_tiers
