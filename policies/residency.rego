# Residency: which tiers a request may reach, from its sensitivity class.
#
# The decision contract (DESIGN.md §4):
#   {"allow": bool, "tiers": ["T0",...], "redact": {"T3": ["EMAIL",...]},
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

# Fail closed: anything not matched below denies.
default decision := {
	"allow": false,
	"tiers": [],
	"redact": {},
	"reasons": ["no policy rule matched the request"],
}

decision := object.union(base, residency) if {
	tiers := scoped(class_tiers[input.sovereignty.sensitivity])
	base := {
		"allow": count(tiers) > 0,
		"tiers": tiers,
		"redact": {t: types | some t in tiers; types := redact[t]},
		"reasons": array.concat([sprintf("sensitivity %s allows %s", [input.sovereignty.sensitivity, concat(",", tiers)])], sort(why)),
	}
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

why contains "content that cannot be scanned (token ids) is treated as confidential" if {
	input.sovereignty.opaque
}
