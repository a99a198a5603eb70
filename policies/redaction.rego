# Redaction: which detected entity types each tier receives only as
# placeholders, and what to do with entity types a model writes into its
# answers. External APIs (T3) never see a detected value.
package molly.policy

import rego.v1

# Tiers outside the operator's control.
external_tiers := {"T3"}

# Entity types detected in the request, sorted.
detected := sort([t | some t, _ in input.sovereignty.findings])

redact[t] := detected if {
	some t in external_tiers
}

# Answers: output[tier] says what the gateway does with entity types the
# model WROTE in an answer from that tier (found by the same detectors in
# the answer; values the client sent and the gateway restored do not count).
# "mask" lists types replaced by a mask, "block" types that make the gateway
# refuse the answer; "*" names every type; block wins over mask. A tier
# without an entry passes answers as they are. Default: an external API's
# answer is masked of every type found in it; T0–T2 answers pass.
output[t] := {"mask": ["*"], "block": []} if {
	some t in external_tiers
}
