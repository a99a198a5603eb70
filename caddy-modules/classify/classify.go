// Package classify is the Caddy handler http.handlers.molly_classify: it
// reads the request body once, validates it and attaches the router
// annotation (capability and sovereignty profile) to the request context.
package classify

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/caddy-modules/app"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/tracing"
	"github.com/molly-gateway/molly/router/translate"
)

// DefaultMaxBodyBytes is the request body limit when none is set (8 MiB).
const DefaultMaxBodyBytes = 8 << 20

// Classify is the molly_classify handler.
type Classify struct {
	// MaxBodyBytes bounds the request body; larger bodies get 413. Default 8 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// PhoneRegion is the default region for phone numbers without a country
	// code (ISO 3166-1 alpha-2, default "US").
	PhoneRegion string `json:"phone_region,omitempty"`
	// Entities restricts detection to these entity types; empty means all.
	Entities []string `json:"entities,omitempty"`
	// Sensitivity maps an entity type to the class its presence implies,
	// overriding classify.DefaultEntityClasses (e.g. {"EMAIL": "public"}).
	// User-defined types default to "confidential".
	Sensitivity map[string]string `json:"sensitivity,omitempty"`
	// RedactModes maps an entity type to how its values are replaced for a
	// tier whose decision redacts it: "placeholder" (reversible "[EMAIL_1]",
	// the default), "mask" ("[EMAIL]") or "hash" (keyed HMAC-SHA256
	// pseudonym "[EMAIL#<16 hex>]", stable across requests, irreversible).
	RedactModes map[string]string `json:"redact_modes,omitempty"`
	// HashKeyEnv names the environment variable holding the HMAC key of
	// "hash" mode (at least 32 bytes). The key itself never appears in the
	// config or the logs. Unset: a random key per process, so pseudonyms
	// change on restart.
	HashKeyEnv string `json:"hash_key_env,omitempty"`
	// Patterns maps a user-defined entity type (upper-case, not a built-in
	// name) to Go RE2 regular expressions; a group named "value" narrows
	// the finding to it. E.g. {"EMPLOYEE_ID": ["\\bE-\\d{6}\\b"]}.
	Patterns map[string][]string `json:"patterns,omitempty"`
	// Dictionaries maps a user-defined entity type to words or phrases
	// found case-insensitively as whole words, e.g. {"PROJECT": ["Falcon"]}.
	Dictionaries map[string][]string `json:"dictionaries,omitempty"`
	// BodyTimeout bounds reading the whole request body; past it the
	// request gets 408 and the connection is closed. Default 60s; negative: none.
	BodyTimeout caddy.Duration `json:"body_timeout,omitempty"`
	// MinBodyRate is the slowest a body may arrive after MinBodyRateGrace,
	// in bytes per second (Kestrel's MinRequestBodyDataRate): a body that
	// falls behind gets 408. Defaults 240 B/s and 5s; negative rate: none.
	MinBodyRate      int64          `json:"min_body_rate,omitempty"`
	MinBodyRateGrace caddy.Duration `json:"min_body_rate_grace,omitempty"`

	classifier *classify.Classifier
	app        *app.App // nil without a molly app: no Responses or Messages API
	logger     *zap.Logger
}

func init() { caddy.RegisterModule(Classify{}) }

// CaddyModule returns the Caddy module information.
func (Classify) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.molly_classify", New: func() caddy.Module { return new(Classify) }}
}

// MinHashKeyBytes is the shortest HMAC key hash_key_env may name (32
// bytes, the SHA-256 block's half; RFC 2104 §3 recommends at least the
// hash output length).
const MinHashKeyBytes = 32

