// Package translate serves two more client APIs over the chat completions
// pipeline: OpenAI's Responses API (POST /v1/responses) and Anthropic's
// Messages API (POST /v1/messages). A request in either is translated into
// a chat completions request (FromResponses, FromMessages), and that chat
// body is what is classified, decided, redacted and sent — the annotation
// is of the bytes that leave, exactly as for a chat request. What the
// pipeline answers (a chat completion, a chat stream, an OpenAI error) is
// translated back on its way to the client by a Writer. A third Writer
// (NewModelsWriter) gives an Anthropic client's GET /v1/models Anthropic's
// Models API shapes (APIAnthropicModels).
//
// Wire shapes: OpenAI's API description (schemas CreateResponse, Response,
// ResponseStreamEvent); Anthropic's Messages API reference
// (https://docs.anthropic.com/en/api/messages, .../messages-streaming,
// .../errors).
package translate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/openai"
)

// API names a client API translated to chat completions.
type API string

// The translated APIs.
const (
	APIResponses API = "responses" // OpenAI Responses API, POST /v1/responses
	APIMessages  API = "messages"  // Anthropic Messages API, POST /v1/messages
)

// ErrNotFound is returned by a Store for an unknown response (or one of
// another member).
var ErrNotFound = errors.New("response not found")

// StoredResponse is a Responses API response kept for previous_response_id.
type StoredResponse struct {
	ID, Member, Model, DecisionID string
	// Messages is the conversation as chat messages (a JSON array), the
	// answer last, without instructions.
	Messages []byte
	// Response is the Response object sent.
	Response []byte
	Created  time.Time
}

// Store keeps responses (the registry, through the Caddy glue).
type Store interface {
	PutResponse(ctx context.Context, r StoredResponse) error
	// Response returns member's response id, or ErrNotFound.
	Response(ctx context.Context, id, member string) (StoredResponse, error)
	// DeleteResponse deletes member's response id, or returns ErrNotFound.
	DeleteResponse(ctx context.Context, id, member string) error
}

// Translation is one translated request: what writing its answer back
// needs. Made by FromResponses or FromMessages.
type Translation struct {
	API API
	// Model is the client's model name.
	Model string
	// Stream reports a streamed request.
	Stream bool
	// StoredConversation reports a request continuing a stored response
	// (previous_response_id): its history comes from Molly's store.
	StoredConversation bool
	// PromptEstimate is the prompt's size in tokens as classification
	// estimated it (set by the caller). Anthropic's message_start reports
	// it when the upstream's first chunk carries no usage; message_delta
	// reports the upstream's count.
	PromptEstimate int
	// MaxToolCalls is the Responses request's max_tool_calls: how many
	// calls of the gateway's own (built-in, governed) tools the response
	// may process; -1 when it set none (and for Messages).
	MaxToolCalls int

	req gjson.Result // the client's request, for the fields answers echo

	// Responses API.
	id      string            // resp_…
	store   Store             // nil: nothing is stored
	member  string            // the caller, owner of what is stored
	history []json.RawMessage // chat messages sent, without instructions
	// logprobs: include lists message.output_text.logprobs, so output_text
	// parts carry the chat answer's token logprobs.
	logprobs bool

	// Messages API: thinking is enabled ("thinking": {"type": "enabled"}),
	// so the answer's reasoning (a chat answer's reasoning_content) is
	// returned as a thinking block.
	thinking bool
}

// ResponseID is the id of the Response being made ("" for Messages).
func (t *Translation) ResponseID() string { return t.id }

// marshal encodes v as JSON without escaping <, > and & (the text stays
// byte for byte what the client sent, for classification and restoring).
func marshal(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err) // only maps, slices, strings, numbers and raw JSON are encoded
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// object parses body as a JSON object, the first step of both
// translations: errors are the 400s ParseRequest gives, in its order
// (openai.CheckBody: empty, not JSON, not UTF-8, too deep or a repeated
// key), before anything is decoded — gjson would turn invalid UTF-8 into
// U+FFFD, and the translated chat body would carry that to the upstream.
func object(body []byte) (gjson.Result, *openai.Error) {
	if err := openai.CheckBody(body); err != nil {
		return gjson.Result{}, err
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return gjson.Result{}, openai.InvalidRequest("", "The JSON body of your request must be an object, got %s.", openai.Kind(root))
	}
	if m := root.Get("model"); m.Type != gjson.String || m.Str == "" {
		return gjson.Result{}, openai.InvalidRequest("model", "You must provide a model parameter (a non-empty string).")
	}
	return root, nil
}

