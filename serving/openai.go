package serving

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/serving/llama"
)

// ServeHTTP is the OpenAI-compatible surface of the engine:
//
//	POST /v1/chat/completions  (stream or not; stream_options.include_usage)
//	POST /v1/completions
//	POST /v1/embeddings        (embeddings.go)
//	GET  /v1/models            (the base and "<base>:<adapter>" names)
//	POST /molly/engine/verify  (remote verification, verify.go)
//	GET  /molly/engine/verify  (what a drafter must share, VerifyInfo)
//
// The request's `model` is "<base>" or "<base>:<adapter>". Chat requests may
// ask for a reasoning block (reasoning_effort, max_reasoning_tokens,
// min_reasoning_tokens; reasoning.go): the answer then carries
// reasoning_content and usage.completion_tokens_details. It depends only on
// r.URL.Path, r.Body and r.Context() (and refuses an explicit GET on the
// completion endpoints), so the gateway can call it
// in-process with a (possibly redacted) body. Errors are OpenAI error JSON
// {"error":{"message","type","param","code"}}: 400 invalid request (code
// context_length_exceeded, adapter_refused where they apply), 404 unknown
// model or path, 405 GET on a completion endpoint, 409 a verify call for another
// vocabulary, 503 engine closed, 500 otherwise. A
// cancelled request context (client disconnect) cancels generation within one
// scheduler step.
func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Dispatch on the path only: the gateway calls this handler in process
	// and guarantees the path, body and context, not the method. A GET on a
	// completion endpoint is still refused, since it cannot carry a body.
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case strings.HasSuffix(path, "/v1/models"):
		e.serveModels(w)
	case strings.HasSuffix(path, "/v1/embeddings"):
		e.serveEmbeddings(w, r)
	case strings.HasSuffix(path, "/molly/engine/verify"):
		if r.Method == http.MethodGet {
			e.serveVerifyInfo(w)
			return
		}
		e.serveVerify(w, r)
	case strings.HasSuffix(path, "/v1/chat/completions"), strings.HasSuffix(path, "/v1/completions"):
		if r.Method == http.MethodGet {
			w.Header().Set("Allow", http.MethodPost) // a 405 lists the path's methods (RFC 9110 §15.5.6)
			writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "", "method_not_allowed", "use POST for "+r.URL.Path)
			return
		}
		e.serveCompletion(w, r, strings.HasSuffix(path, "/v1/chat/completions"))
	default:
		writeError(w, http.StatusNotFound, "invalid_request_error", "", "not_found", fmt.Sprintf("no route for %s", r.URL.Path))
	}
}

type apiError struct {
	status           int
	typ, param, code string
	msg              string
}

func (a *apiError) Error() string { return a.msg }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, msg: fmt.Sprintf(format, args...)}
}

// unsupported is the 400 of a parameter (or a value of one) that the API
// defines but this engine does not serve: invalid_request_error with param
// set and code unsupported_parameter, as openai.Unsupported reports it for
// the gateway.
func unsupported(param, format string, args ...any) *apiError {
	oe := openai.Unsupported(param, format, args...)
	return &apiError{oe.Status, oe.Type, oe.Param, oe.Code, oe.Message}
}

// writeError writes OpenAI's error body (the gateway's one writer, openai.Error).
func writeError(w http.ResponseWriter, status int, typ, param, code, msg string) {
	(&openai.Error{Status: status, Type: typ, Param: param, Code: code, Message: msg}).Write(w)
}

func errorBody(typ, param, code, msg string) map[string]any {
	nullable := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	return map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nullable(param), "code": nullable(code)}}
}

// classify maps engine errors to OpenAI error fields.
func classify(err error) *apiError {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, ErrContextLength):
		return &apiError{http.StatusBadRequest, "invalid_request_error", "messages", "context_length_exceeded", err.Error()}
	case errors.Is(err, ErrUnknownAdapter):
		return &apiError{http.StatusNotFound, "invalid_request_error", "model", "model_not_found", err.Error()}
	case errors.Is(err, ErrAdapterRefused):
		return &apiError{http.StatusBadRequest, "invalid_request_error", "model", "adapter_refused", err.Error()}
	case errors.Is(err, ErrMemoryBudget):
		return &apiError{http.StatusBadRequest, "invalid_request_error", "max_tokens", "context_length_exceeded", err.Error()}
	case errors.Is(err, ErrClosed):
		return &apiError{http.StatusServiceUnavailable, "server_error", "", "engine_closed", err.Error()}
	}
	return &apiError{http.StatusInternalServerError, "server_error", "", "", err.Error()}
}

