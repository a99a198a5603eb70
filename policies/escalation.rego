# Cascade escalation: given the answer in hand (an attempt's confidence
# score) and the candidates left, should the cascade try the next one?
#
# Input (built by the cascade):
#   attempt   {target, tier, model, score, score_kind ("logprob" | "selfcheck"
#              | "none"), tokens, status, answers (answers obtained so far),
#              max_attempts}
#   threshold the score an answer needs (same unit as score: nats per token)
#   remaining [{target, tier, model, cost_usd, quality}], the next
#              candidates, already inside the tiers the decision allowed
#   request, capability: as in the route decision's input
# Output: escalate {escalate: bool, reasons: [...]}. An undefined or
# erroneous result does not escalate: the answer in hand is returned.
#
# Default (FrugalGPT-style cascade, Chen et al. 2023, "FrugalGPT: How to Use
# Large Language Models While Reducing Cost and Improving Performance"):
# escalate iff the answer has a score, the score is below the threshold,
# fewer than max_attempts answers were obtained and a candidate remains.
package molly.policy

import rego.v1

escalate := {"escalate": true, "reasons": [sprintf("%s/%s %s score %v < threshold %v; %d candidate(s) remain", [
	input.attempt.target, input.attempt.model, input.attempt.score_kind,
	input.attempt.score, input.threshold, count(input.remaining),
])]} if {
	count(escalation_blockers) == 0
}

escalate := {"escalate": false, "reasons": sort(escalation_blockers)} if {
	count(escalation_blockers) > 0
}

escalation_blockers contains "the answer has no confidence score" if {
	not scored
}

escalation_blockers contains "the threshold is not a number" if {
	not threshold_set
}

escalation_blockers contains sprintf("score %v is not below the threshold %v", [input.attempt.score, input.threshold]) if {
	scored
	threshold_set
	not below_threshold
}

escalation_blockers contains sprintf("%v answer(s) reached max_attempts %v", [object.get(input, ["attempt", "answers"], null), object.get(input, ["attempt", "max_attempts"], null)]) if {
	not attempts_left
}

escalation_blockers contains "no candidate remains" if {
	not candidates_left
}

scored if {
	is_string(input.attempt.score_kind)
	input.attempt.score_kind != "none"
	is_number(input.attempt.score)
}

threshold_set if is_number(input.threshold)

below_threshold if input.attempt.score < input.threshold

attempts_left if {
	is_number(input.attempt.answers)
	is_number(input.attempt.max_attempts)
	input.attempt.answers < input.attempt.max_attempts
}

candidates_left if {
	is_array(input.remaining)
	count(input.remaining) > 0
}