// Provision builds the scanner and classifier. Errors name the field: a
// bad entity type, region, pattern or dictionary; a mode other than
// placeholder, mask or hash, or for a type no detector finds; a
// hash_key_env variable that is unset or shorter than MinHashKeyBytes.
func (c *Classify) Provision(ctx caddy.Context) error {
	c.logger = ctx.Logger()
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.BodyTimeout == 0 {
		c.BodyTimeout = caddy.Duration(DefaultBodyTimeout)
	}
	if c.MinBodyRate == 0 {
		c.MinBodyRate = DefaultMinBodyRate
	}
	if c.MinBodyRateGrace == 0 {
		c.MinBodyRateGrace = caddy.Duration(DefaultMinBodyRateGrace)
	}
	scanner, err := redaction.NewScanner(redaction.Config{DefaultRegion: c.PhoneRegion, Types: c.Entities,
		Patterns: c.Patterns, Dictionaries: c.Dictionaries})
	if err != nil {
		return fmt.Errorf("molly_classify: %w", err)
	}
	var opts []classify.Option
	modes := map[string]redaction.Mode{}
	hash := false
	for typ, name := range c.RedactModes {
		m, err := redaction.ParseMode(name)
		if err != nil {
			return fmt.Errorf("molly_classify: redact_mode %s: %w", typ, err)
		}
		if !slices.Contains(scanner.Types(), typ) {
			return fmt.Errorf("molly_classify: redact_mode %s: no enabled detector finds that type (enabled: %s)", typ, strings.Join(scanner.Types(), ", "))
		}
		modes[typ] = m
		hash = hash || m == redaction.ModeHash
	}
	if len(modes) > 0 {
		opts = append(opts, classify.WithRedactionModes(modes))
	}
	if c.HashKeyEnv != "" {
		key := os.Getenv(c.HashKeyEnv)
		if len(key) < MinHashKeyBytes {
			return fmt.Errorf("molly_classify: hash_key_env: environment variable %s is unset or shorter than %d bytes", c.HashKeyEnv, MinHashKeyBytes)
		}
		opts = append(opts, classify.WithHashKey([]byte(key)))
	} else if hash {
		ctx.Logger().Warn("redact_mode hash without hash_key_env: pseudonyms use a random key and change when Molly restarts")
	}
	overrides := map[string]classify.Sensitivity{}
	for typ, class := range c.Sensitivity {
		s, err := classify.ParseSensitivity(class)
		if err != nil {
			return fmt.Errorf("molly_classify: sensitivity %s: %w", typ, err)
		}
		overrides[typ] = s
	}
	if a, err := ctx.AppIfConfigured("molly"); err == nil { // the engine's adapter names are task categories
		c.app = a.(*app.App)
		opts = append(opts, classify.WithDomains(c.app.Catalogue().Domains))
	}
	c.logger = ctx.Logger()
	c.classifier = classify.New(scanner, overrides, opts...)
	return nil
}

// Validate rejects a negative body limit.
func (c *Classify) Validate() error {
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("molly_classify: max_body_bytes must be positive")
	}
	if c.MinBodyRateGrace < 0 {
		return fmt.Errorf("molly_classify: min_body_rate's grace period must not be negative")
	}
	return nil
}

