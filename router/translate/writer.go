package translate

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/relay"
)

// HeaderDecisionID is the response header the pipeline names its decision in.
const HeaderDecisionID = "X-Molly-Decision-Id"

// HeaderAnthropicRequestID is Anthropic's name for the request's id on a
// response; a Messages API answer carries it beside X-Request-Id.
const HeaderAnthropicRequestID = "Request-Id"

// Writer is the http.ResponseWriter the pipeline writes to for a
// translated request: what it writes in chat completions' terms reaches
// the client in the client's API. A whole answer is held until Finish and
// translated there (a chat completion becomes a Response or a Message; an
// OpenAI error becomes Anthropic's error body for the Messages API — with
// Anthropic's status, 529 overloaded_error for a 503 — and
// stays as it is for the Responses API, whose errors are OpenAI's); a 2xx
// event stream is translated event by event as it is written, through a
// relay.Parser. Headers set by the pipeline are kept (Content-Length is
// recomputed).
type Writer struct {
	w   http.ResponseWriter
	ctx context.Context
	api API
	t   *Translation // nil until Bind: errors only

	status    int
	streaming bool
	buf       bytes.Buffer
	p         relay.Parser
	rs        *responsesStream
	ms        *messagesStream
	out       []byte
	finished  bool
	err       error      // storing the response failed
	query     url.Values // APIAnthropicModels: the request's paging
}

// NewWriter wraps w for a request in api; ctx is the request's (storing a
// response outlives its cancellation).
func NewWriter(w http.ResponseWriter, ctx context.Context, api API) *Writer {
	return &Writer{w: w, ctx: ctx, api: api}
}

// Bind attaches the request's translation, once it is made.
func (w *Writer) Bind(t *Translation) { w.t = t }

// Header is the response's header map.
func (w *Writer) Header() http.Header { return w.w.Header() }

// WriteHeader records the status; it is sent with the translated body.
func (w *Writer) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