func (e *Engine) serveModels(w http.ResponseWriter) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
		Version string `json:"version,omitempty"` // Molly: the content version serving this name
	}
	var data []model
	for _, m := range e.ModelVersions() {
		data = append(data, model{ID: m.ID, Object: "model", Created: m.Created, OwnedBy: "molly", Version: m.Version})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// completionRequest holds the fields of both endpoints.
type completionRequest struct {
	Model         string          `json:"model"`
	Messages      []chatMessage   `json:"messages"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Temperature         *float64           `json:"temperature"`
	TopP                *float64           `json:"top_p"`
	TopK                *int               `json:"top_k"`
	Seed                *int64             `json:"seed"`
	Stop                json.RawMessage    `json:"stop"`
	MaxTokens           *int               `json:"max_tokens"`
	MaxCompletionTokens *int               `json:"max_completion_tokens"`
	N                   *int               `json:"n"`
	Logprobs            json.RawMessage    `json:"logprobs"` // chat: bool; completions: int
	TopLogprobs         *int               `json:"top_logprobs"`
	PresencePenalty     *float64           `json:"presence_penalty"`
	FrequencyPenalty    *float64           `json:"frequency_penalty"`
	LogitBias           map[string]float64 `json:"logit_bias"`
	Echo                bool               `json:"echo"`
	Suffix              *string            `json:"suffix"`  // completions: refused unless empty
	BestOf              *int               `json:"best_of"` // completions: refused above 1

	plan     *plan           // chat: how the output is constrained and decoded (tools.go)
	switched *switchDecision // the reasoning switcher's decision (switcher.go)
	chains   int             // parallel chains voted on (chains.go)
}

// decodeError is the 400 for a body openai.ParseRequest accepted that does
// not decode into completionRequest: a parameter of the wrong JSON type,
// or a number its Go field cannot hold (2.5 or 1e30 for an integer, which
// encoding/json also refuses to read from 4.0 or 1e3; 1e400 for a float).
// The message names the parameter (its JSON path from
// the body's root, array indices left out, as encoding/json reports it),
// the type expected and, for integers, the range; param is that path. The
// body is valid JSON (ParseRequest checked), so it is never called invalid.
func decodeError(err error) *apiError {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) || te.Field == "" || te.Type == nil {
		return badRequest("", "the request body does not match the request's schema: a parameter has the wrong type")
	}
	got := te.Value // "string", "number 2.5", "array", "object", "bool"
	if n, ok := strings.CutPrefix(got, "number "); ok {
		got = n
	} else if got == "bool" {
		got = "a boolean"
	} else if got == "array" || got == "object" {
		got = "an " + got
	} else {
		got = "a " + got
	}
	t := te.Type
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var want string
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		bits := t.Bits()
		lo, hi := int64(-1)<<(bits-1), int64(1)<<(bits-1)-1
		want = "an integer"
		if strings.HasPrefix(te.Value, "number ") {
			f, perr := strconv.ParseFloat(got, 64)
			switch {
			case perr == nil && f == math.Trunc(f) && f >= float64(lo) && f <= float64(hi):
				want = "an integer written without a fraction or exponent" // 1.0, 1e3
			case perr == nil && f == math.Trunc(f) || errors.Is(perr, strconv.ErrRange):
				want = fmt.Sprintf("an integer between %d and %d", lo, hi)
			}
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want = fmt.Sprintf("an integer between 0 and %d", uint64(math.MaxUint64)>>(64-t.Bits()))
	case reflect.Float32, reflect.Float64:
		want = "a number"
		if strings.HasPrefix(te.Value, "number ") {
			want = "a finite number within float64 range"
		}
	case reflect.Bool:
		want = "a boolean"
	case reflect.String:
		want = "a string"
	case reflect.Slice, reflect.Array:
		want = "an array"
	case reflect.Struct, reflect.Map:
		want = "an object"
	default:
		want = "another type"
	}
	return badRequest(te.Field, "%s must be %s, got %s", te.Field, want, got)
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// text flattens string content or an array of {"type":"text","text":...}
// parts; an assistant message's {"type":"refusal","refusal":...} parts
// (OpenAI's ChatCompletionRequestAssistantMessageContentPart) are the
// assistant's text too. Other part types are 400.
func (m chatMessage) text() (string, error) {
	if len(m.Content) == 0 || string(m.Content) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(m.Content, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type    string `json:"type"`
		Text    string `json:"text"`
		Refusal string `json:"refusal"`
	}
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", badRequest("messages", "message content must be a string or an array of text parts")
	}
	var sb strings.Builder
	for _, p := range parts {
		switch {
		case p.Type == "text":
			sb.WriteString(p.Text)
		case p.Type == "refusal" && m.Role == "assistant":
			sb.WriteString(p.Refusal)
		default:
			return "", badRequest("messages", "content part type %q is not supported by this model", p.Type)
		}
	}
	return sb.String(), nil
}

// parse validates the body and builds the engine request.
func (e *Engine) parse(body []byte, chat bool) (*completionRequest, Request, error) {
	return e.parseRequest(body, chat, true)
}

// parseRequest is parse; without switching, a chat request is taken as
// written: no reasoning switcher and no default n_chains (remote drafting
// renders the prompt the remote engine will see, not this engine's
// choices).
func (e *Engine) parseRequest(body []byte, chat, switching bool) (*completionRequest, Request, error) {
	// One idea of a valid request for the gateway and the engine: the
	// shared validator first, then the engine's own limits below.
	ep := openai.EndpointCompletions
	if chat {
		ep = openai.EndpointChat
	}
	view, aerr := openai.ParseRequest(ep, body)
	if aerr != nil {
		return nil, Request{}, &apiError{aerr.Status, aerr.Type, aerr.Param, aerr.Code, aerr.Message}
	}
	for _, p := range []string{"functions", "function_call"} {
		// The deprecated functions API would need a function_call answer;
		// refused, rather than answered as if no function were declared.
		if v := gjson.GetBytes(body, p); v.Exists() && v.Type != gjson.Null {
			return nil, Request{}, unsupported(p, "%s (deprecated) is not supported by this engine; declare tools and tool_choice instead", p)
		}
	}
	if view.AudioOut {
		// The engine writes text only: a request for a spoken answer is
		// refused rather than answered without the audio it asked for.
		return nil, Request{}, unsupported("modalities", "audio output is not supported by this engine: it answers text only")
	}
	var cr completionRequest
	if err := json.Unmarshal(body, &cr); err != nil {
		return nil, Request{}, decodeError(err)
	}
	var r Request
	base, adapter, _ := strings.Cut(cr.Model, ":")
	if base != e.cfg.ModelName {
		return nil, r, &apiError{http.StatusNotFound, "invalid_request_error", "model", "model_not_found",
			fmt.Sprintf("the model %q does not exist; this engine serves %q and %q", cr.Model, e.cfg.ModelName, e.cfg.ModelName+":<adapter>")}
	}
	r.Adapter = adapter
	p := SamplingParams{Temperature: 1, TopP: 1}
	if cr.Temperature != nil {
		if *cr.Temperature < 0 || *cr.Temperature > 2 {
			return nil, r, badRequest("temperature", "temperature must be between 0 and 2")
		}
		p.Temperature = *cr.Temperature
	}
	if cr.TopP != nil {
		if *cr.TopP < 0 || *cr.TopP > 1 {
			return nil, r, badRequest("top_p", "top_p must be between 0 and 1")
		}
		// top_p 0 (the OpenAPI description allows 0..1) keeps only the
		// most likely token: the smallest positive mass does, since the
		// nucleus always holds its first token (SamplingParams.TopP 0
		// means "unset").
		p.TopP = max(*cr.TopP, math.SmallestNonzeroFloat64)
	}
	if cr.TopK != nil {
		if *cr.TopK < 0 {
			return nil, r, badRequest("top_k", "top_k must be >= 0")
		}
		p.TopK = *cr.TopK
	}
	p.Seed = cr.Seed
	// The ranges are openai.ParseRequest's (checked above); a token id
	// must also be in this model's vocabulary.
	if cr.PresencePenalty != nil {
		p.PresencePenalty = *cr.PresencePenalty
	}
	if cr.FrequencyPenalty != nil {
		p.FrequencyPenalty = *cr.FrequencyPenalty
	}
	if len(cr.LogitBias) > 0 {
		p.LogitBias = make(map[int32]float32, len(cr.LogitBias))
		n := e.model.NVocab()
		for k, b := range cr.LogitBias {
			id, err := strconv.Atoi(k)
			if err != nil || id < 0 || id >= n {
				return nil, r, badRequest("logit_bias", "logit_bias key %q is not a token id of this model (0 to %d)", k, n-1)
			}
			p.LogitBias[int32(id)] = float32(b)
		}
	}
	if len(cr.Stop) > 0 && string(cr.Stop) != "null" {
		var one string
		if err := json.Unmarshal(cr.Stop, &one); err == nil {
			p.Stop = []string{one}
		} else if err := json.Unmarshal(cr.Stop, &p.Stop); err != nil {
			return nil, r, badRequest("stop", "stop must be a string or an array of strings")
		}
		if len(p.Stop) > 4 {
			return nil, r, badRequest("stop", "at most 4 stop sequences")
		}
	}
	mt := cr.MaxCompletionTokens
	if mt == nil {
		mt = cr.MaxTokens
	}
	if mt != nil {
		if *mt < 1 {
			return nil, r, badRequest("max_tokens", "max_tokens must be at least 1")
		}
		p.MaxTokens = *mt
	}
	r.N = 1
	if cr.N != nil {
		if *cr.N < 1 || *cr.N > e.cfg.NSeqMax {
			return nil, r, badRequest("n", "n must be between 1 and %d", e.cfg.NSeqMax)
		}
		r.N = *cr.N
	}
	if len(cr.Logprobs) > 0 && string(cr.Logprobs) != "null" {
		if chat {
			if err := json.Unmarshal(cr.Logprobs, &p.Logprobs); err != nil {
				return nil, r, badRequest("logprobs", "logprobs must be a boolean")
			}
			if cr.TopLogprobs != nil {
				p.TopLogprobs = *cr.TopLogprobs
			}
		} else {
			var k int
			if err := json.Unmarshal(cr.Logprobs, &k); err != nil {
				return nil, r, badRequest("logprobs", "logprobs must be an integer")
			}
			p.Logprobs, p.TopLogprobs = true, k
		}
		if p.TopLogprobs < 0 || p.TopLogprobs > 20 {
			return nil, r, badRequest("top_logprobs", "top_logprobs must be between 0 and 20")
		}
	} else if cr.TopLogprobs != nil && *cr.TopLogprobs > 0 {
		return nil, r, badRequest("top_logprobs", "top_logprobs requires logprobs to be true")
	}
	r.Params = p
	var text string
	if chat {
		if len(cr.Messages) == 0 {
			return nil, r, badRequest("messages", "messages must be a non-empty array")
		}
		msgs := make([]llama.ChatMessage, len(cr.Messages))
		for i, m := range cr.Messages {
			c, err := m.text()
			if err != nil {
				return nil, r, err
			}
			role := m.Role
			if role == "developer" {
				role = "system"
			}
			msgs[i] = llama.ChatMessage{Role: role, Content: c}
		}
		if err := e.constrain(&cr, &r, &msgs, body); err != nil {
			return nil, r, err
		}
		rp, closed, err := e.parseReasoning(body)
		if err != nil {
			return nil, r, err
		}
		toks, err := e.tokenizeChat(msgs)
		if err != nil {
			return nil, r, err
		}
		cr.chains = 1
		if switching {
			if r.Adapter, rp, cr.switched, err = e.switchReasoning(msgs, toks, r.Adapter, rp, rp != nil || closed); err != nil {
				return nil, r, err
			}
			if cr.chains, err = e.parseChains(body, r.Adapter, r.N, cr.Stream); err != nil {
				return nil, r, err
			}
		}
		r.Reasoning = rp
		if cr.chains > 1 && cr.plan != nil && cr.plan.tools {
			return nil, r, badRequest("n_chains", "n_chains > 1 cannot be combined with tools: the chains vote on a text answer")
		}
		return e.withPrompt(&cr, r, e.withReasoning(toks, rp, closed), nil)
	} else {
		if cr.Echo {
			return nil, r, unsupported("echo", "echo is not supported by this engine")
		}
		if cr.Suffix != nil && *cr.Suffix != "" {
			return nil, r, unsupported("suffix", "suffix (insertion) is not supported by this engine")
		}
		if cr.BestOf != nil && *cr.BestOf > 1 {
			return nil, r, unsupported("best_of", "best_of above 1 is not supported by this engine; use n for several completions")
		}
		if err := json.Unmarshal(cr.Prompt, &text); err != nil {
			var arr []string
			var ids []int64
			var idss [][]int64
			switch {
			case json.Unmarshal(cr.Prompt, &arr) == nil && len(arr) == 1:
				text = arr[0]
			case json.Unmarshal(cr.Prompt, &ids) == nil && len(ids) > 0:
				toks, err := e.promptIDs(ids)
				return e.withPrompt(&cr, r, toks, err)
			case json.Unmarshal(cr.Prompt, &idss) == nil && len(idss) == 1 && len(idss[0]) > 0:
				toks, err := e.promptIDs(idss[0])
				return e.withPrompt(&cr, r, toks, err)
			default:
				return nil, r, badRequest("prompt", "prompt must be a string, an array of token ids, or an array of one of them: this engine completes one prompt per request")
			}
		}
	}
	if err := e.checkBytes(len(text)); err != nil {
		return nil, r, err
	}
	toks, err := e.Tokenize(text)
	return e.withPrompt(&cr, r, toks, err)
}

// promptIDs is a prompt given as token ids (CreateCompletionRequest's
// prompt as an array of integers), each checked against the vocabulary:
// an id outside [0, n_vocab) is a 400 naming prompt.
func (e *Engine) promptIDs(ids []int64) ([]int32, error) {
	nv := int64(e.model.NVocab())
	toks := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id >= nv {
			return nil, badRequest("prompt", "prompt token ids must be integers in [0, %d), got %d", nv, id)
		}
		toks[i] = int32(id)
	}
	return toks, nil
}

// withPrompt sets the tokenized prompt on r and checks r against the engine.
func (e *Engine) withPrompt(cr *completionRequest, r Request, toks []int32, err error) (*completionRequest, Request, error) {
	if err != nil {
		return nil, r, err
	}
	r.Prompt = toks
	if err := e.check(r); err != nil {
		return nil, r, err
	}
	return cr, r, nil
}

func newID(prefix string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Wire types: OpenAI chat and completions responses.
type (
	wireTop struct {
		Token   string  `json:"token"`
		Logprob float64 `json:"logprob"`
		Bytes   []int   `json:"bytes"`
	}
	wireContentLogprob struct {
		Token       string    `json:"token"`
		Logprob     float64   `json:"logprob"`
		Bytes       []int     `json:"bytes"`
		TopLogprobs []wireTop `json:"top_logprobs"`
	}
	wireChatLogprobs struct {
		Content []wireContentLogprob `json:"content"`
	}
	wireLegacyLogprobs struct {
		Tokens        []string             `json:"tokens"`
		TokenLogprobs []float64            `json:"token_logprobs"`
		TopLogprobs   []map[string]float64 `json:"top_logprobs"`
		TextOffset    []int                `json:"text_offset"`
	}
)

func intBytes(b []byte) []int {
	out := make([]int, len(b))
	for i, x := range b {
		out[i] = int(x)
	}
	return out
}

func chatLogprobs(lps []TokenLogprob) []wireContentLogprob {
	out := make([]wireContentLogprob, 0, len(lps))
	for _, l := range lps {
		c := wireContentLogprob{Token: l.Token, Logprob: l.Logprob, Bytes: intBytes(l.Bytes), TopLogprobs: []wireTop{}}
		for _, t := range l.Top {
			c.TopLogprobs = append(c.TopLogprobs, wireTop{Token: t.Token, Logprob: t.Logprob, Bytes: intBytes(t.Bytes)})
		}
		out = append(out, c)
	}
	return out
}

func legacyLogprobs(dst *wireLegacyLogprobs, lps []TokenLogprob, offset *int) {
	for _, l := range lps {
		dst.Tokens = append(dst.Tokens, l.Token)
		dst.TokenLogprobs = append(dst.TokenLogprobs, l.Logprob)
		top := map[string]float64{}
		for _, t := range l.Top {
			top[t.Token] = t.Logprob
		}
		dst.TopLogprobs = append(dst.TopLogprobs, top)
		dst.TextOffset = append(dst.TextOffset, *offset)
		*offset += len(l.Bytes)
	}
}

func (e *Engine) serveCompletion(w http.ResponseWriter, r *http.Request, chat bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 32<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", "reading request body: "+err.Error())
		return
	}
	cr, req, err := e.parse(body, chat)
	if err != nil {
		ae := classify(err)
		if !chat && ae.param == "messages" && ae.code == "context_length_exceeded" {
			ae.param = "prompt"
		}
		writeError(w, ae.status, ae.typ, ae.param, ae.code, ae.msg)
		return
	}
	setReasoningHeader(w, cr.switched)
	id, created := newID("chatcmpl-"), time.Now().Unix()
	object := "chat.completion"
	if !chat {
		id, object = newID("cmpl-"), "text_completion"
	}
	if cr.chains > 1 {
		e.serveChains(w, r, cr, req, id, created)
		return
	}
	if chat && cr.plan != nil && cr.plan.tools {
		e.serveTools(w, r.Context(), cr, req, id, created)
		return
	}
	if cr.Stream {
		e.stream(w, r.Context(), cr, req, chat, id, object+map[bool]string{true: ".chunk", false: ""}[chat], created, e.Generate)
		return
	}
	e.respond(w, r.Context(), cr, req, chat, id, object, created, e.Generate)
}

// generateFunc runs a request as Engine.Generate does: the scheduler's path
// (Generate) or remote drafting (remotedraft.go).
type generateFunc func(ctx context.Context, r Request, onEvent func(Event) error) (Usage, error)

// respond runs req with gen and writes the whole (non-stream) answer.
func (e *Engine) respond(w http.ResponseWriter, ctx context.Context, cr *completionRequest, req Request, chat bool, id, object string, created int64, gen generateFunc) {
	texts := make([]strings.Builder, req.N)
	reasoning := make([]strings.Builder, req.N)
	finish := make([]string, req.N)
	stops := make([]string, req.N) // the stop string that ended each choice
	clp := make([][]wireContentLogprob, req.N)
	llp := make([]wireLegacyLogprobs, req.N)
	offs := make([]int, req.N)
	var fingerprint any // the adapter version that answered
	usage, err := gen(ctx, req, func(ev Event) error {
		if ev.Version != "" {
			fingerprint = ev.Version
		}
		texts[ev.Index].WriteString(ev.Text)
		reasoning[ev.Index].WriteString(ev.Reasoning)
		if ev.Finish != "" {
			finish[ev.Index] = ev.Finish
			stops[ev.Index] = ev.Stop
		}
		if req.Params.Logprobs {
			if chat {
				clp[ev.Index] = append(clp[ev.Index], chatLogprobs(ev.Logprobs)...)
			} else {
				legacyLogprobs(&llp[ev.Index], ev.Logprobs, &offs[ev.Index])
			}
		}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return // client gone
		}
		ae := classify(err)
		writeError(w, ae.status, ae.typ, ae.param, ae.code, ae.msg)
		return
	}
	choices := make([]map[string]any, req.N)
	for i := range choices {
		c := map[string]any{"index": i, "finish_reason": finish[i], "logprobs": nil}
		if stops[i] != "" {
			c["stop_reason"] = stops[i] // as vLLM names the stop string that matched
		}
		if chat {
			msg := map[string]any{"role": "assistant", "content": texts[i].String(), "refusal": nil}
			if req.Reasoning != nil {
				msg["reasoning_content"] = reasoning[i].String()
			}
			c["message"] = msg
			if req.Params.Logprobs {
				c["logprobs"] = wireChatLogprobs{Content: clp[i]}
			}
		} else {
			c["text"] = texts[i].String()
			if req.Params.Logprobs {
				c["logprobs"] = llp[i]
			}
		}
		choices[i] = c
	}
	resp := map[string]any{
		"id": id, "object": object, "created": created, "model": cr.Model,
		"choices": choices, "usage": usage, "system_fingerprint": fingerprint,
	}
	if fingerprint == nil {
		delete(resp, "system_fingerprint") // a string or no field (the spec)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// stream runs req with gen and writes server-sent events: for chat, a first
// chunk per choice with the assistant role, content deltas, a chunk with
// finish_reason; when stream_options.include_usage, a last chunk with empty
// choices and the usage (other chunks carry "usage": null); then
// "data: [DONE]".
func (e *Engine) stream(w http.ResponseWriter, ctx context.Context, cr *completionRequest, req Request, chat bool, id, object string, created int64, gen generateFunc) {
	includeUsage := cr.StreamOptions != nil && cr.StreamOptions.IncludeUsage
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		_ = rc.Flush()
		return nil
	}
	var fingerprint any // the adapter version, known from the first event
	chunk := func(choice map[string]any) map[string]any {
		m := map[string]any{"id": id, "object": object, "created": created, "model": cr.Model, "choices": []any{choice}, "system_fingerprint": fingerprint}
		if fingerprint == nil {
			delete(m, "system_fingerprint")
		}
		if includeUsage {
			m["usage"] = nil
		}
		return m
	}
	if chat {
		for i := range req.N {
			if err := send(chunk(map[string]any{"index": i, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil})); err != nil {
				return
			}
		}
	}
	offs := make([]int, req.N)
	usage, err := gen(ctx, req, func(ev Event) error {
		if ev.Version != "" {
			fingerprint = ev.Version
		}
		var fin any
		if ev.Finish != "" {
			fin = ev.Finish
		}
		c := map[string]any{"index": ev.Index, "logprobs": nil, "finish_reason": fin}
		if ev.Stop != "" {
			c["stop_reason"] = ev.Stop
		}
		if chat {
			d := map[string]any{}
			if ev.Reasoning != "" {
				d["reasoning_content"] = ev.Reasoning
			}
			if ev.Text != "" || (ev.Finish == "" && ev.Reasoning == "") {
				d["content"] = ev.Text
			}
			c["delta"] = d
			if req.Params.Logprobs {
				c["logprobs"] = wireChatLogprobs{Content: chatLogprobs(ev.Logprobs)}
			}
		} else {
			c["text"] = ev.Text
			if req.Params.Logprobs {
				var l wireLegacyLogprobs
				legacyLogprobs(&l, ev.Logprobs, &offs[ev.Index])
				c["logprobs"] = l
			}
		}
		return send(chunk(c))
	})
	if err != nil {
		if ctx.Err() == nil {
			ae := classify(err)
			_ = send(errorBody(ae.typ, ae.param, ae.code, ae.msg))
		}
		return
	}
	if includeUsage {
		m := map[string]any{"id": id, "object": object, "created": created, "model": cr.Model, "choices": []any{}, "usage": usage, "system_fingerprint": fingerprint}
		if fingerprint == nil {
			delete(m, "system_fingerprint")
		}
		_ = send(m)
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}

var _ http.Handler = (*Engine)(nil)

// maxBytesPerToken bounds how many bytes one token covers, so a prompt
// longer than maxBytesPerToken × the context is refused before the
// tokenizer (whose cost grows faster than linearly) ever sees it.
const maxBytesPerToken = 32

func (e *Engine) checkBytes(n int) error {
	if n > maxBytesPerToken*e.nCtxSeq {
		return fmt.Errorf("%w: %d bytes cannot fit the %d tokens a sequence holds", ErrContextLength, n, e.nCtxSeq)
	}
	return nil
}

// tokenizeChat applies the chat template and tokenizes the result
// (llama.Model.TokenizeChat: only the template's own text may produce
// control tokens), within the engine's byte limit.
func (e *Engine) tokenizeChat(msgs []llama.ChatMessage) ([]int32, error) {
	total := 0
	for _, m := range msgs {
		total += len(m.Content)
	}
	if err := e.checkBytes(total); err != nil {
		return nil, err
	}
	toks, err := e.model.TokenizeChat(e.tmpl, msgs)
	if errors.Is(err, llama.ErrChatTemplate) || errors.Is(err, llama.ErrTemplateRewrites) {
		return nil, &apiError{http.StatusInternalServerError, "server_error", "", "", err.Error()}
	}
	return toks, err
}