// kinds are the JSON kinds checkKinds checks, as its error names them.
var kinds = map[string]func(gjson.Result) bool{
	"a boolean": func(v gjson.Result) bool { return v.Type == gjson.True || v.Type == gjson.False },
	"an array":  gjson.Result.IsArray,
	"an object": gjson.Result.IsObject,
	"a string":  func(v gjson.Result) bool { return v.Type == gjson.String },
	"an integer": func(v gjson.Result) bool {
		_, err := strconv.ParseInt(v.Raw, 10, 64)
		return v.Type == gjson.Number && err == nil
	},
}

// checkKinds refuses a top-level parameter of the wrong JSON type, as the
// APIs' own validation does (rather than reading "true" as a boolean or
// dropping an object where an array belongs): want maps each parameter to
// its kind, a key of kinds. An absent or null parameter passes. The error is WrongType's 400 naming the first
// offending parameter, in order.
func checkKinds(root gjson.Result, want ...[2]string) *openai.Error {
	for _, w := range want {
		v := root.Get(w[0])
		if !v.Exists() || v.Type == gjson.Null || kinds[w[1]](v) {
			continue
		}
		return openai.WrongType(w[0], w[1], v)
	}
	return nil
}

// copyNumber copies the numeric parameter param of the client's request
// as key.
func copyNumber(dst map[string]any, key string, root gjson.Result, param string) *openai.Error {
	switch v := root.Get(param); {
	case !v.Exists() || v.Type == gjson.Null:
	case v.Type == gjson.Number:
		dst[key] = json.RawMessage(v.Raw)
	default:
		return openai.WrongType(param, "a number", v)
	}
	return nil
}

// StatusOverloaded is the status Anthropic answers overloaded_error with
// (its errors reference: "529 - overloaded_error: The API is temporarily
// overloaded"), which the Messages API sends in place of Molly's 503: the
// transient lack of capacity that Anthropic's SDKs and agents retry.
const StatusOverloaded = 529

// messagesStatus is the HTTP status of an error answered on the Messages
// API: Anthropic's 529 for a 503, any other status as it is.
func messagesStatus(status int) int {
	if status == http.StatusServiceUnavailable {
		return StatusOverloaded
	}
	return status
}

// statusType is the Anthropic error type of an HTTP status, as Anthropic's
// errors reference lists them (any other 4xx is invalid_request_error, any
// other 5xx api_error).
func statusType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, StatusOverloaded:
		return "overloaded_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

// causeStatus is the HTTP status each error code or type Molly (or an
// OpenAI-compatible upstream) names stands for, where the error comes
// without one: an error event inside a 200 stream. Codes are looked up
// before types (output_blocked before its type policy_denied).
var causeStatus = map[string]int{
	// Rate limits: an upstream's, a member's RPM/TPM, a spent budget
	// (insufficient_quota, a 429 with x-should-retry: false when whole).
	"rate_limit_exceeded": 429, "rate_limit_error": 429, "insufficient_quota": 429, "tokens_exceeded": 429,
	// Capacity.
	"no_target_available": 503, "service_unavailable": 503, "server_is_overloaded": 503, "overloaded_error": StatusOverloaded, "engine_overloaded": 503,
	// Timeouts.
	"upstream_timeout": 504, "timeout_error": 504, "timeout": 504,
	// Policy.
	"policy_denied": 403, "output_blocked": 403, "redaction_unavailable": 403, "target_not_allowed": 403, "permission_error": 403,
	// The rest of Anthropic's types, and OpenAI's names for the same.
	"authentication_error": 401, "invalid_api_key": 401,
	"not_found_error": 404, "model_not_found": 404,
	"request_too_large":     413,
	"invalid_request_error": 400, "context_length_exceeded": 400,
	"billing_error": 402,
}

// eventType is the Anthropic error type of an OpenAI error object sent
// inside a stream ({"error": {"message", "type", "param", "code"}}), which
// has no HTTP status of its own: a numeric code (vLLM and LiteLLM send
// the status, 429 or "503") stands for it, else the cause its code or
// type names (causeStatus); anything else (a stream that broke off,
// upstream_error) is api_error.
func eventType(e gjson.Result) string {
	code := e.Get("code")
	if n, err := strconv.Atoi(code.String()); err == nil && n >= 400 && n < 600 {
		return statusType(n)
	}
	for _, k := range []string{code.String(), e.Get("type").String()} {
		if s, ok := causeStatus[k]; ok {
			return statusType(s)
		}
	}
	return "api_error"
}