// Write takes part of the chat answer.
func (w *Writer) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if !w.streaming && w.buf.Len() == 0 && w.t != nil && w.t.Stream && w.status == http.StatusOK &&
		strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
		w.startStream()
	}
	if !w.streaming {
		return w.buf.Write(b)
	}
	w.out = w.out[:0]
	if err := w.p.Write(b, func(ev relay.Event) error {
		if w.rs != nil {
			w.out = w.rs.event(w.out, ev)
		} else {
			w.out = w.ms.event(w.out, ev)
		}
		return nil
	}); err != nil {
		return 0, err
	}
	if len(w.out) > 0 {
		if _, err := w.w.Write(w.out); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

func (w *Writer) startStream() {
	w.streaming = true
	h := w.Header()
	h.Del("Content-Length")
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.anthropicRequestID()
	if w.api == APIResponses {
		w.rs = newResponsesStream(w.t, w.ctx, h.Get(HeaderDecisionID))
	} else {
		w.ms = newMessagesStream(w.t)
	}
	w.w.WriteHeader(http.StatusOK)
}

// anthropicRequestID gives a Messages API answer Anthropic's request-id
// header, the request's id (openai.HeaderRequestID, which Molly sets on
// every response): Anthropic's SDKs read a message's _request_id and an
// error's requestID from it.
func (w *Writer) anthropicRequestID() {
	h := w.Header()
	if id := h.Get(openai.HeaderRequestID); (w.api == APIMessages || w.api == APIAnthropicModels) && id != "" && h.Get(HeaderAnthropicRequestID) == "" {
		h.Set(HeaderAnthropicRequestID, id)
	}
}

// Flush sends what was written of a stream.
func (w *Writer) Flush() {
	if w.streaming {
		_ = http.NewResponseController(w.w).Flush()
	}
}

// Unwrap gives http.ResponseController the wrapped writer.
func (w *Writer) Unwrap() http.ResponseWriter { return w.w }

// Err reports a failure to store the response (the answer was sent).
func (w *Writer) Err() error {
	if w.rs != nil && w.rs.saveErr != nil {
		return w.rs.saveErr
	}
	return w.err
}

// Finish writes the translated whole answer, or ends a stream that ended
// without its terminator. Nothing is written when nothing was (the
// handler chain returned an error for Caddy to render). Call it once, after
// the pipeline returned.
func (w *Writer) Finish() {
	if w.finished {
		return
	}
	w.finished = true
	if w.streaming {
		// A stream that stopped without [DONE] already carries its error
		// event; one that simply stopped (the client went away) gets nothing.
		w.Flush()
		return
	}
	if w.status == 0 {
		return
	}
	body := w.buf.Bytes()
	status := w.status
	chatAnswer := status/100 == 2 && w.t != nil && gjson.GetBytes(body, "choices").IsArray()
	switch {
	case chatAnswer && w.api == APIResponses:
		resp, assistant := w.t.responseFromChat(body)
		w.err = w.t.save(w.ctx, resp, assistant, w.Header().Get(HeaderDecisionID))
		body = resp
	case w.api == APIAnthropicModels && status/100 == 2:
		status, body = anthropicModels(body, w.query, w.Header().Get(openai.HeaderRequestID))
	case chatAnswer:
		body = w.t.messageFromChat(body)
	case status >= 400 && (w.api == APIMessages || w.api == APIAnthropicModels):
		body = messageError(status, body, w.t != nil, w.Header().Get(openai.HeaderRequestID))
		status = messagesStatus(status)
	case status >= 400 && w.api == APIResponses:
		body = responsesParam(body)
	}
	h := w.Header()
	w.anthropicRequestID()
	if len(body) > 0 {
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.w.WriteHeader(status)
	_, _ = w.w.Write(body)
}

// responsesParams maps the chat request's parameters back to the
// Responses request's, for error.param (longest prefix first).
var responsesParams = []struct{ chat, responses string }{
	{"response_format.json_schema.schema", "text.format.schema"},
	{"response_format.json_schema", "text.format"},
	{"response_format", "text.format"},
	{"max_completion_tokens", "max_output_tokens"},
	{"max_tokens", "max_output_tokens"},
	{"reasoning_effort", "reasoning.effort"},
	{"messages", "input"}, // indices differ (instructions are a message): input alone
}

// responsesToolPaths map a chat tool's path to the Responses tool's, whose
// members are not under "function": tools[0].function.name is tools[0].name.
var responsesToolPaths = []struct {
	chat *regexp.Regexp
	to   string
}{
	{regexp.MustCompile(`^tools\[(\d+)\]\.function(\.|$)`), "tools[$1]$2"},
	{regexp.MustCompile(`^tool_choice\.function(\.|$)`), "tool_choice$1"},
	{regexp.MustCompile(`^tool_choice\.allowed_tools\.tools\[(\d+)\]\.function(\.|$)`), "tool_choice.tools[$1]$2"},
	{regexp.MustCompile(`^tool_choice\.allowed_tools(\.|$)`), "tool_choice$1"},
	{regexp.MustCompile(`^verbosity$`), "text.verbosity"},
}

// responsesParam rewrites an OpenAI error body's error.param from the chat
// request's names to the Responses request's (text.format for
// response_format, input for messages, tools[0].name for
// tools[0].function.name, ...), so the client is told about the
// parameter it sent; the message, where it quotes the chat name
// ('tools[0].function.name'), quotes the Responses one. Other bodies are
// returned as they are.
func responsesParam(body []byte) []byte {
	p := gjson.GetBytes(body, "error.param")
	if p.Type != gjson.String {
		return body
	}
	to := ""
	for _, m := range responsesToolPaths {
		if m.chat.MatchString(p.Str) {
			to = m.chat.ReplaceAllString(p.Str, m.to)
			break
		}
	}
	for _, m := range responsesParams {
		if to != "" {
			break
		}
		if rest, ok := strings.CutPrefix(p.Str, m.chat); ok && (rest == "" || rest[0] == '.' || rest[0] == '[') {
			if m.chat == "messages" {
				rest = ""
			}
			to = m.responses + rest
		}
	}
	if to == "" || to == p.Str {
		return body
	}
	out, err := sjson.SetBytes(body, "error.param", to)
	if err != nil {
		return body
	}
	if msg := gjson.GetBytes(out, "error.message"); strings.Contains(msg.Str, "'"+p.Str+"'") {
		if o, err := sjson.SetBytes(out, "error.message", strings.ReplaceAll(msg.Str, "'"+p.Str+"'", "'"+to+"'")); err == nil {
			out = o
		}
	}
	return out
}

var (
	_ http.ResponseWriter = (*Writer)(nil)
	_ http.Flusher        = (*Writer)(nil)
)
