package pipeline

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// noTarget is the error of a request no target answered: msg, then every
// exclusion and failed attempt in parentheses. Its status says whether
// trying again can help, so that SDKs retry only what may succeed:
//
//   - nothing was tried (every target excluded): see unroutable — a 4xx;
//   - every attempt was rate-limited (429): 429 rate_limit_exceeded, with
//     the longest Retry-After the upstreams gave (at least 1 s);
//   - every attempt timed out: 504 upstream_timeout;
//   - every attempt was refused by egress (the redaction the decision
//     requires could not be guaranteed): 403 redaction_unavailable;
//   - every attempt got an answer that was not one (not JSON, too large,
//     broken off): 502 bad_upstream_answer;
//   - every attempt was refused with a 401 (the target's own API key, not
//     the client's): 502 upstream_auth_failed with x-should-retry: false
//     (the operator must fix the key);
//   - otherwise (connect errors, 5xx, empty streams: a lack of capacity,
//     transient): 503 no_target_available with Retry-After: 1.
func noTarget(msg string, excluded []route.Exclusion, tried []failed) *openai.Error {
	var parts []string
	for _, e := range excluded {
		parts = append(parts, e.String())
	}
	for _, t := range tried {
		parts = append(parts, t.target+": "+t.err)
	}
	if len(parts) > 0 {
		msg += " (" + strings.Join(parts, "; ") + ")"
	}
	msg += "."
	if len(tried) == 0 {
		return unroutable(msg, excluded)
	}
	every := func(kinds ...failure) bool {
		for _, t := range tried {
			ok := false
			for _, k := range kinds {
				ok = ok || t.kind == k
			}
			if !ok {
				return false
			}
		}
		return true
	}
	switch {
	case every(failRateLimited):
		wait := 1
		for _, t := range tried {
			wait = max(wait, t.retryAfter)
		}
		return &openai.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "rate_limit_exceeded", Message: msg, RetryAfter: wait}
	case every(failTimeout):
		return &openai.Error{Status: http.StatusGatewayTimeout, Type: "timeout_error", Code: "upstream_timeout", Message: msg}
	case every(failRefused):
		return &openai.Error{Status: http.StatusForbidden, Type: "policy_denied", Code: "redaction_unavailable", Message: msg}
	case every(failUpstreamAuth):
		return &openai.Error{Status: http.StatusBadGateway, Type: "upstream_error", Code: "upstream_auth_failed", Message: msg, NoRetry: true}
	case every(failBadAnswer, failTooLarge, failRead):
		return &openai.Error{Status: http.StatusBadGateway, Type: "upstream_error", Code: "bad_upstream_answer", Message: msg}
	}
	return &openai.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "no_target_available",
		Message: msg, RetryAfter: 1}
}

// unroutable is the error of a request every target serving its model was
// excluded for: nothing can change that but the request (or the policy),
// so it is a 4xx, decided by the most telling exclusion — one the client
// can act on before one of the policy's:
//
//	context window      400 context_length_exceeded (param messages)
//	missing capability  400 unsupported_parameter (param tools, response_format, modalities or logprobs)
//	input modality      400 unsupported_modality (param messages)
//	endpoint            400 unsupported_endpoint
//	X-Molly-Max-Cost    400 max_cost_exceeded
//	remaining budget    429 insufficient_quota, x-should-retry: false
//	open circuit        503 no_target_available, Retry-After: 1
//	missing API key     500 target_not_configured, x-should-retry: false
//	tier, region, policy cost limit  403 target_not_allowed
//
// An open circuit closes again, so a retry may succeed; a target whose
// api_key_env variable is unset (route.Target.MissingKey) stays unusable
// until the operator sets it and restarts: the gateway's fault, not the
// client's, and not worth a retry. The message names every excluded
// target and why.
func unroutable(msg string, excluded []route.Exclusion) *openai.Error {
	rank := map[route.ExclusionKind]int{route.ExcludedContext: 1, route.ExcludedCapability: 2, route.ExcludedModality: 3,
		route.ExcludedEndpoint: 4, route.ExcludedCost: 5, route.ExcludedBudget: 6}
	var best *route.Exclusion
	for i := range excluded {
		e := &excluded[i]
		if r, ok := rank[e.Kind]; ok && (best == nil || r < rank[best.Kind]) {
			best = e
		}
	}
	bad := func(code, param string) *openai.Error {
		return &openai.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code, Param: param, Message: msg}
	}
	if best == nil {
		for _, e := range excluded {
			if e.Kind == route.ExcludedHealth { // an open circuit closes again: worth a retry
				return &openai.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "no_target_available",
					Message: msg, RetryAfter: 1}
			}
		}
		for _, e := range excluded {
			if e.Kind == route.ExcludedKey {
				return &openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "target_not_configured",
					Message: msg, NoRetry: true}
			}
		}
		return &openai.Error{Status: http.StatusForbidden, Type: "policy_denied", Code: "target_not_allowed", Message: msg}
	}
	switch best.Kind {
	case route.ExcludedContext:
		return bad("context_length_exceeded", "messages")
	case route.ExcludedCapability:
		return bad("unsupported_parameter", capabilityParam[best.Need])
	case route.ExcludedModality:
		return bad("unsupported_modality", "messages")
	case route.ExcludedEndpoint:
		return bad("unsupported_endpoint", "")
	case route.ExcludedCost:
		return bad("max_cost_exceeded", route.HeaderMaxCost)
	}
	return &openai.Error{Status: http.StatusTooManyRequests, Type: "insufficient_quota", Code: "insufficient_quota", Message: msg, NoRetry: true}
}

// capabilityParam is the request parameter that needs a capability.
var capabilityParam = map[string]string{route.CapTools: "tools", route.CapJSONSchema: "response_format", route.CapAudio: "modalities", route.CapLogprobs: "logprobs"}

// retryAfter reads a Retry-After value (RFC 9110 §10.2.3: delay-seconds or
// an HTTP-date) as whole seconds from now, 0 when absent or unreadable.
func retryAfter(v string) int {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
		return max(n, 0)
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(int(time.Until(t).Seconds()+0.999), 0)
	}
	return 0
}

// everyAttemptFailed reports an error of noTarget after attempts (see
// noTarget): the request was tried and no upstream answered.
func everyAttemptFailed(e *openai.Error) bool {
	switch e.Code {
	case "no_target_available", "upstream_timeout", "bad_upstream_answer", "redaction_unavailable":
		return true
	case "rate_limit_exceeded":
		return e.Type == "rate_limit_error" // the upstreams' 429s; a member's own limit is typed by its kind
	}
	return false
}

// unroutableCodes are the codes of unroutable: no target was left to try.
var unroutableCodes = map[string]bool{"target_not_allowed": true, "target_not_configured": true, "context_length_exceeded": true, "unsupported_parameter": true,
	"unsupported_modality": true, "unsupported_endpoint": true, "max_cost_exceeded": true}
