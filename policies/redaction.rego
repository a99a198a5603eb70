# Redaction: which detected entity types each tier receives only as
# placeholders. External APIs (T3) never see a detected value.
package molly.policy

import rego.v1

# Tiers outside the operator's control.
external_tiers := {"T3"}

# Entity types detected in the request, sorted.
detected := sort([t | some t, _ in input.sovereignty.findings])

redact[t] := detected if {
	some t in external_tiers
}

# Output guarding: what to do with entity types a model wrote in its
# answer (not restored placeholders): mask replaces the value in the
# answer, block refuses the answer; other types pass. Answers from external
# APIs are masked for every type; the operator's own tiers pass.
output[t] := {"mask": [], "block": []} if {
	some t in ["T0", "T1", "T2", "T3"]
	not t in external_tiers
}

output[t] := {"mask": ["*"], "block": []} if {
	some t in external_tiers
}
