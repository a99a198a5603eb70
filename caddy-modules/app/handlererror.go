package app

import (
	"net/http"

	"go.uber.org/zap"

	"github.com/molly-gateway/molly/router/openai"
)

// InternalError answers a request that a Molly handler cannot serve
// because of the gateway itself (a misordered handler chain, a registry that
// fails): a 500 server_error in OpenAI's shape, and err logged to logger
// with the request id only. It returns nil, so the error never reaches
// Caddy's error log, which prints the request's URI and headers as they
// came (X-Api-Key, api_key= and other credentials included) unless the
// default log uses Molly's encoder. err's text is logged, not sent.
func InternalError(w http.ResponseWriter, r *http.Request, logger *zap.Logger, err error) error {
	if logger != nil {
		logger.Error("request not served", zap.String("request_id", w.Header().Get("X-Request-Id")), zap.Error(err))
	}
	(&openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "internal_error",
		Message: "The gateway could not serve this request; its log says why (request " + w.Header().Get("X-Request-Id") + ")."}).Write(w)
	return nil
}

// Logger is the molly app's logger (nil before Provision).
func (a *App) Logger() *zap.Logger { return a.logger }
