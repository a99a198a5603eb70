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

member(models, tools) := {"member": "alice", "scopes": [], "models": models, "tiers": [], "tools": tools}

with_identity(r, id) := json.patch(r, [{"op": "replace", "path": "/identity", "value": id}])

with_request(r, patch) := json.patch(r, [{"op": "add", "path": concat("", ["/request/", k]), "value": v} | some k, v in patch])

with_sovereignty(r, patch) := json.patch(r, [{"op": "add", "path": concat("", ["/sovereignty/", k]), "value": v} | some k, v in patch])

test_a_model_outside_the_scope_is_denied if {
	d := policy.decision with input as with_identity(req("public", {}), member(["chat", "llama*"], []))
		with input.request.model as "gpt-4o"
	not d.allow
	d.tiers == []
	d.code == "model_not_allowed"
	d.reasons == ["member alice may not use the model gpt-4o; its scope allows chat, llama*"]
}

test_a_model_in_the_scope_is_allowed if {
	d := policy.decision with input as with_identity(req("public", {}), member(["chat"], []))
	d.allow
	not d.code
}

test_a_model_scope_prefix_matches if {
	d := policy.decision with input as with_request(with_identity(req("public", {}), member(["llama*"], [])), {"model": "llama-3.1-8b"})
	d.allow
}

test_a_prefix_does_not_match_a_shorter_name if {
	d := policy.decision with input as with_request(with_identity(req("public", {}), member(["llama-3*"], [])), {"model": "llama"})
	d.code == "model_not_allowed"
}

test_an_empty_model_under_a_model_scope_is_denied if {
	d := policy.decision with input as with_request(with_identity(req("public", {}), member(["chat"], [])), {"model": ""})
	d.code == "model_not_allowed"
}

test_the_models_listing_is_not_refused_by_the_model_scope if {
	d := policy.decision with input as with_request(with_identity(req("public", {}), member(["chat"], [])), {"endpoint": "models", "model": ""})
	d.allow
}

test_an_empty_model_scope_admits_every_model if {
	d := policy.decision with input as with_request(with_identity(req("public", {}), member([], [])), {"model": "anything"})
	d.allow
}

test_a_declared_tool_outside_the_scope_is_denied if {
	d := policy.decision with input as with_request(with_identity(req("public", {}), member([], ["search", "calc*"])), {"tools": ["search", "shell"]})
	not d.allow
	d.code == "tool_not_allowed"
	d.reasons == ["member alice may not use the tool shell; its scope allows search, calc*"]
}

test_declared_tools_in_the_scope_are_allowed if {
	d := policy.decision with input as with_request(with_identity(req("public", {}), member([], ["search", "calc*"])), {"tools": ["search", "calculator"]})
	d.allow
}

test_an_empty_tool_scope_admits_every_tool if {
	d := policy.decision with input as with_request(with_identity(req("public", {}), member([], [])), {"tools": ["shell"]})
	d.allow
}

test_the_model_denial_comes_first_and_every_reason_is_given if {
	r := with_request(with_identity(req("public", {}), member(["chat"], ["search"])), {"model": "gpt-4o", "tools": ["shell"]})
	d := policy.decision with input as r
	d.code == "model_not_allowed"
	count(d.reasons) == 2
}

test_opaque_content_is_treated_as_confidential if {
	d := policy.decision with input as with_sovereignty(req("public", {}), {"opaque": true})
	d.allow
	d.tiers == ["T0", "T1"]
	d.sensitivity == "confidential"
	"content that cannot be scanned (token ids) is treated as confidential: only T0,T1 may receive it" in d.reasons
}

test_unscanned_parts_are_treated_as_confidential if {
	u := [{"path": "messages.0.content.1.image_url.url", "reason": "image"}, {"path": "messages.1.content.0.input_audio.data", "reason": "audio"}]
	d := policy.decision with input as with_sovereignty(req("internal", {"EMAIL": 1}), {"unscanned": u})
	d.tiers == ["T0", "T1"]
	d.sensitivity == "confidential"
	"2 part(s) could not be scanned (audio, image) and are treated as confidential: only T0,T1 may receive them" in d.reasons
}

