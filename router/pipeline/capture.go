package pipeline

import (
	"net/http"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/identity"
)

// HeaderTrace is the request header by which a client consents to trace
// capture for one request ("on") or refuses it ("off"), overriding its
// key's and member's standing consent.
const HeaderTrace = "X-Molly-Trace"

// Capture decides whether a client request's text may be kept for the
// specialisation loop (learning/traces). Only then does the pipeline put
// the text in the request's Outcome (Outcome.Text); every other request's
// Outcome carries none.
type Capture interface {
	// Consents reports whether r, from caller id (nil: anonymous), may be
	// traced: its X-Molly-Trace header when set, else the standing consent
	// of its key, else of its member; default off. It must not block.
	Consents(r *http.Request, id *identity.Identity) bool
}

// TraceText is the text of a consented request's answered attempt: the
// body exactly as that attempt's tier was sent it (redacted for the tier
// by egress) and the answer's text as that tier wrote it (placeholders not
// restored). It redacts itself in logs: String, GoString and MarshalJSON
// print a placeholder, so a careless log field or a JSON dump of an
// Outcome cannot leak it; read the fields.
type TraceText struct {
	Request []byte
	Answer  []byte
}

const traceTextPlaceholder = "[trace text withheld]"

func (*TraceText) String() string               { return traceTextPlaceholder }
func (*TraceText) GoString() string             { return traceTextPlaceholder }
func (*TraceText) MarshalJSON() ([]byte, error) { return []byte(`"` + traceTextPlaceholder + `"`), nil }
func (*TraceText) MarshalText() ([]byte, error) { return []byte(traceTextPlaceholder), nil }
func (t *TraceText) appendAnswer(text string)   { t.Answer = append(t.Answer, text...) }
func (t *TraceText) setAnswer(body []byte)      { t.Answer = []byte(answerText(gjson.ParseBytes(body))) }
func (t *TraceText) appendChunk(data []byte)    { t.appendAnswer(chunkText(gjson.ParseBytes(data))) }

// consents asks p.Capture about rq (a client request).
func (p *Pipeline) consents(rq *request) bool {
	return p.Capture != nil && rq.r != nil && p.Capture.Consents(rq.r, rq.id)
}

// answerText is the first choice's text of a whole answer (chat or completions).
func answerText(body gjson.Result) string {
	ch := body.Get("choices.0")
	if c := ch.Get("message.content"); c.Exists() {
		return c.String()
	}
	return ch.Get("text").String()
}

// chunkText is the first choice's text of one stream chunk.
func chunkText(chunk gjson.Result) string {
	var out string
	chunk.Get("choices").ForEach(func(_, ch gjson.Result) bool {
		if ch.Get("index").Int() != 0 {
			return true
		}
		if c := ch.Get("delta.content"); c.Exists() {
			out += c.String()
		} else {
			out += ch.Get("text").String()
		}
		return true
	})
	return out
}

// captured starts the trace text of o's answer when rq is consented: the
// dispatch body of o, the answer to follow.
func (rq *request) captured(o *outcome) *TraceText {
	if !rq.capture || o.disp == nil {
		return nil
	}
	t := &TraceText{Request: o.disp.Body()}
	rq.outcome.Text = t
	return t
}
