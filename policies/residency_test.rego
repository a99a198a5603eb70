package molly.policy_test

import rego.v1

import data.molly.policy

req(class, findings) := {
	"request": {"endpoint": "chat.completions", "model": "chat", "stream": false},
	"capability": {"task": "chat", "modalities": ["text"], "prompt_tokens": 10, "max_tokens": 0, "tools": false},
	"sovereignty": {
		"sensitivity": class, "detected": class, "declared": "public",
		"findings": findings, "opaque": false, "residency": "",
	},
	"identity": {"member": "anonymous", "scopes": []},
	"targets": [],
}

test_public_reaches_every_tier if {
	d := policy.decision with input as req("public", {})
	d.allow
	d.tiers == ["T0", "T1", "T2", "T3"]
}

test_internal_stops_at_self_hosted if {
	d := policy.decision with input as req("internal", {"EMAIL": 1})
	d.tiers == ["T0", "T1", "T2"]
	not "T3" in d.tiers
}

test_confidential_stays_on_the_lan if {
	d := policy.decision with input as req("confidential", {"CREDIT_CARD": 1})
	d.tiers == ["T0", "T1"]
}

test_restricted_stays_on_device if {
	d := policy.decision with input as req("restricted", {"SECRET": 1})
	d.tiers == ["T0"]
	"SECRET detected 1 time(s)" in d.reasons
}

test_unknown_class_denies if {
	d := policy.decision with input as req("top-secret", {})
	not d.allow
	d.tiers == []
}

test_missing_input_denies if {
	d := policy.decision with input as {}
	not d.allow
}

test_residency_pins_regions if {
	r := json.patch(req("public", {}), [{"op": "replace", "path": "/sovereignty/residency", "value": "EU"}])
	d := policy.decision with input as r
	d.regions == ["EU", "local"]
}

test_no_residency_means_no_region_constraint if {
	d := policy.decision with input as req("public", {})
	not d.regions
}

scoped_req(class, tiers) := json.patch(req(class, {}), [{"op": "replace", "path": "/identity", "value": {"member": "alice", "scopes": [], "models": [], "tiers": tiers, "tools": []}}])

test_a_key_scoped_to_tiers_narrows_the_decision if {
	d := policy.decision with input as scoped_req("public", ["T0", "T2"])
	d.allow
	d.tiers == ["T0", "T2"]
	"member alice is scoped to tiers T0,T2" in d.reasons
	not d.redact.T3
}

test_a_scope_never_widens_the_class if {
	d := policy.decision with input as scoped_req("confidential", ["T0", "T3"])
	d.allow
	d.tiers == ["T0"]
}

test_a_scope_outside_the_class_denies if {
	d := policy.decision with input as scoped_req("restricted", ["T3"])
	not d.allow
	d.tiers == []
}

test_an_empty_scope_leaves_the_class_tiers if {
	d := policy.decision with input as scoped_req("internal", [])
	d.tiers == ["T0", "T1", "T2"]
}

test_an_identity_without_tiers_leaves_the_class_tiers if {
	d := policy.decision with input as json.patch(req("public", {}), [{"op": "replace", "path": "/identity", "value": {"member": "x"}}])
	d.tiers == ["T0", "T1", "T2", "T3"]
}
