package pipeline

import (
	"net/http"
	"strings"

	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// unservable is the error of a plan without candidates. When every target
// was excluded for what the request itself needs (an endpoint, a modality,
// a context window no target has), retrying cannot help: 400, with
// OpenAI's context_length_exceeded when only context windows are too
// small, else unsupported_request. Any other exclusion (policy, cost, an
// open circuit) keeps the 503 no_target_available.
func unservable(a *classify.Annotation, excluded []route.Exclusion) *openai.Error {
	msg := "No allowed target is available for model `" + a.Model() + "`"
	if len(excluded) == 0 {
		return noTarget(msg, excluded, nil)
	}
	context := true
	for _, e := range excluded {
		if !e.ByRequest() {
			return noTarget(msg, excluded, nil)
		}
		context = context && e.ContextWindow()
	}
	code, param := "unsupported_request", ""
	if context {
		code, param = "context_length_exceeded", "messages"
	}
	parts := make([]string, len(excluded))
	for i, e := range excluded {
		parts[i] = e.String()
	}
	return &openai.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code, Param: param,
		Message: "No target for model `" + a.Model() + "` can serve this request (" + strings.Join(parts, "; ") + ")."}
}
