# Strict EU residency: the default tiers per class, but every decision pins
# targets to the EU (plus on-device and LAN, region "local"), whatever the
# client declares; internal data may also reach EU-resident external APIs,
# redacted.
package molly.policy

import rego.v1

class_tiers := {
	"public": ["T0", "T1", "T2", "T3"],
	"internal": ["T0", "T1", "T2", "T3"],
	"confidential": ["T0", "T1"],
	"restricted": ["T0"],
}

default decision := {"allow": false, "tiers": [], "redact": {}, "reasons": ["no policy rule matched the request"]}

decision := {
	"allow": true,
	"tiers": tiers,
	"redact": {t: types | some t in tiers; types := redact[t]},
	"regions": ["EU", "local"],
	"reasons": [sprintf("sensitivity %s allows %s, EU regions only", [input.sovereignty.sensitivity, concat(",", tiers)])],
} if {
	tiers := class_tiers[input.sovereignty.sensitivity]
}
