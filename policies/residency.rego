# Residency: which tiers a request may reach, from its sensitivity class,
# and the request-level scope rules (model scope, client tool scope, tool
# results that raise the sensitivity).
#
# The decision contract (docs/architecture.md, policies/README.md):
#   {"allow": bool, "tiers": ["T0",...], "redact": {"T3": ["EMAIL",...]},
#    "output": {"T3": {"mask": ["*"], "block": []}},
#    "sensitivity": class (optional), "code": "..." (optional, denials),
#    "max_cost_usd": n (optional), "regions": [..] (optional), "reasons": [...]}
# The input document is described in policies/README.md.
package molly.policy

import rego.v1

# Tiers each sensitivity class may reach: T0 on-device, T1 LAN,
# T2 self-hosted remote, T3 external API.
class_tiers := {
	"public": ["T0", "T1", "T2", "T3"],
	"internal": ["T0", "T1", "T2"],
	"confidential": ["T0", "T1"],
	"restricted": ["T0"],
}

# The classes in increasing order of sensitivity.
class_rank := {"public": 0, "internal": 1, "confidential": 2, "restricted": 3}

# Tiers that may receive content no detector could read (token ids, binary
# media: input.sovereignty.opaque, input.sovereignty.unscanned). By default
# those of the confidential class: what cannot be scanned is treated as
# confidential. An operator opts a tier in with a rule in this package
# (`opaque_tiers contains "T2"`) or with data, e.g. a data.json holding
# {"molly": {"config": {"opaque_tiers": ["T2"]}}}.
opaque_tiers contains t if some t in class_tiers.confidential

opaque_tiers contains t if some t in data.molly.config.opaque_tiers

# Fail closed: anything not matched below denies.
default decision := {
	"allow": false,
	"tiers": [],
	"redact": {},
	"code": "policy_denied",
	"reasons": ["no policy rule matched the request"],
}

decision := object.union(object.union(base, residency), listing) if {
	count(denials) == 0
	base := {
		"allow": count(tiers) > 0,
		"tiers": tiers,
		"sensitivity": effective_class,
		"redact": object.filter(redact, tiers),
		"output": object.filter(output, tiers),
		"reasons": array.concat([concat("", ["sensitivity ", judged_class, " allows ", concat(",", tiers)])], sort(why)),
	}
}

decision := {
	"allow": false,
	"tiers": [],
	"redact": {},
	"code": denial_code,
	"reasons": sort([d.reason | some d in denials]),
} if {
	count(denials) > 0
}

# The tiers the request may reach: those of its class that the member's
# tier scope admits and, for opaque content, that are opted in for it.
tiers := [t | some t in class_tiers[judged_class]; t in tier_scope; t in opaque_ok_tiers; t in stored_ok_tiers]

# A caller whose API key is scoped to some tiers (input.identity.tiers,
# from molly_auth) only reaches those of them the class allows; an empty or
# absent list leaves the class's tiers as they are. An empty intersection
# denies.
tier_scope := input.identity.tiers if count(input.identity.tiers) > 0 else := class_tiers.public

opaque_ok_tiers := opaque_tiers if opaque else := class_tiers.public

# Tiers that may receive a conversation Molly kept in its own store (the
# Responses API's previous_response_id: input.request.stored_conversation):
# by default T0–T2, so what was stored locally is not replayed to an
# external API. An operator opts T3 in with a rule in this package
# (`stored_conversation_tiers contains "T3"`) or with data
# {"molly": {"config": {"stored_conversation_tiers": ["T3"]}}}.
stored_conversation_tiers contains t if some t in class_tiers.internal

stored_conversation_tiers contains t if some t in data.molly.config.stored_conversation_tiers

stored_ok_tiers := stored_conversation_tiers if input.request.stored_conversation == true else := class_tiers.public

# The class the tiers are chosen by: the request's sensitivity (max of
# detected and declared), raised to restricted when a detector failed, since
# a failed detector may have missed anything. An unknown class leaves it
# undefined, which denies.
judged_class := "restricted" if {
	input.sovereignty.scan_failed == true
} else := input.sovereignty.sensitivity if {
	class_tiers[input.sovereignty.sensitivity]
}

# The class the request is treated as, reported in the decision (and by the
# gateway as the parent sensitivity of derived requests): the judged class,
# raised to confidential for opaque content.
effective_class := "confidential" if {
	opaque
	judged_class in {"public", "internal"}
} else := judged_class

# Content no detector read: token ids (opaque) or parts listed as unscanned.
opaque if input.sovereignty.opaque == true

