package admin

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/router/openai"
)

// Caddy's admin server writes an error a route returns as
// {"error": "<message>"} (adminHandler.handleError encodes the
// caddy.APIError itself, whose only JSON field is Message), whatever the
// route. Molly's routes answer in OpenAI's shape, as the gateway's site
// does, so Guard writes their errors here and returns nil to Caddy.

// Error converts err, as a Molly admin route returns it, into the OpenAI
// error it is answered with, {"error":{"message","type","param","code"}}:
//
//   - an *openai.Error (also wrapped) is kept as it is;
//   - a body cut off by http.MaxBytesReader (*http.MaxBytesError, also
//     inside a caddy.APIError) is 413 request_too_large, whatever status
//     the route gave the decoding error;
//   - a caddy.APIError keeps its status (500 when unset) and message, with
//     the type and code of that status (statusError);
//   - anything else is 500 server_error with err's message: the admin API
//     is the operator's, and its errors hold no secrets (a key in a path is
//     cut to its prefix before any error names it).
func Error(err error) *openai.Error {
	var oe *openai.Error
	if errors.As(err, &oe) {
		return oe
	}
	var ae caddy.APIError
	isAPI := errors.As(err, &ae)
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) || isAPI && errors.As(ae.Err, &tooLarge) { // APIError has no Unwrap
		return &openai.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
			Message: fmt.Sprintf("the body is over the route's limit of %d bytes", tooLarge.Limit)}
	}
	if !isAPI {
		return statusError(http.StatusInternalServerError, err.Error())
	}
	msg := ae.Message
	if msg == "" && ae.Err != nil {
		msg = ae.Err.Error()
	}
	status := ae.HTTPStatus
	if status == 0 {
		status = http.StatusInternalServerError
	}
	return statusError(status, msg)
}

// statusError is the OpenAI error of an admin route's status: type
// invalid_request_error for 4xx (code permission_denied for 403, not_found
// for 404, method_not_supported for 405, conflict for 409,
// request_too_large for 413, rate_limit_exceeded for 429; none for 400
// and 422, whose message names what is wrong), server_error for 500,
// upstream_error for 502 and 504, service_unavailable for 503.
func statusError(status int, msg string) *openai.Error {
	e := &openai.Error{Status: status, Message: msg, Type: "invalid_request_error"}
	switch status {
	case http.StatusForbidden:
		e.Code = "permission_denied"
	case http.StatusNotFound:
		e.Code = "not_found"
	case http.StatusMethodNotAllowed:
		e.Code = "method_not_supported"
	case http.StatusConflict:
		e.Code = "conflict"
	case http.StatusRequestEntityTooLarge:
		e.Code = "request_too_large"
	case http.StatusTooManyRequests:
		e.Type, e.Code = "rate_limit_error", "rate_limit_exceeded"
	case http.StatusBadGateway, http.StatusGatewayTimeout:
		e.Type = "upstream_error"
	case http.StatusServiceUnavailable:
		e.Type = "service_unavailable"
	default:
		if status >= 500 {
			e.Type = "server_error"
		}
	}
	return e
}

// MethodNotAllowed is the 405 method_not_supported of a Molly admin route
// that serves only the methods allow, sent with them in the Allow header
// (RFC 9110 §15.5.6).
func MethodNotAllowed(r *http.Request, allow ...string) error {
	list := strings.Join(allow, ", ")
	return &openai.Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_supported", Allow: list,
		Message: fmt.Sprintf("%s is not supported on %s; use %s", r.Method, r.URL.Path, list)}
}

// writeError answers err in OpenAI's shape, unless the route had already
// begun its answer (then only the log line is written). It logs as Caddy's
// admin server logs a route's error ("request error" on admin.api).
func writeError(w *trackingWriter, err error) {
	e := Error(err)
	caddy.Log().Named("admin.api").Error("request error", zap.Error(err), zap.Int("status_code", e.Status))
	if w.wrote {
		return
	}
	e.Write(w)
}

// trackingWriter notes whether the route began its answer, so that an
// error it returns afterwards is not written over it.
type trackingWriter struct {
	http.ResponseWriter
	wrote bool
}

func (t *trackingWriter) WriteHeader(code int) {
	if code >= 200 { // 1xx are informational: the answer is still to come
		t.wrote = true
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *trackingWriter) Write(b []byte) (int, error) {
	t.wrote = true
	return t.ResponseWriter.Write(b)
}

// Unwrap gives http.ResponseController the writer underneath (Flush,
// deadlines).
func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// NotRouted is the answer of a request none of a route's cases served:
// 405 (MethodNotAllowed) when allow lists methods for its path (allow maps
// a path to the methods it serves), else 404 not_found naming the request.
func NotRouted(r *http.Request, allow map[string][]string) error {
	if methods := allow[r.URL.Path]; len(methods) > 0 {
		return MethodNotAllowed(r, methods...)
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no route %s %s", r.Method, r.URL.Path)}
}