// ServeHTTP classifies the request and calls next with the annotation in
// the context; bad requests are answered with OpenAI errors. A Responses
// API or Messages API request is translated into a chat request first
// (router/translate): that chat body is what is classified, decided and
// sent, and the answer is translated back by the writer next gets.
func (c *Classify) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	openai.RequestID(w, r)
	_, span := tracing.Start(r.Context(), "molly.classify", trace.SpanKindInternal)
	defer span.End() // a no-op once ended below
	if strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/responses/input_tokens") {
		c.responsesInputTokens(w, r)
		return nil
	}
	if id := openai.ResponsePathID(r.URL.Path); id != "" {
		if id == "compact" && r.Method == http.MethodPost {
			// OpenAI's compaction endpoint, not a response id: Molly has
			// none (a 405 "use GET" would say the path is a response's).
			(&openai.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "unknown_url",
				Message: "Unknown request URL: POST " + r.URL.Path + " (this gateway does not compact conversations)."}).Write(w)
			return nil
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodDelete:
			c.retrieveResponse(w, r, id)
		default:
			openai.MethodNotAllowed(r.Method, r.URL.Path, "GET, HEAD, DELETE").Write(w)
		}
		return nil
	}
	if strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/messages/count_tokens") {
		c.countTokens(w, r)
		return nil
	}
	ep, aerr := openai.EndpointOf(r.Method, r.URL.Path)
	if aerr != nil {
		if strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/messages") {
			// A wrong method on the Messages API: Anthropic's error body.
			tw := translate.NewWriter(w, r.Context(), translate.APIMessages)
			aerr.Write(tw)
			tw.Finish()
			return nil
		}
		aerr.Write(w)
		return nil
	}
	if ep == openai.EndpointModels && translate.AnthropicClient(r) {
		// Anthropic's Models API on the same path: its shapes and errors.
		mw := translate.NewModelsWriter(w, r.URL.Query())
		defer c.finish(mw)
		w = mw
	}
	var tw *translate.Writer
	if ep == openai.EndpointResponses || ep == openai.EndpointMessages {
		tw = translate.NewWriter(w, r.Context(), translate.API(ep))
		defer c.finish(tw)
		w = tw
	}
	var body []byte
	if ep != openai.EndpointModels && r.Body != nil {
		var ok bool
		if body, ok = c.body(w, r); !ok {
			return nil
		}
	}
	if r.Context().Err() != nil {
		// A client that half-closed or vanished once it sent its body: no
		// classification, no policy, nothing billed.
		c.logger.Info("client went away before the policy decided", zap.String("while", "waiting for its answer"))
		w.WriteHeader(499)
		return nil
	}
	in := classify.Input{Endpoint: ep, Path: r.URL.Path, Body: body, BodyHandedOver: true, // read for this request, never written again
		Declared: strings.Join(r.Header.Values("X-Molly-Sensitivity"), ","), Residency: strings.Join(r.Header.Values("X-Molly-Residency"), ",")}
	var tr *translate.Translation
	if tw != nil {
		chat, t, terr := c.translate(r, ep, body)
		if terr != nil {
			terr.Write(w)
			return nil
		}
		tr = t
		tw.Bind(tr)
		body = chat
		in.Endpoint, in.API, in.StoredConversation, in.Body, in.BodyHandedOver = openai.EndpointChat, string(ep), tr.StoredConversation, chat, false
	}
	ann, err := c.classifier.Classify(in)
	if err != nil {
		openai.WriteError(w, err)
		return nil
	}
	if tr != nil {
		tr.PromptEstimate = ann.PromptTokens()
	}
	// The body was read once; later handlers read the annotation's copy.
	r.Body = io.NopCloser(strings.NewReader(ann.Body()))
	r = r.WithContext(classify.WithAnnotation(r.Context(), ann))
	if tr != nil && tr.MaxToolCalls >= 0 {
		r = r.WithContext(openai.WithMaxToolCalls(r.Context(), tr.MaxToolCalls))
	}
	endClassify(span, ann)
	return next.ServeHTTP(w, r)
}

// body reads the request body (bounded in size, time and rate, decoded);
// on failure it writes the error, the right status for each cause, and
// reports false.
func (c *Classify) body(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := c.readBody(w, r)
	if err == nil {
		return body, true
	}
	var tooBig *http.MaxBytesError
	var enc *UnsupportedEncodingError
	switch {
	case errors.As(err, &enc):
		(&openai.Error{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", Code: "unsupported_media_type",
			Message: fmt.Sprintf("The request body's Content-Encoding %q is not supported; send the body uncompressed, or gzip or deflate encoded.", enc.Encoding)}).Write(w)
	case errors.As(err, &tooBig):
		(&openai.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
			Message: fmt.Sprintf("The request body is larger than the limit of %d bytes.", c.MaxBodyBytes)}).Write(w)
	case errors.Is(err, os.ErrDeadlineExceeded):
		w.Header().Set("Connection", "close")
		(&openai.Error{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
			Message: fmt.Sprintf("The request body did not arrive in time (within %s, and at least %d bytes per second after %s).",
				time.Duration(c.BodyTimeout), c.MinBodyRate, time.Duration(c.MinBodyRateGrace))}).Write(w)
	case r.Context().Err() != nil && !errors.Is(err, io.ErrUnexpectedEOF):
		c.logger.Info("client went away before the policy decided", zap.String("while", "sending its body"))
		w.WriteHeader(499) // nobody reads this
	case errors.Is(err, io.ErrUnexpectedEOF):
		// The body ended before its Content-Length or its last chunk. The
		// connection's read side is closed, which cancels the request's
		// context, but a client that only closed its write side (RFC 9293
		// §3.6, a half-close) is still reading: it gets the 400, not a
		// 499 on the wire.
		if r.Context().Err() != nil {
			c.logger.Info("client went away before the policy decided", zap.String("while", "sending its body"))
		}
		(&openai.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_body",
			Message: "The request body could not be read: it ended before its Content-Length or its last chunk (unexpected EOF)."}).Write(w)
	default:
		(&openai.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_body",
			Message: "The request body could not be read: " + err.Error() + "."}).Write(w)
	}
	return nil, false
}

