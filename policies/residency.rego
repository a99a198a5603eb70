# Residency: which tiers a request may reach, from its sensitivity class,
# and who may ask for what (model and tool scopes).
#
# The decision contract (DESIGN.md §4):
#   {"allow": bool, "tiers": ["T0",...], "redact": {"T3": ["EMAIL",...]},
#    "output": {"T3": {"mask": [...], "block": [...]}} (optional),
#    "max_cost_usd": n (optional), "regions": [..] (optional),
#    "class": "confidential" (optional: the class routed by),
#    "code": "model_not_allowed" (optional: a denial's machine code),
#    "reasons": [...]}
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

class_names := ["public", "internal", "confidential", "restricted"]

class_rank := {"public": 0, "internal": 1, "confidential": 2, "restricted": 3}

# Content that could not be scanned (binary media, token ids, a scan over
# its budget; input.sovereignty.unscanned says what and why) is treated as
# this class. Tiers in opaque_tiers are let in anyway when the scanned
# content alone allows them: extend the set to opt a tier in.
opaque_class := "confidential"

opaque_tiers := set()

# A failed detector may have missed anything.
scan_failed_class := "restricted"

# The class the request is routed by, before the opaque rule.
scanned_class := class_names[max(ranks)] if {
	ranks := {r |
		some r in [class_rank[input.sovereignty.sensitivity]]
	} | {class_rank[scan_failed_class] | input.sovereignty.scan_failed}
}

effective_class := scanned_class if not input.sovereignty.opaque

effective_class := class_names[max({class_rank[scanned_class], class_rank[opaque_class]})] if input.sovereignty.opaque

class_allows := class_tiers[effective_class] if not input.sovereignty.opaque

class_allows := [t |
	some t in ["T0", "T1", "T2", "T3"]
	t in opaque_union
] if input.sovereignty.opaque

opaque_union := {t | some t in class_tiers[effective_class]} | {t |
	some t in opaque_tiers
	t in class_tiers[scanned_class]
}

# Fail closed: anything not matched below denies.
default decision := {
	"allow": false,
	"tiers": [],
	"redact": {},
	"reasons": ["no policy rule matched the request"],
}

decision := object.union(object.union(base, residency), listing) if {
	count(denials) == 0
	tiers := scoped(class_allows)
	base := {
		"allow": count(tiers) > 0,
		"tiers": tiers,
		"class": effective_class,
		"redact": {t: types | some t in tiers; types := redact[t]},
		"output": {t: rule | some t in tiers; rule := output[t]},
		"reasons": array.concat([sprintf("sensitivity %s allows %s", [effective_class, concat(",", tiers)])], sort(why)),
	}
}

decision := {
	"allow": false,
	"tiers": [],
	"redact": {},
	"code": codes[0],
	"reasons": sort([d.reason | some d in denials]),
} if {
	count(denials) > 0
	codes := sort([d.code | some d in denials])
}

# A caller whose API key is scoped to some tiers (input.identity.tiers,
# from molly_auth) only reaches those of them the class allows; an empty or
# absent list leaves the class's tiers as they are. An empty intersection
# denies.
scoped(tiers) := tiers if count(object.get(input, ["identity", "tiers"], [])) == 0

scoped(tiers) := [t | some t in tiers; t in input.identity.tiers] if count(object.get(input, ["identity", "tiers"], [])) > 0

why contains sprintf("member %s is scoped to tiers %s", [input.identity.member, concat(",", input.identity.tiers)]) if {
	count(input.identity.tiers) > 0
}

# A declared residency region pins the request to targets in that region
# (plus on-device and LAN targets, whose region is "local").
default residency := {}

residency := {"regions": [r, "local"]} if {
	r := input.sovereignty.residency
	r != ""
}

why contains sprintf("%s detected %d time(s)", [t, n]) if {
	some t, n in input.sovereignty.findings
}

why contains sprintf("declared sensitivity %s", [input.sovereignty.declared]) if {
	input.sovereignty.declared != "public"
}

why contains sprintf("content that cannot be scanned (%s) is treated as %s", [concat(", ", sort({u.reason | some u in object.get(input.sovereignty, "unscanned", [])})), opaque_class]) if {
	input.sovereignty.opaque
}

why contains sprintf("a detector failed, so the request is treated as %s", [scan_failed_class]) if {
	input.sovereignty.scan_failed
}

# Scopes. A member's key may be limited to some client model names
# (input.identity.models; a trailing * matches a prefix) and to some
# function names its requests may declare (input.identity.tools).
denials contains {"code": "model_not_allowed", "reason": sprintf("member %s may not use the model %s; its scope allows %s", [input.identity.member, input.request.model, concat(", ", input.identity.models)])} if {
	input.request.endpoint != "models"
	count(object.get(input.identity, "models", [])) > 0
	not scope_admits(input.identity.models, input.request.model)
}

denials contains {"code": "tool_not_allowed", "reason": sprintf("member %s may not use the tool %s; its scope allows %s", [input.identity.member, name, concat(", ", input.identity.tools)])} if {
	count(object.get(input.identity, "tools", [])) > 0
	some name in object.get(input.request, "tools", [])
	not scope_admits(input.identity.tools, name)
}

scope_admits(patterns, name) if {
	some p in patterns
	scope_match(p, name)
}

scope_match(p, name) if p == name

scope_match(p, name) if {
	endswith(p, "*")
	startswith(name, trim_suffix(p, "*"))
}

# A request Molly derived from the client's (a tool round) is decided
# again on its grown content; when a tool result raised the class above
# the one the conversation was decided at, it stops.
denials contains {"code": "tool_result_too_sensitive", "reason": sprintf("a tool result raised the sensitivity from %s to %s", [input.derived.parent.sensitivity, effective_class])} if {
	input.derived.kind == "tool_round"
	class_rank[effective_class] > class_rank[input.derived.parent.sensitivity]
}

# A model listing shows the models of the targets in the caller's model scope.
default listing := {}

listing := {"models": sort([m |
	some t in input.targets
	some m in t.models
	scope_admits_or_unscoped(m)
])} if input.request.endpoint == "models"

scope_admits_or_unscoped(_) if count(object.get(input.identity, "models", [])) == 0

scope_admits_or_unscoped(m) if scope_admits(input.identity.models, m)
