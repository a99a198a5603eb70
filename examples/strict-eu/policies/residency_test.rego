package molly.policy_test

import rego.v1

import data.molly.policy

eu_input(class, findings) := {"sovereignty": {"sensitivity": class, "findings": findings, "residency": ""}}

test_every_decision_is_pinned_to_the_eu if {
	d := policy.decision with input as eu_input("public", {})
	d.regions == ["EU", "local"]
}

test_internal_data_reaches_eu_external_apis_redacted if {
	d := policy.decision with input as eu_input("internal", {"EMAIL": 1})
	"T3" in d.tiers
	d.redact.T3 == ["EMAIL"]
}

test_confidential_stays_on_the_lan if {
	d := policy.decision with input as eu_input("confidential", {"IBAN": 1})
	d.tiers == ["T0", "T1"]
}