test_an_empty_unscanned_list_is_not_opaque if {
	d := policy.decision with input as with_sovereignty(req("public", {}), {"unscanned": []})
	d.tiers == ["T0", "T1", "T2", "T3"]
	d.sensitivity == "public"
}

test_opaque_restricted_content_stays_restricted if {
	d := policy.decision with input as with_sovereignty(req("restricted", {"SECRET": 1}), {"opaque": true})
	d.tiers == ["T0"]
	d.sensitivity == "restricted"
}

test_an_operator_opts_a_tier_in_for_opaque_content_with_data if {
	d := policy.decision with input as with_sovereignty(req("public", {}), {"opaque": true})
		with data.molly.config.opaque_tiers as ["T2"]
	d.tiers == ["T0", "T1", "T2"]
}

test_opting_a_tier_in_for_opaque_content_never_widens_the_class if {
	d := policy.decision with input as with_sovereignty(req("confidential", {"IBAN": 1}), {"opaque": true})
		with data.molly.config.opaque_tiers as ["T2", "T3"]
	d.tiers == ["T0", "T1"]
}

test_a_failed_scan_is_treated_as_restricted if {
	d := policy.decision with input as with_sovereignty(req("public", {}), {"scan_failed": true})
	d.allow
	d.tiers == ["T0"]
	d.sensitivity == "restricted"
	"a detector failed on some content, so the request is treated as restricted" in d.reasons
}

test_the_decision_reports_the_sensitivity if {
	d := policy.decision with input as req("internal", {"EMAIL": 1})
	d.sensitivity == "internal"
}

tool_round(class, parent) := object.union(req(class, {}), {"derived": {"kind": "tool_round", "parent": {"decision_id": "d-1", "sensitivity": parent, "findings": {}}}})

test_a_tool_result_that_raises_the_sensitivity_is_denied if {
	d := policy.decision with input as tool_round("internal", "public")
	not d.allow
	d.code == "tool_result_too_sensitive"
	d.reasons == ["a tool result raised the sensitivity from public to internal"]
}

test_a_tool_round_at_the_same_sensitivity_is_allowed if {
	d := policy.decision with input as tool_round("internal", "internal")
	d.allow
	d.tiers == ["T0", "T1", "T2"]
	"tool_round of decision d-1" in d.reasons
}

test_a_tool_round_below_the_parent_sensitivity_is_allowed if {
	d := policy.decision with input as tool_round("public", "confidential")
	d.allow
}

test_a_tool_round_that_became_opaque_is_denied if {
	r := with_sovereignty(tool_round("public", "internal"), {"opaque": true})
	d := policy.decision with input as r
	d.code == "tool_result_too_sensitive"
}

test_a_tool_round_without_a_parent_class_is_denied if {
	r := object.union(req("public", {}), {"derived": {"kind": "tool_round", "parent": {"decision_id": "d-1"}}})
	d := policy.decision with input as r
	d.code == "tool_result_too_sensitive"
	d.reasons == ["a tool result raised the sensitivity from null to public"]
}

test_other_derived_requests_are_judged_like_client_requests if {
	r := object.union(req("internal", {}), {"derived": {"kind": "cascade_step", "parent": {"decision_id": "d-2", "sensitivity": "public", "findings": {}}}})
	d := policy.decision with input as r
	d.allow
	d.tiers == ["T0", "T1", "T2"]
}

test_the_default_denial_has_a_code if {
	d := policy.decision with input as {}
	d.code == "policy_denied"
}

stored(class) := object.union(req(class, {}), {"request": {"endpoint": "chat.completions", "model": "chat", "stream": false, "stored_conversation": true}})

test_a_stored_conversation_stays_on_t0_to_t2 if {
	d := policy.decision with input as stored("public")
	d.tiers == ["T0", "T1", "T2"]
}

test_a_stored_conversation_reaches_t3_when_configured if {
	d := policy.decision with input as stored("public") with data.molly.config.stored_conversation_tiers as ["T3"]
	d.tiers == ["T0", "T1", "T2", "T3"]
}

test_a_stored_conversation_never_widens_the_class if {
	d := policy.decision with input as stored("confidential") with data.molly.config.stored_conversation_tiers as ["T3"]
	d.tiers == ["T0", "T1"]
}
