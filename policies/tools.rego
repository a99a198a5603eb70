# Governed tools (issue 6): may this call of a gateway tool run?
#
# Input (router/tools.go): tool {name, side_effect}, arguments {findings
# (count per entity type; never the values), sensitivity}, identity
# {member, scopes, tools, ...}, tier (of the model that asked), and for a
# money tool amount_minor and currency when the arguments carry them.
# Output: tool_decision {allow, reasons}. Anything else denies.
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

tool_in_scope if {
	some p in input.identity.tools
	tool_scope_match(p, input.tool.name)
}

tool_scope_match(p, name) if p == name

tool_scope_match(p, name) if {
	endswith(p, "*")
	startswith(name, trim_suffix(p, "*"))
}

# May a governed tool be offered to a model on this tier? Input: tool
# {name, side_effect}, identity, tier. Default: tools in the member's tool
# scope, never to external APIs (a T3 model could otherwise open tickets or
# move money on the member's behalf).
tool_offer_denied_tiers := {"T3"}

tool_offer := {"allow": count(tool_offer_denials) == 0, "reasons": sort(tool_offer_denials)}

tool_offer_denials contains sprintf("tool %s is not in the tool scope of member %s", [input.tool.name, input.identity.member]) if {
	not tool_in_scope
}

tool_offer_denials contains sprintf("tool %s is not offered to %s models", [input.tool.name, input.tier]) if {
	input.tier in tool_offer_denied_tiers
}
