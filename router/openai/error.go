// Package openai holds OpenAI's wire format as Molly speaks it, for the gateway
// and the T0 engine alike: the endpoints, request validation (one parser, one
// idea of a valid request), and the error body every failure is reported with,
// {"error":{"message","type","param","code"}}.
//
// The shapes follow OpenAI's published API description (its OpenAPI document,
// schemas CreateChatCompletionRequest, CreateCompletionRequest,
// CreateEmbeddingRequest and ErrorResponse).
package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// Error is an OpenAI-style error with the HTTP status it is sent with.
// Param and Code are written as JSON null when empty, as OpenAI does.
type Error struct {
	Status  int    // HTTP status code, e.g. 400
	Message string // human-readable sentence saying what is wrong
	Type    string // e.g. "invalid_request_error", "policy_denied", "upstream_error"
	Param   string // the offending request field, e.g. "messages[0].content"
	Code    string // machine code, e.g. "model_not_found"
	// RetryAfter, when positive, is sent as the Retry-After header (seconds, RFC 9110 §10.2.3).
	RetryAfter int
	// NoRetry sends "x-should-retry: false", the header OpenAI's SDKs obey
	// over their own retry rules: for an answer (a spent budget) that no
	// retry can change although its status (429) is one they retry.
	NoRetry bool
	// Allow, when set, is sent as the Allow header: the methods the path
	// serves, which a 405 must list (RFC 9110 §15.5.6).
	Allow string
	// Extra fields added inside the "error" object (e.g. "reasons" of a policy denial).
	Extra map[string]any
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message) }

// Body returns the JSON body {"error":{...}}.
func (e *Error) Body() []byte {
	obj := map[string]any{
		"message": e.Message,
		"type":    e.Type,
		"param":   nullable(e.Param),
		"code":    nullable(e.Code),
	}
	for k, v := range e.Extra {
		obj[k] = v
	}
	b, err := json.Marshal(map[string]any{"error": obj})
	if err != nil { // only if Extra holds something unmarshalable
		b, _ = json.Marshal(map[string]any{"error": map[string]any{"message": e.Message, "type": e.Type, "param": nullable(e.Param), "code": nullable(e.Code)}})
	}
	return b
}

// Write sends the error as the whole response.
func (e *Error) Write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	if e.NoRetry {
		h.Set(HeaderShouldRetry, "false")
	}
	if e.Allow != "" {
		h.Set("Allow", e.Allow)
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(e.Body())
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// WriteError writes err as an OpenAI error. An *Error (also wrapped) keeps its
// status; anything else becomes a 500 whose message does not leak internals.
func WriteError(w http.ResponseWriter, err error) {
	var e *Error
	if errors.As(err, &e) {
		e.Write(w)
		return
	}
	(&Error{Status: http.StatusInternalServerError, Type: "server_error", Message: "internal error"}).Write(w)
}

// InvalidRequest is a 400 invalid_request_error about param.
func InvalidRequest(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}

// The codes of OpenAI's 400s for a parameter its validation refuses, as
// its API answers them (the error's code; its param names the parameter's
// path, e.g. "messages[0].content").
const (
	CodeInvalidType      = "invalid_type"               // a value of the wrong JSON type (WrongType)
	CodeInvalidValue     = "invalid_value"              // a value outside the parameter's allowed values (InvalidValue)
	CodeMissingParameter = "missing_required_parameter" // a required parameter absent (MissingParameter)
	CodeAboveMax         = "decimal_above_max_value"    // a number over the parameter's maximum
	CodeBelowMin         = "decimal_below_min_value"    // a number under the parameter's minimum
	CodeIntegerAboveMax  = "integer_above_max_value"    // an integer over the parameter's maximum
	CodeIntegerBelowMin  = "integer_below_min_value"    // an integer under the parameter's minimum
	CodeEmptyArray       = "empty_array"                // an array that must not be empty
	// CodeUnsupportedParameter: a parameter (or value) of the API that this
	// gateway, or every target it may use, cannot serve (Unsupported).
	CodeUnsupportedParameter = "unsupported_parameter"
)

// Unsupported is InvalidRequest with code unsupported_parameter: param is
// part of the API but not served here (a hosted tool, background mode, a
// file by id).
func Unsupported(param, format string, args ...any) *Error {
	e := InvalidRequest(param, format, args...)
	e.Code = CodeUnsupportedParameter
	return e
}

// InvalidValue is InvalidRequest with code invalid_value: param holds a
// value outside its allowed ones ("Invalid value for 'param': …").
func InvalidValue(param, format string, args ...any) *Error {
	e := InvalidRequest(param, format, args...)
	e.Code = CodeInvalidValue
	return e
}

// MissingParameter is InvalidRequest with code
// missing_required_parameter ("Missing required parameter: 'param'.").
func MissingParameter(param, format string, args ...any) *Error {
	e := InvalidRequest(param, format, args...)
	e.Code = CodeMissingParameter
	return e
}

// Sentinel errors a caller can match with errors.Is on an *Error (Is
// compares Code), instead of matching message substrings.
var (
	ErrModelNotFound   = &Error{Code: "model_not_found"}
	ErrContextLength   = &Error{Code: "context_length_exceeded"}
	ErrPolicyDenied    = &Error{Code: "policy_denied"}
	ErrNoTarget        = &Error{Code: "no_target_available"}
	ErrRequestTooLarge = &Error{Code: "request_too_large"}
)

// Is reports whether target is an *Error with the same Code (and, when
// target sets one, the same Status).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || t.Code == "" {
		return false
	}
	return e.Code == t.Code && (t.Status == 0 || t.Status == e.Status)
}
