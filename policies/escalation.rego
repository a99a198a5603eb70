# Cascade escalation: is the answer in hand good enough, or is the next
# candidate asked? Input (router/pipeline/cascade.go): attempt {target,
# tier, model, score, score_kind (logprob | selfcheck | none), tokens,
# status, answers, max_attempts}, threshold, remaining [{target, tier,
# model, cost_usd, quality}] (the allowed candidates not yet asked),
# request, capability. Output: escalate {escalate, reasons}. Escalation only
# ever moves within the candidates the residency decision allowed.
package molly.policy

import rego.v1

default escalate := {"escalate": false, "reasons": ["no escalation rule matched"]}

escalate := {"escalate": true, "reasons": [sprintf("%s score %.2f is under the threshold %.2f", [input.attempt.score_kind, input.attempt.score, input.threshold])]} if {
	input.attempt.score_kind != "none"
	input.attempt.score < input.threshold
	input.attempt.answers < input.attempt.max_attempts
	count(input.remaining) > 0
}

escalate := {"escalate": false, "reasons": [why]} if {
	not escalates
	why := keep_reason
}

escalates if {
	input.attempt.score_kind != "none"
	input.attempt.score < input.threshold
	input.attempt.answers < input.attempt.max_attempts
	count(input.remaining) > 0
}

keep_reason := "the answer carries no score" if input.attempt.score_kind == "none"

else := sprintf("%s score %.2f meets the threshold %.2f", [input.attempt.score_kind, input.attempt.score, input.threshold]) if input.attempt.score >= input.threshold

else := sprintf("%d answers obtained, the most allowed", [input.attempt.answers]) if input.attempt.answers >= input.attempt.max_attempts

else := "no allowed candidate is left"
