package molly.policy_test

import rego.v1

import data.molly.policy

test_t3_redacts_every_detected_type if {
	d := policy.decision with input as req("public", {"PHONE": 2, "EMAIL": 1})
	d.redact == {"T3": ["EMAIL", "PHONE"]}
}

test_self_hosted_tiers_get_values_unredacted if {
	d := policy.decision with input as req("internal", {"EMAIL": 1})
	d.redact == {}
}

test_nothing_detected_redacts_nothing if {
	d := policy.decision with input as req("public", {})
	d.redact == {"T3": []}
}

test_t3_answers_are_masked_of_every_type if {
	d := policy.decision with input as req("public", {})
	d.output == {"T3": {"mask": ["*"], "block": []}}
}

test_self_hosted_answers_pass if {
	d := policy.decision with input as req("internal", {"EMAIL": 1})
	d.output == {}
}

test_an_operator_can_block_answers_per_tier if {
	d := policy.decision with input as req("public", {}) with policy.output as {"T2": {"mask": [], "block": ["SECRET"]}}
	d.output == {"T2": {"mask": [], "block": ["SECRET"]}}
}
