package openai

import (
	"net/http"
	"strings"
)

// Endpoint names the OpenAI operation a request is for.
type Endpoint string

// The OpenAI endpoints Molly serves (paths under the client's base URL).
const (
	EndpointChat        Endpoint = "chat.completions" // POST /v1/chat/completions
	EndpointCompletions Endpoint = "completions"      // POST /v1/completions
	EndpointEmbeddings  Endpoint = "embeddings"       // POST /v1/embeddings
	EndpointModels      Endpoint = "models"           // GET  /v1/models, GET /v1/models/{model}
	// The Responses API and Anthropic's Messages API: translated into chat
	// completions (package router/translate) before they are classified.
	EndpointResponses Endpoint = "responses" // POST /v1/responses
	EndpointMessages  Endpoint = "messages"  // POST /v1/messages
)

// Path is the endpoint's path relative to an OpenAI base URL ending in /v1.
func (e Endpoint) Path() string {
	switch e {
	case EndpointChat:
		return "/chat/completions"
	case EndpointCompletions:
		return "/completions"
	case EndpointEmbeddings:
		return "/embeddings"
	case EndpointModels:
		return "/models"
	case EndpointResponses:
		return "/responses"
	case EndpointMessages:
		return "/messages"
	}
	return ""
}

// Operation is the OpenTelemetry GenAI operation name of the endpoint
// (gen_ai.operation.name): chat, text_completion, embeddings; "" for models.
func (e Endpoint) Operation() string {
	switch e {
	case EndpointChat:
		return "chat"
	case EndpointCompletions:
		return "text_completion"
	case EndpointEmbeddings:
		return "embeddings"
	}
	return ""
}

// EndpointOf maps method and path to the endpoint. The path may carry any
// prefix (clients use base URLs ending in /v1 or not). The models paths
// answer GET and HEAD (RFC 9110 §9.3.2: HEAD is GET without the body), the
// others POST. Errors are OpenAI errors: 404 unknown URL, 405 wrong method
// with Allow listing the path's methods.
func EndpointOf(method, path string) (Endpoint, *Error) {
	shown := path
	if len(shown) > 200 {
		shown = shown[:200] + "..."
	}
	path = strings.TrimSuffix(path, "/")
	var ep Endpoint
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		ep = EndpointChat
	case strings.HasSuffix(path, "/completions"):
		ep = EndpointCompletions
	case strings.HasSuffix(path, "/embeddings"):
		ep = EndpointEmbeddings
	case strings.HasSuffix(path, "/models"):
		ep = EndpointModels
	case strings.HasSuffix(path, "/responses"):
		ep = EndpointResponses
	case strings.HasSuffix(path, "/messages"):
		ep = EndpointMessages
	case ModelPathID(path) != "":
		ep = EndpointModels // GET /v1/models/{model}
	default:
		return "", &Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "unknown_url",
			Message: "Unknown request URL: " + method + " " + shown + "."}
	}
	want, allow := http.MethodPost, http.MethodPost
	if ep == EndpointModels {
		want, allow = http.MethodGet, "GET, HEAD"
		if method == http.MethodHead {
			return ep, nil
		}
	}
	if method != want {
		return "", MethodNotAllowed(method, path, allow)
	}
	return ep, nil
}

// MethodNotAllowed is the 405 for method on path, whose methods are allow
// (an Allow header value, e.g. "GET, HEAD"; the message names the first).
func MethodNotAllowed(method, path, allow string) *Error {
	use, _, _ := strings.Cut(allow, ",")
	return &Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_supported",
		Message: "Method " + method + " is not allowed on " + path + "; use " + use + ".", Allow: allow}
}

// ModelPathID returns {model} of a path /models/{model}, or "": all of the
// path after its first "/models/", so a model named with slashes (as
// Hugging Face and vLLM name them, "org/model"), which /v1/models lists,
// can be retrieved too (the SDKs put the id in the path as it is; %2F is
// decoded before this).
func ModelPathID(path string) string {
	i := strings.Index(path, "/models/")
	if i < 0 {
		return ""
	}
	return strings.TrimSuffix(path[i+len("/models/"):], "/")
}

// ResponsePathID returns {response_id} of a path ending in
// /responses/{response_id} (GET retrieves a stored Response), or "".
func ResponsePathID(path string) string {
	i := strings.LastIndex(path, "/responses/")
	if i < 0 {
		return ""
	}
	id := path[i+len("/responses/"):]
	if id == "" || strings.Contains(id, "/") {
		return ""
	}
	return id
}
