package molly.policy_test

import rego.v1

import data.molly.policy

attempt(kind, score, answers) := {
	"attempt": {
		"target": "lan", "tier": "T1", "model": "small", "score": score, "score_kind": kind,
		"tokens": 12, "status": 200, "answers": answers, "max_attempts": 3,
	},
	"threshold": -1.0,
	"remaining": [{"target": "cloud", "tier": "T3", "model": "big", "cost_usd": 0.002, "quality": 0.9}],
	"request": {"endpoint": "chat.completions", "model": "chat", "stream": false},
	"capability": {"task": "chat"},
}

test_a_low_confidence_answer_escalates if {
	d := policy.escalate with input as attempt("logprob", -2.5, 1)
	d.escalate
	d.reasons == ["lan/small logprob score -2.5 < threshold -1; 1 candidate(s) remain"]
}

test_a_low_self_check_escalates if {
	policy.escalate.escalate with input as attempt("selfcheck", -1.2, 1)
}

test_a_confident_answer_is_returned if {
	d := policy.escalate with input as attempt("logprob", -0.4, 1)
	not d.escalate
	d.reasons == ["score -0.4 is not below the threshold -1"]
}

test_an_answer_at_the_threshold_is_returned if {
	not policy.escalate.escalate with input as attempt("logprob", -1.0, 1)
}

test_an_answer_without_a_score_is_returned if {
	d := policy.escalate with input as attempt("none", null, 1)
	not d.escalate
	d.reasons == ["the answer has no confidence score"]
}

test_max_attempts_stops_the_cascade if {
	d := policy.escalate with input as attempt("logprob", -3, 3)
	not d.escalate
	d.reasons == ["3 answer(s) reached max_attempts 3"]
}

test_no_remaining_candidate_stops_the_cascade if {
	d := policy.escalate with input as json.patch(attempt("logprob", -3, 1), [{"op": "replace", "path": "/remaining", "value": []}])
	not d.escalate
	d.reasons == ["no candidate remains"]
}

test_an_empty_input_does_not_escalate if {
	d := policy.escalate with input as {}
	not d.escalate
}

test_a_missing_threshold_does_not_escalate if {
	d := policy.escalate with input as json.remove(attempt("logprob", -3, 1), ["threshold"])
	not d.escalate
	d.reasons == ["the threshold is not a number"]
}

test_an_empty_input_gives_every_reason if {
	d := policy.escalate with input as {}
	d.reasons == ["no candidate remains", "null answer(s) reached max_attempts null", "the answer has no confidence score", "the threshold is not a number"]
}