// countTokens answers POST /v1/messages/count_tokens (Anthropic's token
// counting): the body is translated as a Messages request (max_tokens is
// not required here) and classified, and the answer is {"input_tokens": n}.
// For a model only the in-process engine serves, n is the engine's exact
// count (its chat template and tokenizer: the input_tokens the Messages
// request's usage reports); for any other, Molly's estimate of the prompt's
// tokens — the one admission and routing use (a model's own count comes in
// each answer's usage). Nothing is sent upstream, nothing is billed.
// Errors are Anthropic's error bodies.
func (c *Classify) countTokens(w http.ResponseWriter, r *http.Request) {
	tw := translate.NewWriter(w, r.Context(), translate.APIMessages)
	defer tw.Finish()
	if r.Method != http.MethodPost {
		openai.MethodNotAllowed(r.Method, r.URL.Path, http.MethodPost).Write(tw)
		return
	}
	body, ok := c.body(tw, r)
	if !ok {
		return
	}
	if gjson.ValidBytes(body) && !gjson.GetBytes(body, "max_tokens").Exists() {
		if b, err := sjson.SetBytes(body, "max_tokens", 1); err == nil {
			body = b
		}
	}
	chat, t, terr := translate.FromMessages(body)
	if terr != nil {
		terr.Write(tw)
		return
	}
	if c.app != nil && c.app.Catalogue() != nil && !c.app.Catalogue().Serves(t.Model) {
		(&openai.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("The model %q does not exist or you do not have access to it.", t.Model)}).Write(tw)
		return
	}
	ann, err := c.classifier.Classify(classify.Input{Endpoint: openai.EndpointChat, API: string(openai.EndpointMessages), Path: r.URL.Path, Body: chat})
	if err != nil {
		openai.WriteError(tw, err)
		return
	}
	n := ann.PromptTokens()
	if exact, ok := c.engineCount(t.Model, chat); ok {
		n = exact
	}
	out := []byte(`{"input_tokens":` + strconv.Itoa(n) + "}")
	tw.Header().Set("Content-Type", "application/json")
	tw.Header().Set("Content-Length", strconv.Itoa(len(out)))
	tw.WriteHeader(http.StatusOK)
	_, _ = tw.Write(out)
}