opaque if listed_unscanned

# Parts listed as unscanned: anything but an absent, null or empty list
# counts (fail closed).
listed_unscanned if {
	u := input.sovereignty.unscanned
	not u in {[], null}
}

why contains concat("", ["member ", input.identity.member, " is scoped to tiers ", concat(",", input.identity.tiers)]) if {
	count(input.identity.tiers) > 0
}

# A declared residency region pins the request to targets in that region
# (plus on-device and LAN targets, whose region is "local").
default residency := {}

residency := {"regions": [r, "local"]} if {
	r := input.sovereignty.residency
	r != ""
}

why contains concat("", [t, " detected ", format_int(n, 10), " time(s)"]) if {
	some t, n in input.sovereignty.findings
}

why contains sprintf("declared sensitivity %s", [input.sovereignty.declared]) if {
	input.sovereignty.declared != "public"
}

why contains sprintf("content that cannot be scanned (token ids) is treated as confidential: only %s may receive it", [concat(",", sort(opaque_tiers))]) if {
	input.sovereignty.opaque == true
	not listed_unscanned
}

why contains sprintf("%d part(s) could not be scanned (%s) and are treated as confidential: only %s may receive them", [count(input.sovereignty.unscanned), concat(", ", sort({u.reason | some u in input.sovereignty.unscanned})), concat(",", sort(opaque_tiers))]) if {
	listed_unscanned
}

why contains sprintf("a conversation from Molly's store (previous_response_id) only goes to %s", [concat(",", sort(stored_conversation_tiers))]) if {
	input.request.stored_conversation == true
}

why contains "a detector failed on some content, so the request is treated as restricted" if {
	input.sovereignty.scan_failed == true
}

why contains sprintf("%s of decision %s", [input.derived.kind, input.derived.parent.decision_id]) if {
	is_string(input.derived.kind)
}

# Denials: {"code", "reason"} objects. Any denial refuses the request; the
# decision's code is the first present in denial_order (then by name).
denial_order := ["model_not_allowed", "tool_not_allowed", "tool_result_too_sensitive"]

denial_code := sort([[object.get({c: i | some i, c in denial_order}, d.code, count(denial_order)), d.code] | some d in denials])[0][1]

# Model scope: a key scoped to some client model names (input.identity.models,
# trailing * = prefix) may only ask for those. The models listing is not
# refused (the gateway filters it to the scope).
denials contains {
	"code": "model_not_allowed",
	"reason": sprintf("member %s may not use the model %s; its scope allows %s", [input.identity.member, model, concat(", ", input.identity.models)]),
} if {
	count(input.identity.models) > 0
	input.request.endpoint != "models"
	model := object.get(input.request, "model", "")
	not scope_admits(input.identity.models, model)
}

# Client tool scope: a key scoped to some function names
# (input.identity.tools) may only declare those (input.request.tools).
denials contains {
	"code": "tool_not_allowed",
	"reason": sprintf("member %s may not use the tool %s; its scope allows %s", [input.identity.member, name, concat(", ", input.identity.tools)]),
} if {
	count(input.identity.tools) > 0
	some name in input.request.tools
	not scope_admits(input.identity.tools, name)
}

# A tool round (the conversation grown by tool results) may not be more
# sensitive than the decision it continues: a tool result that raised the
# class would otherwise reach the tier chosen for the lesser class. A parent
# without a known class denies too.
denials contains {
	"code": "tool_result_too_sensitive",
	"reason": sprintf("a tool result raised the sensitivity from %v to %s", [object.get(input.derived.parent, "sensitivity", null), effective_class]),
} if {
	input.derived.kind == "tool_round"
	not within_parent_class
}

# (A helper rule: OPA evaluates the operands of a negated comparison outside
# the negation, so an undefined parent class must be tested this way.)
within_parent_class if class_rank[effective_class] <= class_rank[input.derived.parent.sensitivity]

# scope_admits reports whether a scope (a list of names, a trailing * making
# an entry a prefix) admits name. An empty scope is handled by the callers
# (it admits everything).
scope_admits(scope, name) if name in scope

scope_admits(scope, name) if {
	some p in scope
	endswith(p, "*")
	startswith(name, trim_suffix(p, "*"))
}

# A model listing (GET /v1/models) shows the models of the targets that
# the member's model scope admits.
default listing := {}

listing := {"models": sort({m |
	some t in input.targets
	some m in t.models
	listed(m)
})} if input.request.endpoint == "models"

listed(_) if count(object.get(input.identity, "models", [])) == 0

listed(m) if scope_admits(input.identity.models, m)
