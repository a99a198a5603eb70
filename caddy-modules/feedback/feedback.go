// Package feedback is the Caddy handler http.handlers.molly_feedback: it
// takes explicit feedback on a routed answer, POST /v1/feedback with
// {"decision_id": "<X-Molly-Decision-Id of the answer>", "score": 0..1},
// and folds the score into the quality prior of the (target, model, task
// category) that answered (route.Priors.Feedback). With the molly app's
// specialise block, the score — and "edit", the client's corrected answer
// (a string), when sent — is also kept on the decision's consented trace,
// where curation takes a correction as the training answer and drops
// answers scored below 0.5. It is terminal: put it
// on its own route, e.g. `handle /v1/feedback { molly_feedback }`.
//
// Answers: 200 {"object":"feedback","decision_id","target","model",
// "category","quality","observations"} with the prior after the update,
// and "traced" (a consented trace took the feedback) with the specialise
// block;
// OpenAI-style errors otherwise: 405 for a method other than POST, 413
// request_too_large for a body over MaxBodyBytes (refused unread when its
// Content-Length says so), 400 for a malformed body (not JSON, not UTF-8, a
// key given twice, not an object) or a score outside [0,1], 404 decision_not_found for an
// id Molly does not remember (never routed here, older than an hour, or
// evicted), 409 feedback_already_given for a second score on one decision,
// 500 when the updated prior could not be saved.
package feedback

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/caddy-modules/app"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// MaxBodyBytes bounds a feedback request body (64 KiB).
const MaxBodyBytes = 64 << 10

// Feedback is the molly_feedback handler. It has no settings: the priors
// live in the molly app's registry (its registry option).
type Feedback struct {
	app    *app.App
	logger *zap.Logger
}

func init() { caddy.RegisterModule(Feedback{}) }

// CaddyModule returns the Caddy module information.
func (Feedback) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.molly_feedback", New: func() caddy.Module { return new(Feedback) }}
}

// Provision finds the molly app.
func (f *Feedback) Provision(ctx caddy.Context) error {
	a, err := ctx.App("molly")
	if err != nil {
		return fmt.Errorf("molly_feedback: loading the molly app: %w", err)
	}
	f.app = a.(*app.App)
	f.logger = ctx.Logger()
	return nil
}

// ServeHTTP applies one feedback score.
func (f *Feedback) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	openai.RequestID(w, r)
	if r.Method != http.MethodPost {
		openai.MethodNotAllowed(r.Method, r.URL.Path, http.MethodPost).Write(w)
		return nil
	}
	var body []byte
	var err error = &http.MaxBytesError{Limit: MaxBodyBytes}
	if r.ContentLength <= MaxBodyBytes { // a longer one is refused unread
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	}
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		(&openai.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
			Message: fmt.Sprintf("The feedback body is larger than the limit of %d bytes.", MaxBodyBytes)}).Write(w)
		return nil
	case err != nil:
		openai.InvalidRequest("", "The feedback body could not be read.").Write(w)
		return nil
	}
	// The checks of every API body (UTF-8, depth, a key given twice: which
	// score would count?), then the feedback's own shape.
	if aerr := openai.CheckBody(body); aerr != nil {
		aerr.Write(w)
		return nil
	}
	if !gjson.ParseBytes(body).IsObject() {
		openai.InvalidRequest("", "The feedback body must be a JSON object {\"decision_id\": \"...\", \"score\": 0..1}.").Write(w)
		return nil
	}
	id, score := gjson.GetBytes(body, "decision_id"), gjson.GetBytes(body, "score")
	if id.Type != gjson.String || id.Str == "" {
		openai.InvalidRequest("decision_id", "Invalid 'decision_id': expected the X-Molly-Decision-Id of an answer, a non-empty string.").Write(w)
		return nil
	}
	if score.Type != gjson.Number || score.Num < 0 || score.Num > 1 {
		openai.InvalidRequest("score", "Invalid 'score': expected a number from 0 (bad) to 1 (good), got %s.", orNothing(score.Raw)).Write(w)
		return nil
	}
	edit := gjson.GetBytes(body, "edit")
	if edit.Exists() && edit.Type != gjson.String {
		openai.InvalidRequest("edit", "Invalid 'edit': expected the corrected answer, a string.").Write(w)
		return nil
	}
	res, err := f.app.Priors().Feedback(id.Str, score.Num)
	switch {
	case errors.Is(err, route.ErrUnknownDecision):
		(&openai.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "decision_id", Code: "decision_not_found",
			Message: fmt.Sprintf("No routed decision with id `%s` is remembered (decisions are kept for %s, at most %d).",
				id.Str, route.DefaultDecisionTTL, route.DefaultDecisionCapacity)}).Write(w)
		return nil
	case errors.Is(err, route.ErrFeedbackGiven):
		(&openai.Error{Status: http.StatusConflict, Type: "invalid_request_error", Param: "decision_id", Code: "feedback_already_given",
			Message: fmt.Sprintf("Decision `%s` already received its feedback.", id.Str)}).Write(w)
		return nil
	case err != nil:
		f.logger.Error("saving feedback failed", zap.String("decision_id", id.Str), zap.Error(err))
		(&openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Message: "The feedback could not be saved."}).Write(w)
		return nil
	}
	traced := false
	if rec := f.app.Traces(); rec != nil {
		// The answer's trace may still be queued: store it first.
		if err := rec.Flush(r.Context()); err == nil {
			traced, err = f.app.Registry().TraceFeedback(r.Context(), id.Str, score.Num, edit.Str)
		}
		if err != nil {
			f.logger.Error("saving feedback on the trace failed", zap.String("decision_id", id.Str), zap.Error(err))
		}
	}
	f.logger.Info("feedback", zap.String("decision_id", id.Str), zap.Float64("score", score.Num), zap.String("target", res.Key.Target),
		zap.String("model", res.Key.Model), zap.String("category", res.Key.Category), zap.Float64("quality", res.Quality), zap.Int64("observations", res.N))
	answer := map[string]any{"object": "feedback", "decision_id": id.Str, "target": res.Key.Target, "model": res.Key.Model,
		"category": res.Key.Category, "quality": res.Quality, "observations": res.N}
	if f.app.Traces() != nil {
		answer["traced"] = traced
	}
	out, _ := json.Marshal(answer)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
	return nil
}

func orNothing(raw string) string {
	if raw == "" {
		return "nothing"
	}
	return raw
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Feedback)(nil)
	_ caddyfile.Unmarshaler       = (*Feedback)(nil)
	_ caddyhttp.MiddlewareHandler = (*Feedback)(nil)
)