// responsesInputTokens answers POST /v1/responses/input_tokens (OpenAI's
// input token count: a TokenCountsBody, answered with a TokenCountsResource
// {"object": "response.input_tokens", "input_tokens": n}) as countTokens
// answers the Messages API's: the body is translated as a Responses
// request (previous_response_id reads the caller's stored conversation)
// and classified, and n is the engine's exact count for a model only the
// engine serves, else Molly's estimate. Nothing is sent upstream, stored
// or billed. Errors are OpenAI's: 405 for another method, the Responses
// translation's 400s, 404 model_not_found.
func (c *Classify) responsesInputTokens(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		openai.MethodNotAllowed(r.Method, r.URL.Path, http.MethodPost).Write(w)
		return
	}
	body, ok := c.body(w, r)
	if !ok {
		return
	}
	if m := gjson.GetBytes(body, "model"); gjson.ValidBytes(body) && (m.Type != gjson.String || m.Str == "") {
		openai.MissingParameter("model", "Missing required parameter: 'model'.").Write(w)
		return
	}
	var store translate.Store
	if c.app != nil {
		store = c.app.Responses()
	}
	member := app.AnonymousMember
	if id := identity.From(r.Context()); id != nil {
		member = id.Name()
	}
	chat, t, terr := translate.FromResponses(r.Context(), body, store, member)
	if terr != nil {
		terr.Write(w)
		return
	}
	if c.app != nil && c.app.Catalogue() != nil && !c.app.Catalogue().Serves(t.Model) {
		(&openai.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", t.Model)}).Write(w)
		return
	}
	ann, err := c.classifier.Classify(classify.Input{Endpoint: openai.EndpointChat, API: string(openai.EndpointResponses), Path: r.URL.Path, Body: chat})
	if err != nil {
		openai.WriteError(w, err)
		return
	}
	n := ann.PromptTokens()
	if exact, ok := c.engineCount(t.Model, chat); ok {
		n = exact
	}
	out := []byte(`{"object":"response.input_tokens","input_tokens":` + strconv.Itoa(n) + "}")
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

// engineCount is the in-process engine's count of chat's prompt tokens
// (serving.Engine.ChatPromptTokens) when model is served by the engine
// alone (route.Catalogue.EngineModel); ok is false otherwise, or when the
// engine refuses the body (the Messages request itself then gets that
// error).
func (c *Classify) engineCount(model string, chat []byte) (n int, ok bool) {
	if c.app == nil || c.app.Engine() == nil || c.app.Catalogue() == nil {
		return 0, false
	}
	up, ok := c.app.Catalogue().EngineModel(model)
	if !ok {
		return 0, false
	}
	body, err := sjson.SetBytes(chat, "model", up)
	if err != nil {
		return 0, false
	}
	n, err = c.app.Engine().ChatPromptTokens(body)
	return n, err == nil
}

// retrieveResponse answers GET /v1/responses/{id} with the caller's stored
// Response (router/translate.Retrieve) and DELETE /v1/responses/{id} by
// deleting it (translate.Delete): nothing is classified or sent.
func (c *Classify) retrieveResponse(w http.ResponseWriter, r *http.Request, id string) {
	var store translate.Store
	if c.app != nil {
		store = c.app.Responses()
	}
	member := app.AnonymousMember
	if who := identity.From(r.Context()); who != nil {
		member = who.Name()
	}
	retrieve := translate.Retrieve
	if r.Method == http.MethodDelete {
		retrieve = translate.Delete
	}
	body, err := retrieve(r.Context(), store, id, member)
	if err != nil {
		err.Write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}

// translate makes the chat request of a Responses or Messages request.
func (c *Classify) translate(r *http.Request, ep openai.Endpoint, body []byte) ([]byte, *translate.Translation, *openai.Error) {
	if ep == openai.EndpointMessages {
		return translate.FromMessages(body)
	}
	if c.app == nil {
		return nil, nil, &openai.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "unknown_url",
			Message: "The Responses API needs the molly app (its registry keeps responses)."}
	}
	member := app.AnonymousMember
	if id := identity.From(r.Context()); id != nil {
		member = id.Name()
	}
	return translate.FromResponses(r.Context(), body, c.app.Responses(), member)
}

// finish writes a translated answer once the handlers after this one returned.
func (c *Classify) finish(tw *translate.Writer) {
	tw.Finish()
	if err := tw.Err(); err != nil {
		c.logger.Error("storing a response failed; previous_response_id cannot continue it", zap.Error(err))
	}
}

// readBody reads rd to its end into one buffer sized by the request's
// Content-Length (when it is known and within limit), so a body is not
// copied again and again as it grows; io.ReadAll's behaviour otherwise.
func readBody(rd io.Reader, contentLength, limit int64) ([]byte, error) {
	size := int64(512)
	if contentLength > 0 && contentLength <= limit {
		size = contentLength + 1 // room to see the end without growing
	}
	buf := make([]byte, 0, size)
	for {
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
	}
}

// endClassify ends the classify span with what was found (types and
// counts, never values).
func endClassify(span trace.Span, ann *classify.Annotation) {
	if span.IsRecording() {
		n := 0
		for _, c := range ann.Findings() {
			n += c
		}
		span.SetAttributes(tracing.Task.String(ann.Task()), tracing.Sensitivity.String(ann.Sensitivity().String()),
			tracing.Findings.Int(n), tracing.GenAIRequestModel.String(ann.Model()), tracing.GenAIOperationName.String(ann.Endpoint().Operation()))
	}
	span.End()
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Classify)(nil)
	_ caddy.Validator             = (*Classify)(nil)
	_ caddyhttp.MiddlewareHandler = (*Classify)(nil)
)
