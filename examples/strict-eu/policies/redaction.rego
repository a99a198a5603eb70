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
